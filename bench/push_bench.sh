#!/usr/bin/env bash
# Flink push-ingest benchmark (issue 3): the same Flink-shaped load against sluice, the Debian
# prometheus-pushgateway (with and without --push.disable-consistency-check) and the Debian
# victoria-metrics (/api/v1/import/prometheus?extra_label=job=<group>), in one run on one machine.
# Every server starts fresh (empty data dir, own port) for each repetition; bench/push_bench.c is
# the load generator (one epoll thread, CONNS keep-alive connections). Prints one line per run and
# a table of medians (the run with the median samples/s of REPS) with ratios vs VictoriaMetrics.
#
#   bench/push_bench.sh [BUILD_DIR=build]      (BUILD_DIR must be a Release build, not ASan)
#
# Environment (defaults): TMS=200 TaskManagers (~1,282 series, ~590 KiB each), ROUNDS=3 pushes
# per TM (tick 1..ROUNDS, counters grow), CONNS=8, REPS=3, MAX_SECONDS=120 (cap per run),
# PG_CHECK_SECONDS=30 (cap for the Pushgateway with its consistency check, which is very slow),
# TARGETS="sluice vm pushgateway-nocheck pushgateway" (any subset), SEED=1, INTERVAL= (seconds:
# the fixed-rate run — every TaskManager pushes once per INTERVAL at its own phase, latency from
# when the push was due, CPU-seconds of the server per 1M samples; e.g. INTERVAL=10 ROUNDS=6 is
# the real cadence for 60 s; its table adds the disk MiB/min each server wrote, over the whole run
# or, with DISK_FROM_ROUND=K, from round K on: INTERVAL=10 ROUNDS=20 DISK_FROM_ROUND=9
# MAX_SECONDS=240 is two minutes of the steady state, new series and first minute left out), LATENCY_DIR= (a directory: each run's
# per-push latencies are written there as <target>.<rep>.lat, see push_bench.c --latency-log).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build=$(cd "${1:-$repo/build}" && pwd)
TMS=${TMS:-200}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-8}
REPS=${REPS:-3}
SEED=${SEED:-1}
MAX_SECONDS=${MAX_SECONDS:-120}
PG_CHECK_SECONDS=${PG_CHECK_SECONDS:-30}
TARGETS=${TARGETS:-"sluice vm pushgateway-nocheck pushgateway"}
INTERVAL=${INTERVAL:-0}
LATENCY_DIR=${LATENCY_DIR:-}
DISK_FROM_ROUND=${DISK_FROM_ROUND:-0}

bin=$build/sluice
[ -x "$bin" ] || { echo "push_bench: no $bin (make build-release first)" >&2; exit 1; }
btype=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
san=$(sed -n 's/^SLUICE_SANITIZE:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
if [ "$btype" != "Release" ] || [ "$san" = "ON" ]; then
    echo "push_bench: $build is a '$btype' build (sanitize=$san); benchmark a Release build" >&2
    exit 1
fi
for t in prometheus-pushgateway victoria-metrics; do
    command -v $t >/dev/null || { echo "push_bench: $t is not installed" >&2; exit 1; }
done

work=$(mktemp -d /tmp/push_bench.XXXXXX)
pid=
stop_server() {
    if [ -n "$pid" ]; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        pid=
    fi
}
trap 'stop_server; rm -rf "$work"' EXIT

# buf.c formats floats through internal/util/floatfmt.cc (double-conversion, C++)
c++ -O2 -I"$repo" -c -o "$work/floatfmt.o" "$repo/internal/util/floatfmt.cc"
cc -O2 -I"$repo" -o "$work/push_bench" "$here/push_bench.c" "$repo/internal/expfmt/flinkgen.c" \
    "$repo/internal/util/buf.c" "$work/floatfmt.o" -ldouble-conversion -lstdc++ -lm
"$work/push_bench" --write-bodies "$work/bodies.bin" --tms "$TMS" --rounds "$ROUNDS" --seed "$SEED"

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_server TARGET DIR PORT: starts it in the background (sets $pid), waits until ready.
start_server() {
    local target=$1 dir=$2 port=$3 ready
    case $target in
    sluice)
        "$bin" --web.listen-address=127.0.0.1:$port --storage.path="$dir/data" --log.level=warn \
            >"$dir/log" 2>&1 &
        ready=/-/ready ;;
    pushgateway)
        prometheus-pushgateway --web.listen-address=127.0.0.1:$port --persistence.file="$dir/pg.data" \
            --log.level=warn >"$dir/log" 2>&1 &
        ready=/-/ready ;;
    pushgateway-nocheck)
        prometheus-pushgateway --web.listen-address=127.0.0.1:$port --persistence.file="$dir/pg.data" \
            --push.disable-consistency-check --log.level=warn >"$dir/log" 2>&1 &
        ready=/-/ready ;;
    vm)
        victoria-metrics -storageDataPath "$dir/vm" -httpListenAddr 127.0.0.1:$port -loggerLevel=ERROR \
            >"$dir/log" 2>&1 &
        ready=/health ;;
    esac
    pid=$!
    for _ in $(seq 300); do
        curl -fs "http://127.0.0.1:$port$ready" >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "push_bench: $target did not become ready; its log:" >&2
    cat "$dir/log" >&2
    exit 1
}

