#!/usr/bin/python3
"""Remote read (STREAMED_XOR_CHUNKS), side by side: sluice vs Debian's prometheus 2.42 as the
remote storage Prometheus or another reader would query, the same data in both.

Per server (fresh, empty data directory): --series integer counters (growing by 900..1099 per
10 s, Flink's shape) x --samples samples 10 s apart, ending now, written by remote write in time
order (Prometheus' head refuses anything older than its newest sample - 1h) and given a settle
second; then one streamed remote read of all of them over the whole window, --reads times, timed
from sending the request to having the whole answer (tests/integration/promproto.py, the client
the integration tests use). The servers alternate within a repetition; --reps repetitions, each
figure is the median of all reads of all repetitions.

sluice keeps chunks of integers (open and closed) in its own encoding and re-encodes them as XOR here
(sluice_remote_read_chunks_reencoded_total); Prometheus ships its head chunks as they are.

Usage: bench/remote_read_bench.py [--sluice BUILD/sluice] [--baseline OTHER/sluice] [--series 1000]
       [--samples 700] [--reads 15] [--reps 3] [--targets sluice,prometheus]
(--baseline adds the target "baseline": another sluice binary, e.g. the previous commit's.)
"""
import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import promproto as pp  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(target, a, d):
    port = free_port()
    if target == "prometheus":
        with open(os.path.join(d, "p.yml"), "w") as f:
            f.write("global: {}\n")
        args = ["prometheus", "--config.file=%s/p.yml" % d, "--storage.tsdb.path=%s/tsdb" % d,
                "--web.listen-address=127.0.0.1:%d" % port, "--web.enable-remote-write-receiver"]
    else:
        binary = a.baseline if target == "baseline" else a.sluice
        args = [binary, "--web.listen-address=127.0.0.1:%d" % port, "--storage.path=%s" % d]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = "http://127.0.0.1:%d" % port
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/-/ready", timeout=1)
            return p, url
        except Exception:
            time.sleep(0.1)
    p.kill()
    raise RuntimeError(target + " did not become ready")


def run_one(target, a, series, t0, t1):
    d = tempfile.mkdtemp(prefix="rrbench-")
    p, url = start(target, a, d)
    try:
        for k in range(0, a.samples, 20):
            for j in range(0, len(series), 250):
                st, _, body = pp.remote_write(url, [(lb, pts[k:k + 20]) for lb, pts in series[j:j + 250]])
                assert st in (200, 204), (target, st, body)
        time.sleep(1)
        q = [(t0, t1, [(pp.EQ, "__name__", "rrbench_records_total")], None)]
        times, size = [], 0
        for _ in range(a.reads):
            start_t = time.perf_counter()
            st, _, body = pp.remote_read(url, q, (pp.STREAMED_XOR_CHUNKS,))
            times.append((time.perf_counter() - start_t) * 1000)
            assert st == 200, (target, st)
            size = len(body)
        frames = list(pp.parse_frames(body))
        assert len({f[1] for f in frames}) == len(series), (target, "series missing")
        return times, size
    finally:
        p.terminate()
        p.wait()
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default=os.path.join(ROOT, "build", "sluice"))
    ap.add_argument("--baseline", default=None)
    ap.add_argument("--series", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=700)
    ap.add_argument("--reads", type=int, default=15)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--targets", default="sluice,prometheus")
    a = ap.parse_args()
    now = int(time.time()) * 1000
    t0 = now - a.samples * 10000
    series = []
    for i in range(a.series):
        c, pts = 1000 * i, []
        for k in range(a.samples):
            c += 900 + (k * 7919 + i) % 200
            pts.append((t0 + k * 10000, float(c)))
        series.append(([("__name__", "rrbench_records_total"), ("job", "flink"), ("subtask", "%05d" % i)], pts))
    targets = a.targets.split(",") + (["baseline"] if a.baseline else [])
    res = {t: [] for t in targets}
    sizes = {}
    print("remote read: %d series x %d samples, %d reads x %d reps, load %s" %
          (a.series, a.samples, a.reads, a.reps, open("/proc/loadavg").read().split()[:3]))
    for r in range(a.reps):
        for t in targets:
            times, size = run_one(t, a, series, t0, now)
            res[t].extend(times)
            sizes[t] = size
            print("  rep %d %-10s median %.1f ms (min %.1f), answer %d bytes" %
                  (r + 1, t, statistics.median(times), min(times), size))
    print("\n| server | median ms | min ms | answer bytes | x Prometheus |\n|---|---:|---:|---:|---:|")
    pm = statistics.median(res["prometheus"]) if "prometheus" in res else None
    for t in targets:
        m = statistics.median(res[t])
        print("| %s | %.1f | %.1f | %d | %s |" % (t, m, min(res[t]), sizes[t], "%.2f" % (m / pm) if pm else "-"))


if __name__ == "__main__":
    main()
