#!/usr/bin/python3
"""PromQL query latency, side by side: sluice vs Debian's prometheus 2.42 vs Debian's
victoria-metrics 1.79, the same data remote-written into each, the same queries over HTTP, in one
run.

Data (defaults): 10,000 counter series (100 jobs x 100 instances) and a classic histogram of
20 x 12 buckets, one hour of samples 15 s apart ending now, on whole seconds — written into each
system through /api/v1/write (prebuilt bodies, identical bytes for all three).

Queries: instant queries at `now` and range queries (1 h at a 15 s step; 30 days at a 1 h step) —
see QUERIES. Each (query, system) pair runs --warmup times unmeasured, then --reps times; the
systems take turns per repetition so background noise hits all three alike. Latency is the
client's wall time to the last byte of the (identity-encoded) response. VictoriaMetrics runs with
-search.disableCache (its result cache would otherwise answer repeats from memory) and
-search.latencyOffset=0s (so it sees the newest samples as the others do).

Honest limits: the "30-day" query only has the last hour of data in every system (remote write
cannot load a month into Prometheus' head or into sluice's raw tier), so it measures a 720-step
evaluation over mostly empty time, from raw samples in every system (sluice reads roll-ups only
for what raw retention no longer covers, or with the approximate rollups=step opt-in). The box has
2 cores shared with the load generator.

Usage: bench/query_bench.py [--sluice BUILD/sluice] [--series 10000] [--reps 15] [--warmup 2]
                            [--markdown FILE]
"""
import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import promproto  # noqa: E402  (hand-written protobuf + snappy helpers shared with the tests)

