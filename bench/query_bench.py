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

Dashboard mode (--dashboard, issue #19): the requests Grafana sends for a Flink dashboard.
  Data: Flink-shaped series from flink_gen (internal/expfmt/flinkgen.c: TaskManager, task and
  operator metrics with Flink's labels, ~1,282 series per TaskManager; --series, default 250,000),
  each with the Pushgateway grouping label job="flink_tm<suffix>" it would get from a push, over
  the last --history seconds (default 1 h) at the Flink reporter's 10 s cadence. flink_gen is run
  for ticks 1..4; a counter (numRecords*, numBytes*, numBuffers*, numLateRecordsDropped, *_count)
  grows every tick by its real tick-1-to-2 increment, a gauge cycles through its four real values.
  Queries: six panels of deploy/grafana/flink-flow.json, as shipped (PANELS), with $job_name = All
  (".*") and $__rate_interval, for the windows 1 h, 6 h, 24 h and 7 d, each sent as Grafana 9's
  Prometheus data source sends a range query: POST /api/v1/query_range (form), gzip accepted,
  step = max(Grafana's rounded range / --width (1,000 px), --scrape-interval (10 s)),
  $__rate_interval = max(step + scrape interval, 4 x scrape interval) in Grafana's duration text
  (largest unit, truncated: 70 s is "1m"), start and end floored to a multiple of the step, "now"
  being the newest sample's time plus one interval (as if the dashboard were opened right after the
  last push; loading takes minutes). A panel's latency is the sum of its targets' (Grafana sends
  them separately). "points" counts the points each system returned, as a check they agree.
  History, honestly: remote write only loads recent samples into Prometheus' head (no
  out-of-order) and sluice keeps raw samples for --retention.raw (2 h) in memory, so every system
  holds the same last hour. The 6 h, 24 h and 7 d windows are therefore mostly empty in all three:
  they measure the step count, lookback and selector work, not reading days of samples.

Usage: bench/query_bench.py [--sluice BUILD/sluice] [--series 10000] [--reps 15] [--warmup 2]
                            [--markdown FILE]
       bench/query_bench.py --dashboard [--series 250000] [--history 3600] [--reps 3] [--warmup 1]
                            [--flink-gen BUILD/tests/tools/flink_gen] [--markdown FILE]
"""
import argparse
import gzip
import json
import math
import os
import queue
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
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
        if kind.startswith("sluice"):
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

    def write(self, bodies, flush=True):
        for b in bodies:
            st, _, resp = promproto.post(self.url + "/api/v1/write", b, promproto.WRITE_HEADERS, timeout=600)
            if st // 100 != 2:
                raise RuntimeError("%s: remote write %d %s" % (self.kind, st, resp[:200]))
        if flush and self.kind == "victoria-metrics":
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


# ---- dashboard mode (--dashboard) ---------------------------------------------------------------

# (panel title in deploy/grafana/flink-flow.json, short name): six of its time series panels, the
# shapes a Flink dashboard is made of: per-task rates, a two-target panel, worst-subtask gauges, a
# filtered gauge, a quantile label and an operator-level rate (36 series per TaskManager).
PANELS = [
    ("Records in per task /s", "records in /s"),
    ("Bytes in / out per job", "bytes in/out (2 queries)"),
    ("Backpressure (share of time, worst subtask)", "backpressure max"),
    ("Busy (share of time, worst subtask)", "busy max (>= 0)"),
    ("Mailbox latency p99 (ms)", "mailbox p99"),
    ("Late records dropped /s", "late records /s (operators)"),
]
WINDOWS = [("1h", 3600), ("6h", 6 * 3600), ("24h", 86400), ("7d", 7 * 86400)]
COUNTER = re.compile(r"(numRecords(In|Out)|numBytes(In|Out|InLocal|InRemote)|numBuffers(Out|InLocal|InRemote)|"
                     r"numLateRecordsDropped|_count|GarbageCollector_.*_(Count|Time))$")
GRAFANA_FORM = {"User-Agent": "Grafana/9.5.2", "X-Grafana-Org-Id": "1", "Accept-Encoding": "gzip",
                "Accept": "application/json, text/plain, */*", "Content-Type": "application/x-www-form-urlencoded"}


def grafana_round_interval(ms):
    """Grafana's roundInterval (pkg/tsdb/intervalv2): the "nice" interval for range / max data points."""
    table = [(15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1500, 1000), (3500, 2000),
             (7500, 5000), (12500, 10000), (17500, 15000), (25000, 20000), (45000, 30000), (90000, 60000),
             (210000, 120000), (450000, 300000), (750000, 600000), (1050000, 900000), (1500000, 1200000),
             (2700000, 1800000), (5400000, 3600000), (9000000, 7200000), (16200000, 10800000),
             (32400000, 21600000), (86400000, 43200000), (172800000, 86400000), (604800000, 86400000),
             (1814400000, 604800000)]
    for limit, v in table:
        if ms <= limit:
            return v
    return 2592000000 if ms < 3628800000 else 31536000000


def grafana_duration(ms):
    """Grafana's FormatDuration: the largest unit that fits, truncated (70 s -> "1m")."""
    for unit, n in (("y", 31536000000), ("d", 86400000), ("h", 3600000), ("m", 60000), ("s", 1000), ("ms", 1)):
        if ms >= n:
            return "%d%s" % (ms // n, unit)
    return "1ms"


def grafana_request(window_s, now, width, scrape_s):
    """(start, end, step seconds, $__rate_interval text) of a range query Grafana sends."""
    scrape_ms = scrape_s * 1000
    calc = window_s * 1000 // width
    step_ms = scrape_ms if calc < scrape_ms else max(grafana_round_interval(calc), scrape_ms)
    rate_ms = max(step_ms + scrape_ms, 4 * scrape_ms)
    step = step_ms / 1000
    end = math.floor(now / step) * step
    start = math.floor((now - window_s) / step) * step
    return start, end, step, grafana_duration(rate_ms)


def dashboard_panels():
    with open(os.path.join(ROOT, "deploy", "grafana", "flink-flow.json")) as f:
        d = json.load(f)
    by_title = {p.get("title"): p for p in d["panels"]}
    out = []
    for title, short in PANELS:
        p = by_title[title]
        out.append((title, short, [t["expr"] for t in p["targets"]]))
    return out


def flink_snapshots(flink_gen, nseries):
    """{series key: (labels, [values at ticks 1..4])} for the first nseries flink_gen series."""
    tms = max(1, -(-nseries // 1282))
    snaps = []
    for tick in (1, 2, 3, 4):
        out = subprocess.run([flink_gen, str(tms), "7", str(tick)], check=True, capture_output=True).stdout
        snaps.append(out.decode())
    series = {}
    order = []
    label_re = re.compile(r'(\w+)="([^"]*)"')
    for si, text in enumerate(snaps):
        job = None
        for line in text.splitlines():
            if line.startswith("# flink_gen job="):
                job = line.split()[2][4:]
                continue
            if not line or line[0] == "#":
                continue
            key, _, val = line.rpartition(" ")
            if si == 0:
                if len(order) >= nseries:
                    continue
                name, _, rest = key.partition("{")
                labels = [("__name__", name)] + label_re.findall(rest) + [("job", job)]
                series[key] = (labels, [float(val)])
                order.append(key)
            elif key in series:
                series[key][1].append(float(val))
    return [series[k] for k in order]


varint = promproto.uvarint
field = promproto.bytes_field


def dashboard_bodies(series, times_ms, batch=500):
    """Yields snappy remote-write bodies, `batch` series each, every series with all its samples.
    Samples are encoded by hand (one fixed 18-byte message each) to keep 90 M of them fast."""
    ts = [b"\x10" + varint(t) for t in times_ms]
    assert all(len(t) == 7 for t in ts), "timestamps must encode to 6-byte varints"
    pack = struct.Struct("<d").pack
    n = len(times_ms)
    parts = []
    for i, (labels, vals) in enumerate(series):
        head = b"".join(field(1, field(1, k.encode()) + field(2, v.encode())) for k, v in labels)
        name = labels[0][1]
        if COUNTER.search(name):
            d = max(0.0, vals[1] - vals[0])
            body = b"".join([b"\x12\x10\x09" + pack(vals[0] + k * d) + ts[k] for k in range(n)])
        else:
            enc = [b"\x12\x10\x09" + pack(v) for v in vals]
            body = b"".join([enc[k & 3] + ts[k] for k in range(n)])
        parts.append(field(1, head + body))
        if len(parts) == batch or i == len(series) - 1:
            yield promproto.snappy.compress(b"".join(parts))
            parts = []


def cpu_seconds(pid):
    """User + system CPU seconds of a process so far (all its threads), from /proc."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_peak_mb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def post_form(url, params, timeout=600):
    req = urllib.request.Request(url, data=urllib.parse.urlencode(params).encode(), method="POST",
                                 headers=GRAFANA_FORM)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
        if r.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return r.status, body


def run_dashboard(a):
    t0 = time.time()
    nseries = a.series or 250000
    flink_gen = a.flink_gen or os.path.join(os.path.dirname(os.path.abspath(a.sluice)), "tests", "tools", "flink_gen")
    series = flink_snapshots(flink_gen, nseries)
    scrape = a.scrape_interval
    end = int(time.time()) // scrape * scrape - scrape
    times = [(end - a.history + k * scrape) * 1000 for k in range(a.history // scrape + 1)]
    print("data: %d Flink series from %s (%d TaskManagers), %d samples each (%d s at %d s), %d samples; "
          "read in %.0f s" % (len(series), os.path.basename(flink_gen), -(-len(series) // 1282), len(times),
                             a.history, scrape, len(series) * len(times), time.time() - t0))
    panels = dashboard_panels()
    d = tempfile.mkdtemp(prefix="query-bench-dash-")
    systems = []
    try:
        for kind, binary in (("sluice", a.sluice), ("prometheus", None), ("victoria-metrics", None)):
            systems.append(Server(kind, binary, d))
        # One writer thread per system, so the three ingest side by side while this thread encodes
        # the next bodies; the queues are short, so only a few bodies are in memory at a time.
        ingest = {s.kind: 0.0 for s in systems}
        queues = {s.kind: queue.Queue(maxsize=4) for s in systems}
        errors = []

        def writer(s):
            q = queues[s.kind]
            while True:
                body = q.get()
                if body is None:
                    return
                if errors:
                    continue
                t2 = time.perf_counter()
                try:
                    s.write([body], flush=False)
                except Exception as e:  # reported after the join
                    errors.append(e)
                ingest[s.kind] += time.perf_counter() - t2

        threads = [threading.Thread(target=writer, args=(s,)) for s in systems]
        for th in threads:
            th.start()
        t1 = time.time()
        nbytes = nbodies = 0
        try:
            for body in dashboard_bodies(series, times):
                nbytes += len(body)
                nbodies += 1
                for q in queues.values():
                    q.put(body)
                if errors:
                    break
        finally:
            for q in queues.values():
                q.put(None)
            for th in threads:
                th.join()
        if errors:
            raise errors[0]
        for s in systems:
            s.write([])  # VictoriaMetrics: make what it buffered searchable
        del series
        print("loaded %d requests, %.0f MB snappy, in %.0f s (the three side by side, encoding included); busy "
              "writing: %s" % (nbodies, nbytes / 1e6, time.time() - t1,
                               ", ".join("%s %.0f s" % (k, v) for k, v in ingest.items())))
        time.sleep(3)

        # The dashboard is opened as of the newest sample (loading 250k series takes minutes; at
        # wall-clock time the newest minutes of every window would be empty in all three).
        now = end + scrape
        reqs = {}  # (pi, wi) -> [(query, start, end, step)]
        for pi, (title, short, exprs) in enumerate(panels):
            for wi, (wname, wsec) in enumerate(WINDOWS):
                start, end_, step, rate = grafana_request(wsec, now, a.width, scrape)
                qs = [e.replace("$__rate_interval", rate).replace("$job_name", ".*") for e in exprs]
                reqs[(pi, wi)] = [(q, start, end_, step) for q in qs]
        for wi, (wname, wsec) in enumerate(WINDOWS):
            start, end_, step, rate = grafana_request(wsec, now, a.width, scrape)
            print("  window %-3s step %gs, $__rate_interval %s, %d steps" % (wname, step, rate,
                                                                           int((end_ - start) / step) + 1))

        def run(s, pi, wi):
            total, size, points = 0.0, 0, 0
            for q, start, end_, step in reqs[(pi, wi)]:
                params = {"query": q, "start": "%.3f" % start, "end": "%.3f" % end_, "step": "%g" % step}
                t2 = time.perf_counter()
                st, body = post_form(s.url + "/api/v1/query_range", params)
                total += time.perf_counter() - t2
                if st != 200:
                    raise RuntimeError("%s %s: %d %s" % (s.kind, q, st, body[:200]))
                r = json.loads(body)
                if r.get("status") != "success":
                    raise RuntimeError("%s %s: %s" % (s.kind, q, body[:300]))
                size += len(body)
                points += sum(len(x["values"]) for x in r["data"]["result"])
            if points == 0:
                raise RuntimeError("%s: panel %s, window %s: no points" % (s.kind, panels[pi][0], WINDOWS[wi][0]))
            return total, size, points

        results, sizes, points = {}, {}, {}
        for pi, (title, short, exprs) in enumerate(panels):
            for wi, (wname, wsec) in enumerate(WINDOWS):
                for s in systems:
                    for _ in range(a.warmup):
                        _, sizes[(pi, wi, s.kind)], points[(pi, wi, s.kind)] = run(s, pi, wi)
                for _ in range(a.reps):
                    for s in systems:
                        results.setdefault((pi, wi, s.kind), []).append(run(s, pi, wi)[0])
            print("  panel %-30s done (%.0f s)" % (short, time.time() - t0))

        kinds = [s.kind for s in systems]
        mem = {s.kind: rss_peak_mb(s.proc.pid) for s in systems}
        lines = ["| panel | window | " + " | ".join("%s median / p99 (ms)" % k for k in kinds) +
                 " | sluice ÷ prometheus | sluice ÷ victoria-metrics | points (s/p/vm) |",
                 "|---|---|" + "---|" * len(kinds) + "---|---|---|"]
        for pi, (title, short, exprs) in enumerate(panels):
            for wi, (wname, wsec) in enumerate(WINDOWS):
                med = {k: statistics.median(results[(pi, wi, k)]) for k in kinds}
                p99 = {k: percentile(results[(pi, wi, k)], 0.99) for k in kinds}
                cells = ["%.1f / %.1f" % (med[k] * 1e3, p99[k] * 1e3) for k in kinds]
                lines.append("| %s | %s | %s | %.2f | %.2f | %s |" % (
                    title, wname, " | ".join(cells), med["sluice"] / med["prometheus"],
                    med["sluice"] / med["victoria-metrics"], "/".join(str(points[(pi, wi, k)]) for k in kinds)))
        for wi, (wname, wsec) in enumerate(WINDOWS):
            tot = {k: sum(statistics.median(results[(pi, wi, k)]) for pi in range(len(panels))) for k in kinds}
            lines.append("| **whole dashboard (6 panels)** | %s | %s | %.2f | %.2f | |" % (
                wname, " | ".join("%.1f" % (tot[k] * 1e3) for k in kinds), tot["sluice"] / tot["prometheus"],
                tot["sluice"] / tot["victoria-metrics"]))
        table = "\n".join(lines)
        print()
        print(table)
        summary = ("%d series x %d samples (last %d s at %d s); peak RSS (MB): %s; %d reps per panel, window and "
                   "system; total run time %.0f s" % (
                       nseries, len(times), a.history, scrape, ", ".join("%s %.0f" % (k, mem[k]) for k in kinds),
                       a.reps, time.time() - t0))
        print(summary)
        if a.markdown:
            with open(a.markdown, "w") as f:
                f.write(table + "\n\n" + summary + "\n")
    finally:
        for s in systems:
            s.stop()
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default=os.path.join(ROOT, "build", "sluice"))
    ap.add_argument("--series", type=int, help="default 10000, or 250000 with --dashboard")
    ap.add_argument("--reps", type=int, help="default 15, or 3 with --dashboard")
    ap.add_argument("--warmup", type=int, help="default 2, or 1 with --dashboard")
    ap.add_argument("--markdown")
    ap.add_argument("--only", help="run only the queries whose 'kind:name' contains this text")
    ap.add_argument("--baseline", help="a second sluice binary (e.g. before a change) run beside the first as "
                    "'sluice-baseline': same data, interleaved queries, responses compared byte for byte")
    ap.add_argument("--dashboard", action="store_true", help="Grafana dashboard shapes over Flink series")
    ap.add_argument("--history", type=int, default=3600, help="--dashboard: seconds of samples loaded")
    ap.add_argument("--scrape-interval", type=int, default=10, help="--dashboard: sample cadence, Grafana's min step")
    ap.add_argument("--width", type=int, default=1000, help="--dashboard: panel width in px (max data points)")
    ap.add_argument("--flink-gen", help="--dashboard: flink_gen binary (default: beside --sluice in tests/tools)")
    a = ap.parse_args()
    if a.dashboard:
        a.reps = 3 if a.reps is None else a.reps
        a.warmup = 1 if a.warmup is None else a.warmup
        run_dashboard(a)
        return
    a.series = 10000 if a.series is None else a.series
    a.reps = 15 if a.reps is None else a.reps
    a.warmup = 2 if a.warmup is None else a.warmup
    queries = [q for q in QUERIES if not a.only or a.only in q[1] + ":" + q[0]]

    end = int(time.time()) // 15 * 15 - 15
    t0 = time.time()
    bodies, npts = build_bodies(a.series, end)
    total = sum(len(b) for b in bodies)
    print("data: %d counter series + 240 histogram buckets, %d samples each (1 h at 15 s), %d requests, "
          "%.1f MB snappy; built in %.0f s" % (a.series, npts, len(bodies), total / 1e6, time.time() - t0))
    d = tempfile.mkdtemp(prefix="query-bench-")
    systems = []
    try:
        entrants = [("sluice", a.sluice), ("prometheus", None), ("victoria-metrics", None)]
        if a.baseline:
            entrants.insert(1, ("sluice-baseline", a.baseline))
        for kind, binary in entrants:
            s = Server(kind, binary, d)
            systems.append(s)
            t1 = time.time()
            s.write(bodies)
            print("%-16s ingested in %.1f s" % (kind, time.time() - t1))
        time.sleep(3)  # let every system make the last writes searchable

        results = {}  # (qi, kind) -> [seconds]
        cpu = {}  # (qi, kind) -> [CPU seconds the server spent on the request]
        sizes = {}
        same = []
        for qi, (name, kind, q) in enumerate(queries):
            bodies_seen = {}
            for s in systems:
                for _ in range(a.warmup):
                    st, body = http_get(query_url(s.url, kind, q, end))
                    if st != 200:
                        raise RuntimeError("%s %s: %d %s" % (s.kind, q, st, body[:200]))
                    sizes[(qi, s.kind)] = len(body)
                    bodies_seen[s.kind] = body
            if a.baseline:
                same.append(bodies_seen["sluice"] == bodies_seen["sluice-baseline"])
            for _ in range(a.reps):
                for s in systems:
                    u = query_url(s.url, kind, q, end)
                    c1 = cpu_seconds(s.proc.pid)
                    t1 = time.perf_counter()
                    http_get(u)
                    results.setdefault((qi, s.kind), []).append(time.perf_counter() - t1)
                    cpu.setdefault((qi, s.kind), []).append(cpu_seconds(s.proc.pid) - c1)
            print("  %-10s %-28s done" % (kind, name))

        kinds = [s.kind for s in systems]
        vs = ["prometheus", "victoria-metrics"] + (["sluice-baseline"] if a.baseline else [])
        lines = ["| query | kind | " + " | ".join("%s median / p99 (ms)" % k for k in kinds) + " | " +
                 " | ".join("sluice ÷ %s (median)" % k for k in vs) + " |",
                 "|---|---|" + "---|" * (len(kinds) + len(vs))]
        for qi, (name, kind, q) in enumerate(queries):
            med = {k: statistics.median(results[(qi, k)]) for k in kinds}
            p99 = {k: percentile(results[(qi, k)], 0.99) for k in kinds}
            cells = ["%.1f / %.1f" % (med[k] * 1e3, p99[k] * 1e3) for k in kinds]
            lines.append("| `%s` | %s | %s | %s |" % (
                q, kind, " | ".join(cells), " | ".join("%.2f" % (med["sluice"] / med[k]) for k in vs)))
        lines += ["", "Server CPU time per query (median ms; user + system of the server process, which the "
                  "machine's other load disturbs less than wall time):", "",
                  "| query | kind | " + " | ".join(kinds) + " |", "|---|---|" + "---|" * len(kinds)]
        for qi, (name, kind, q) in enumerate(queries):
            lines.append("| `%s` | %s | %s |" % (q, kind, " | ".join(
                "%.0f" % (statistics.median(cpu[(qi, k)]) * 1e3) for k in kinds)))
        table = "\n".join(lines)
        print()
        print(table)
        print("\nresponse bytes (sluice/prometheus/victoria-metrics): " + ", ".join(
            "%s %d/%d/%d" % (queries[qi][1] + ":" + queries[qi][0], sizes[(qi, "sluice")], sizes[(qi, "prometheus")],
                             sizes[(qi, "victoria-metrics")]) for qi in range(len(queries))))
        if a.baseline:
            print("sluice and sluice-baseline responses byte-identical: %d of %d queries" % (sum(same), len(same)))
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
