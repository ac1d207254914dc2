#!/usr/bin/env bash
# Flow-control propagation benchmark: time from POST .../pause to every parked long-poll and an SSE
# subscriber having the change. Starts its own sluice (a release build) on a free port with a
# throw-away data directory, runs bench/control_propagation.c against it, stops it.
#
#   bench/control_propagation.sh [BUILD_DIR=build] [POLLS=1000] [ROUNDS=20]
#
# With SOAK=1 the same is measured while bench/soak.py's load runs against that sluice (200
# TaskManagers pushing, remote write, dashboard range queries, its own 1,000 long-polls and a
# control change every 5 s): the soak starts the daemon, its load runs SOAK_WARMUP seconds
# (default 60) before the measurement starts, and is stopped afterwards. SOAK_TOOLS: where flink_gen
# is (default BUILD_DIR/tests/tools).
#
# Without SOAK, bench/fanout_floor.c runs first with the same polls and rounds (FLOOR=0 skips it):
# the same client and sluice's own fan-out code answering from a bare thread, without HTTP, the
# commit or anything else of sluice. On a 2-core machine the client shares the CPUs with the
# sending, so its reads are late by the same amount for both; what sluice shows beyond the floor
# in the same minutes is sluice's own.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
polls=${2:-1000}
rounds=${3:-20}
bin=$build/sluice
[ -x "$bin" ] || { echo "control_propagation: no $bin (make build-release first)" >&2; exit 1; }
work=$(mktemp -d)
pid=""
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
cc -O2 -o "$work/control_propagation" "$here/control_propagation.c"
if [ "${SOAK:-0}" = 1 ]; then
    /usr/bin/python3 "$here/soak.py" --sluice "$bin" --tools "${SOAK_TOOLS:-$build/tests/tools}" --duration 60m --warmup 1m \
        --out "$work" >"$work/soak.log" 2>&1 &
    soak=$!
    pid=""
    # soak.py stops its sluice only when it finishes by itself: stop both
    trap 'kill "$soak" $pid 2>/dev/null || true; wait "$soak" 2>/dev/null || true
          for _ in $(seq 600); do [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
          rm -rf "$work"' EXIT
    for _ in $(seq 600); do
        pid=$(pgrep -P "$soak" -x sluice || true)
        [ -n "$pid" ] && break
        sleep 0.1
    done
    [ -n "$pid" ] || { echo "control_propagation: the soak did not start sluice" >&2; cat "$work/soak.log" >&2; exit 1; }
    port=$(tr '\0' '\n' <"/proc/$pid/cmdline" | sed -n 's/^--web.listen-address=.*:\([0-9]*\)$/\1/p')
    sleep "${SOAK_WARMUP:-60}"
    kill -0 "$pid" 2>/dev/null || { echo "control_propagation: the soak stopped" >&2; tail -20 "$work/soak.log" >&2; exit 1; }
    echo "under soak load (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    "$work/control_propagation" 127.0.0.1 "$port" "$polls" "$rounds"
    exit
fi
if [ "${FLOOR:-1}" = 1 ]; then
    cc -O2 -I"$here/.." -I"$build/gen" -o "$work/fanout_floor" "$here/fanout_floor.c" "$build/libsluice_core.a" \
        -luring -lpthread
    "$work/fanout_floor" "$polls" "$rounds"
fi
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" --web.listen-address=127.0.0.1:$port --storage.path="$work/data" --log.level=warn >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 200); do curl -fs "http://127.0.0.1:$port/-/ready" >/dev/null 2>&1 && break; sleep 0.05; done
"$work/control_propagation" 127.0.0.1 "$port" "$polls" "$rounds" "$pid"