QUERIES = [
    # (name, kind, query); kind: instant | range1h | range30d
    ("rate, 10k series out", "instant", "rate(bench_requests_total[5m])"),
    ("sum by (job) of rate", "instant", "sum by (job) (rate(bench_requests_total[5m]))"),
    ("histogram_quantile", "instant", "histogram_quantile(0.99, sum by (le) (rate(bench_latency_seconds_bucket[5m])))"),
    ("topk", "instant", "topk(10, rate(bench_requests_total[5m]))"),
    ("sum(rate) over 10k series", "range1h", "sum(rate(bench_requests_total[5m]))"),
    ("sum by (job) of rate", "range1h", "sum by (job) (rate(bench_requests_total[5m]))"),
    ("histogram_quantile", "range1h", "histogram_quantile(0.99, sum by (le) (rate(bench_latency_seconds_bucket[5m])))"),
    ("topk", "range1h", "topk(10, rate(bench_requests_total[5m]))"),
    ("sum by (job), 30 d at 1 h", "range30d", "sum by (job) (rate(bench_requests_total[1h]))"),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=600):
    req = urllib.request.Request(url, headers={"Accept-Encoding": "identity"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


def wait_ready(url, proc, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("server exited with %d" % proc.returncode)
        try:
            if http_get(url, timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("not ready: " + url)


class Server:
    def __init__(self, kind, binary, d):
        self.kind = kind
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        data = os.path.join(d, kind)
        os.makedirs(data)
        if kind == "sluice":
            args = [binary, "--web.listen-address=127.0.0.1:%d" % self.port, "--storage.path=" + data,
                    "--log.level=warn"]
            ready = "/-/ready"
        elif kind == "prometheus":
            cfg = os.path.join(d, "prometheus.yml")
            with open(cfg, "w") as f:
                f.write("global:\n  scrape_interval: 15s\n")
            args = ["/usr/bin/prometheus", "--config.file=" + cfg, "--storage.tsdb.path=" + data,
                    "--web.listen-address=127.0.0.1:%d" % self.port, "--web.enable-remote-write-receiver",
                    "--log.level=warn"]
            ready = "/-/ready"
        else:
            args = ["/usr/bin/victoria-metrics", "-storageDataPath=" + data, "-httpListenAddr=127.0.0.1:%d" % self.port,
                    "-retentionPeriod=1y", "-search.disableCache", "-search.latencyOffset=0s", "-loggerLevel=ERROR"]
            ready = "/health"
        self.log = open(os.path.join(d, kind + ".log"), "wb")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        wait_ready(self.url + ready, self.proc)

    def write(self, bodies):
        for b in bodies:
            st, _, resp = promproto.post(self.url + "/api/v1/write", b, promproto.WRITE_HEADERS, timeout=600)
            if st // 100 != 2:
                raise RuntimeError("%s: remote write %d %s" % (self.kind, st, resp[:200]))
        if self.kind == "victoria-metrics":
            http_get(self.url + "/internal/force_flush")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def build_bodies(nseries, end):
    """Remote-write bodies: every series' whole hour in one request per batch of series."""
    start = end - 3600
    times = list(range(start, end + 1, 15))
    bodies, batch = [], []

    def flush():
        if batch:
            bodies.append(promproto.snappy.compress(promproto.write_request(batch)))
            batch.clear()

    jobs = max(1, nseries // 100)
    for j in range(jobs):
        for i in range(nseries // jobs):
            labels = [("__name__", "bench_requests_total"), ("instance", "i%03d" % i), ("job", "job%03d" % j)]
            k = 1 + (i * 7 + j) % 13
            batch.append((labels, [(t * 1000, float((t - start) // 15 * k)) for t in times]))
            if len(batch) >= 500:
                flush()
    bounds = ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"]
    for j in range(20):
        for bi, le in enumerate(bounds):
            labels = [("__name__", "bench_latency_seconds_bucket"), ("job", "job%03d" % j), ("le", le)]
            batch.append((labels, [(t * 1000, float((t - start) // 15 * (bi + 1) * (j + 1))) for t in times]))
    flush()
    return bodies, len(times)


def percentile(xs, p):
    xs = sorted(xs)
    k = (len(xs) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def query_url(base, kind, q, end):
    if kind == "instant":
        params = {"query": q, "time": str(end)}
        path = "/api/v1/query"
    elif kind == "range1h":
        params = {"query": q, "start": str(end - 3600), "end": str(end), "step": "15"}
        path = "/api/v1/query_range"
    else:
        params = {"query": q, "start": str(end - 30 * 86400), "end": str(end), "step": "3600"}
        path = "/api/v1/query_range"
    return base + path + "?" + urllib.parse.urlencode(params)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default=os.path.join(ROOT, "build", "sluice"))
    ap.add_argument("--series", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--markdown")
    a = ap.parse_args()

    end = int(time.time()) // 15 * 15 - 15
    t0 = time.time()
    bodies, npts = build_bodies(a.series, end)
    total = sum(len(b) for b in bodies)
    print("data: %d counter series + 240 histogram buckets, %d samples each (1 h at 15 s), %d requests, "
          "%.1f MB snappy; built in %.0f s" % (a.series, npts, len(bodies), total / 1e6, time.time() - t0))
    d = tempfile.mkdtemp(prefix="query-bench-")
    systems = []
    try:
        for kind, binary in (("sluice", a.sluice), ("prometheus", None), ("victoria-metrics", None)):
            s = Server(kind, binary, d)
            systems.append(s)
            t1 = time.time()
            s.write(bodies)
            print("%-16s ingested in %.1f s" % (kind, time.time() - t1))
        time.sleep(3)  # let every system make the last writes searchable

        results = {}  # (qi, kind) -> [seconds]
        sizes = {}
        for qi, (name, kind, q) in enumerate(QUERIES):
            for s in systems:
                for _ in range(a.warmup):
                    st, body = http_get(query_url(s.url, kind, q, end))
                    if st != 200:
                        raise RuntimeError("%s %s: %d %s" % (s.kind, q, st, body[:200]))
                    sizes[(qi, s.kind)] = len(body)
            for _ in range(a.reps):
                for s in systems:
                    u = query_url(s.url, kind, q, end)
                    t1 = time.perf_counter()
                    http_get(u)
                    results.setdefault((qi, s.kind), []).append(time.perf_counter() - t1)
            print("  %-10s %-28s done" % (kind, name))

        kinds = [s.kind for s in systems]
        lines = ["| query | kind | " + " | ".join("%s median / p99 (ms)" % k for k in kinds) +
                 " | sluice ÷ prometheus (median) | sluice ÷ victoria-metrics (median) |",
                 "|---|---|" + "---|" * len(kinds) + "---|---|"]
        for qi, (name, kind, q) in enumerate(QUERIES):
            med = {k: statistics.median(results[(qi, k)]) for k in kinds}
            p99 = {k: percentile(results[(qi, k)], 0.99) for k in kinds}
            cells = ["%.1f / %.1f" % (med[k] * 1e3, p99[k] * 1e3) for k in kinds]
            lines.append("| `%s` | %s | %s | %.2f | %.2f |" % (
                q, kind, " | ".join(cells), med["sluice"] / med["prometheus"], med["sluice"] / med["victoria-metrics"]))
        table = "\n".join(lines)
        print()
        print(table)
        print("\nresponse bytes (sluice/prometheus/victoria-metrics): " + ", ".join(
            "%s %d/%d/%d" % (QUERIES[qi][1] + ":" + QUERIES[qi][0], sizes[(qi, "sluice")], sizes[(qi, "prometheus")],
                             sizes[(qi, "victoria-metrics")]) for qi in range(len(QUERIES))))
        print("total run time %.0f s, %d reps per query and system" % (time.time() - t0, a.reps))
        if a.markdown:
            with open(a.markdown, "w") as f:
                f.write(table + "\n")
    finally:
        for s in systems:
            s.stop()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
