#!/usr/bin/env bash
# bench/run.sh — runs every benchmark in bench/, one function per benchmark, in sequence.
# `make bench` calls this after `make build-release` (so build/ holds a release libsluice_core.a).
# Environment: BUILD (default build), BENCH_ARGS_STORAGE (extra storage_bench flags).
# Add a benchmark: write a bench_<name> function and call it at the bottom.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${BUILD:-build}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
OUT="$BUILD/bench"
mkdir -p "$OUT"

# Compiles bench/<name>.c against the release core library (bench/ is not part of CMake).
build_bench() {
    local name="$1"
    if [ ! -f "$BUILD/libsluice_core.a" ]; then
        echo "bench: $BUILD/libsluice_core.a missing; run 'make build-release' first" >&2
        return 1
    fi
    # shellcheck disable=SC2046
    cc -std=c11 -O2 -g -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -fno-strict-aliasing \
        -I"$ROOT" -I"$BUILD/gen" -o "$OUT/$name" "$ROOT/bench/$name.c" "$BUILD/libsluice_core.a" \
        $(pkg-config --libs libevent libevent_pthreads libprotobuf-c snappy sqlite3 re2 yaml-0.1 \
            libxxhash zlib jansson double-conversion liburing) -lstdc++ -lpthread -lm
}

bench_storage() {
    echo "== storage (bench/storage_bench.c) =="
    build_bench storage_bench
    # shellcheck disable=SC2086
    "$OUT/storage_bench" ${BENCH_ARGS_STORAGE:-}
}

# Float formatting alone (issue 19): double-conversion vs the printf + strtod search it replaced.
bench_floatfmt() {
    echo "== float formatting (bench/floatfmt_bench.c) =="
    build_bench floatfmt_bench
    "$OUT/floatfmt_bench"
}

# Flink push ingest vs Pushgateway and VictoriaMetrics (issue 3); TMS/ROUNDS/REPS/... as in the script.
bench_push() {
    echo "== push ingest (bench/push_bench.sh) =="
    "$ROOT/bench/push_bench.sh" "$BUILD"
}

bench_remote_write() {
    echo "== remote write ingest: sluice vs victoria-metrics vs prometheus (bench/remote_write_bench.py) =="
    /usr/bin/python3 "$ROOT/bench/remote_write_bench.py" --sluice "$BUILD/sluice" --out "$OUT" ${BENCH_ARGS_REMOTE_WRITE:-}
}

# PromQL query latency vs Prometheus 2.42 and VictoriaMetrics 1.79 (issue 5); QUERY_BENCH_ARGS for
# --series/--reps (defaults: 10k series, 15 reps).
bench_query() {
    echo "== query latency: sluice vs prometheus vs victoria-metrics (bench/query_bench.py) =="
    # shellcheck disable=SC2086
    /usr/bin/python3 "$ROOT/bench/query_bench.py" --sluice "$BUILD/sluice" ${QUERY_BENCH_ARGS:-}
}

# Soak (issue 10): 200 TaskManagers + remote write + dashboard queries + 1,000 parked long-polls
# for SOAK_DURATION (default 30m); fails on any error or RSS growth after warm-up. Not run by
# default (it takes half an hour): SOAK=1 make bench, or SOAK_ONLY=1 to run nothing else.
bench_soak() {
    echo "== soak (bench/soak.py, ${SOAK_DURATION:-30m}) =="
    # shellcheck disable=SC2086
    /usr/bin/python3 "$ROOT/bench/soak.py" --sluice "$BUILD/sluice" --tools "$BUILD/tests/tools" \
        --duration "${SOAK_DURATION:-30m}" --out "$OUT" ${SOAK_ARGS:-}
}

if [ "${SOAK_ONLY:-0}" != 1 ]; then
    bench_storage
    bench_floatfmt
    bench_remote_write
    bench_push
    bench_query
fi
if [ "${SOAK:-0}" = 1 ] || [ "${SOAK_ONLY:-0}" = 1 ]; then
    bench_soak
fi
