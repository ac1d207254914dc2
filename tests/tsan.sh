#!/usr/bin/env bash
# ThreadSanitizer run of the concurrency tests (`make tsan`).
#
#   tests/tsan.sh [BUILD_DIR] [JOBS]        default build-tsan, nproc
#
# Configures BUILD_DIR with -DSLUICE_TSAN=ON (Debug; ASan off: the two cannot be combined),
# builds the unit tests of every threaded subsystem and the daemon, and runs:
#   unit:        storage (concurrency, index creation races, wal group commit, rollup writer,
#                storage facade, snapshot), control store, push registry, rules (notifier/actions threads),
#                api/remote, api/flow, api/sse and api/server (server workers, a request answered
#                from another thread), internal/net/httpc and fanout
#   integration: test_faults_slow_clients (2 HTTP workers, streamed remote read, SSE fan-out,
#                control thread, remote write and PromQL queries at once), test_control and
#                test_push_concurrent_create (pushes on the push threads)
# TSan reports make the process exit 66 (TSAN_OPTIONS exitcode), so a race fails its test; the
# integration fixture requires exit 0 from the daemon at shutdown. Override the selection with
# TSAN_UNIT_REGEX / TSAN_INTEGRATION_REGEX (ctest -R regexes).
set -euo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${1:-build-tsan}"
JOBS="${2:-$(nproc 2>/dev/null || echo 2)}"
case "$BUILD" in /*) ;; *) BUILD="$SRC/$BUILD" ;; esac
UNIT="${TSAN_UNIT_REGEX:-^unit/(storage/test_(concurrency|index|wal|rollup|storage|snapshot)|internal/control/test_store|internal/push/test_registry|internal/rules/test_(rules|actions)|internal/net/test_(httpc|fanout)|api/test_(remote|flow|sse|server))\$}"
INTEG="${TSAN_INTEGRATION_REGEX:-^integration/(test_faults_slow_clients|test_control|test_push_concurrent_create)\$}"

cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug -DSLUICE_TSAN=ON -DSLUICE_SANITIZE=OFF \
  -DSLUICE_FUZZ_SECONDS=0 >/dev/null
# Only what the selected tests need (the whole tree under TSan takes long on two cores).
targets=(sluice sluicectl)
while read -r t; do targets+=("$t"); done < <(
  cd "$BUILD" && ctest -N -R "$UNIT" | sed -n 's/^ *Test *#[0-9]*: unit\/\(.*\)$/unit_\1/p' | tr '/' '_')
cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"

export SLUICE_SKIP_RSS_CHECKS=1  # see tests/integration/test_faults_slow_clients.py
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=0:exitcode=66:second_deadlock_stack=1:history_size=4}"
cd "$BUILD"
ctest --output-on-failure -R "$UNIT"
ctest --output-on-failure -R "$INTEG"