echo "push_bench: $TMS TaskManagers x $ROUNDS rounds, $CONNS connections, $REPS runs each, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
results=$work/results
: >"$results"
for rep in $(seq "$REPS"); do
    for target in $TARGETS; do
        dir=$work/$target.$rep
        mkdir -p "$dir"
        port=$(free_port)
        start_server "$target" "$dir" "$port"
        kind=$target
        cap=$MAX_SECONDS timeout=60
        case $target in
        pushgateway*) kind=pushgateway ;;
        esac
        [ "$target" = pushgateway ] && cap=$PG_CHECK_SECONDS timeout=$PG_CHECK_SECONDS
        latlog=()
        [ -n "$LATENCY_DIR" ] && latlog=(--latency-log "$LATENCY_DIR/$target.$rep.lat")
        "$work/push_bench" --target "$kind" --name "$target" --port "$port" --tms "$TMS" --rounds "$ROUNDS" \
            --conns "$CONNS" --seed "$SEED" --bodies "$work/bodies.bin" --max-seconds "$cap" \
            --timeout "$timeout" --pid "$pid" --interval "$INTERVAL" --disk-from-round "$DISK_FROM_ROUND" "${latlog[@]}" 2>"$dir/bench.err" | tee -a "$results" |
            grep -v '^RESULT'
        if [ "$target" = sluice ]; then
            # which HTTP worker took the pool's connections (one worker holding all of them serves
            # every push on one core); the count includes this scrape's own connection
            echo "  sluice connections by HTTP worker: $(curl -fs "http://127.0.0.1:$port/metrics" |
                sed -n 's/^sluice_http_worker_connections_accepted_total{worker="\([0-9]*\)"} /\1=/p' | tr '\n' ' ')"
        fi
        stop_server
        rm -rf "$dir"
    done
done

/usr/bin/python3 - "$results" "$TMS" "$ROUNDS" "$INTERVAL" <<'EOF'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    if not line.startswith("RESULT "):
        continue
    kv = dict(f.split("=", 1) for f in line.split()[1:])
    rows.setdefault(kv["name"], []).append(kv)
