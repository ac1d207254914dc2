#!/usr/bin/env bash
# Flow-control propagation benchmark: time from POST .../pause to every parked long-poll and an SSE
# subscriber having the change. Starts its own sluice (a release build) on a free port with a
# throw-away data directory, runs bench/control_propagation.c against it, stops it.
#
#   bench/control_propagation.sh [BUILD_DIR=build] [POLLS=1000] [ROUNDS=20]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
polls=${2:-1000}
rounds=${3:-20}
bin=$build/sluice
[ -x "$bin" ] || { echo "control_propagation: no $bin (make build-release first)" >&2; exit 1; }
work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
cc -O2 -o "$work/control_propagation" "$here/control_propagation.c"
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" --web.listen-address=127.0.0.1:$port --storage.path="$work/data" --log.level=warn >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 200); do curl -fs "http://127.0.0.1:$port/-/ready" >/dev/null 2>&1 && break; sleep 0.05; done
"$work/control_propagation" 127.0.0.1 "$port" "$polls" "$rounds" "$pid"