def med(runs):
    s = sorted(runs, key=lambda r: float(r["samples_s"]))
    return s[(len(s) - 1) // 2]
order = ["sluice", "vm", "pushgateway-nocheck", "pushgateway"]
label = {"sluice": "sluice", "vm": "VictoriaMetrics 1.79", "pushgateway-nocheck":
         "Pushgateway 1.5.1 (no check)", "pushgateway": "Pushgateway 1.5.1"}
m = {n: med(r) for n, r in rows.items()}
vm = m.get("vm")
print()
print(f"push ingest, {sys.argv[2]} TaskManagers x {sys.argv[3]} rounds (median of {max(len(r) for r in rows.values())} runs by samples/s)")
print("samples/s: all rounds; steady/s: rounds 2..N (series exist); round 1 s: time to create every group;")
print("p50/p99: every push; st p99: rounds 2..N only; r1 p99: round 1 only")
hdr = f"{'server':<30} {'pushes/s':>9} {'samples/s':>10} {'steady/s':>9} {'round 1 s':>9} {'p50 ms':>8} {'p99 ms':>8} {'st p99':>7} {'r1 p99':>7} {'RSS MiB':>8} {'series':>8} {'ok/planned':>11} {'x VM samples/s':>15} {'x VM RSS':>9}"
print(hdr)
print("-" * len(hdr))
for n in order:
    if n not in m:
        continue
    r = m[n]
    sps, rss = float(r["samples_s"]), int(r["rss_kb"]) / 1024
    rs = f"{sps / float(vm['samples_s']):.2f}" if vm and float(vm["samples_s"]) else "-"
    rr = f"{rss / (int(vm['rss_kb']) / 1024):.2f}" if vm and int(vm["rss_kb"]) > 0 else "-"
    okp = f"{r['ok']}/{r['planned']}"
    st = float(r.get("steady_samples_s", 0))
    r1 = float(r.get("first_round_s", -1))
    print(f"{label[n]:<30} {float(r['pushes_s']):>9.1f} {sps:>10.0f} {(f'{st:.0f}' if st else '-'):>9} "
          f"{(f'{r1:.1f}' if r1 >= 0 else '-'):>9} {float(r['p50_ms']):>8.1f} "
          f"{float(r['p99_ms']):>8.1f} {float(r.get('steady_p99_ms', 0)):>7.1f} {float(r.get('round1_p99_ms', 0)):>7.1f} "
          f"{rss:>8.1f} {int(r['series']):>8} {okp:>11} {rs:>15} {rr:>9}")
    spread = [float(x["samples_s"]) for x in rows[n]]
    if len(spread) > 1:
        print(f"{'':<30} samples/s over runs: " + ", ".join(f"{x:.0f}" for x in spread))
if float(sys.argv[4]) > 0:
    # fixed rate: every run pushes the same samples; the median run by steady p99
    print()
    print(f"fixed rate: each TaskManager every {sys.argv[4]} s; latency from when a push was due; steady = rounds 2..N")
    h2 = (f"{'server':<30} {'steady p50 ms':>14} {'steady p99 ms':>14} {'max ms':>8} {'CPU s':>7} {'CPU s / 1M samples':>19}"
          f" {'disk MiB/min':>13}")
    print(h2)
    print("-" * len(h2))
    for n in order:
        if n not in rows:
            continue
        runs = sorted(rows[n], key=lambda r: float(r["steady_p99_ms"]))
        r = runs[(len(runs) - 1) // 2]
        print(f"{label[n]:<30} {float(r['steady_p50_ms']):>14.1f} {float(r['steady_p99_ms']):>14.1f} "
              f"{float(r['max_ms']):>8.1f} {float(r['cpu_s']):>7.2f} {float(r['cpu_s_per_1m']):>19.3f}"
              f" {float(r.get('disk_mib_per_min', -1)):>13.1f}")
        if len(runs) > 1:
            print(f"{'':<30} steady p99 over runs: " + ", ".join(f"{float(x['steady_p99_ms']):.1f}" for x in rows[n]) +
                  "; CPU s / 1M: " + ", ".join(f"{float(x['cpu_s_per_1m']):.3f}" for x in rows[n]) +
                  "; disk MiB/min: " + ", ".join(f"{float(x.get('disk_mib_per_min', -1)):.0f}" for x in rows[n]))
if "sluice" in m and vm and float(sys.argv[4]) <= 0:  # the flat-out goals
    s = m["sluice"]
    print()
    if float(vm.get("steady_samples_s", 0)) > 0 and float(s.get("steady_samples_s", 0)) > 0:
        print("steady state (rounds 2..N): sluice %.0f samples/s = %.2fx VictoriaMetrics" % (
            float(s["steady_samples_s"]), float(s["steady_samples_s"]) / float(vm["steady_samples_s"])))
    print("goals: samples/s >= 1.5x VM: %s (%.2fx); p99 <= 50 ms: %s (%.1f ms); RSS <= 0.5x VM: %s (%.2fx)" % (
        "yes" if float(s["samples_s"]) >= 1.5 * float(vm["samples_s"]) else "NO",
        float(s["samples_s"]) / float(vm["samples_s"]),
        "yes" if float(s["p99_ms"]) <= 50 else "NO", float(s["p99_ms"]),
        "yes" if int(s["rss_kb"]) <= 0.5 * int(vm["rss_kb"]) else "NO", int(s["rss_kb"]) / int(vm["rss_kb"])))
EOF
