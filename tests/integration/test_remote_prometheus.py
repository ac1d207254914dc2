"""sluice as remote storage of a real Prometheus (Debian's 2.42, started here):

  * Prometheus scrapes a small exposition this test serves and remote-writes to sluice; once the
    target is gone (Prometheus then writes staleness markers) sluice holds, bit for bit, what
    Prometheus' own remote-read endpoint returns for the job, and the metadata it sent.
  * Prometheus uses sluice for remote_read: PromQL queries (query_range, query) return sluice's
    data; required_matchers and read_recent shape what it asks, as configured.
  * The same samples remote-written into Prometheus and sluice come back identical from both
    servers' STREAMED_XOR_CHUNKS answers for a range that cuts chunks (both trim at the range).

Nothing is skipped: a missing prometheus binary is a failure (deploy/install-deps.sh installs it).
"""
# ctest-labels: peer slow
import http.server
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request

import pytest

import promproto as pp
from conftest import free_port
from test_remote_read import xor_decode

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


class Prom:
    def __init__(self, workdir, config, extra=()):
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.dir = workdir
        cfg = os.path.join(workdir, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write(config.replace("PROMPORT", str(self.port)))
        self.log_path = os.path.join(workdir, "prometheus.log")
        log = open(self.log_path, "wb")
        assert os.access(PROMETHEUS, os.X_OK), "prometheus not installed"
        self.proc = subprocess.Popen(
            [PROMETHEUS, "--config.file=" + cfg, "--storage.tsdb.path=" + os.path.join(workdir, "tsdb"),
             "--web.listen-address=127.0.0.1:%d" % self.port, *extra],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.time() + 120
        while time.time() < deadline:
            assert self.proc.poll() is None, self.log()
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError("prometheus not ready:\n" + self.log())

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-5000:]

    def api(self, path, **params):
        with urllib.request.urlopen(self.url + path + "?" + urllib.parse.urlencode(params), timeout=60) as r:
            d = json.loads(r.read())
        assert d["status"] == "success", d
        return d["data"]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def workdir():
    d = tempfile.mkdtemp(prefix="sluice-prom-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def prometheus(workdir):
    started = []

    def start(config, extra=()):
        d = os.path.join(workdir, "p%d" % len(started))
        os.makedirs(d)
        p = Prom(d, config, extra)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


class Target:
    """An exposition served on a free port: a counter that grows by 3 per scrape, a gauge, and a
    labelled family, with HELP/TYPE (metadata Prometheus forwards)."""

    def __init__(self):
        self.scrapes = 0
        target = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                target.scrapes += 1
                n = target.scrapes
                body = ("# HELP tgt_requests_total Requests handled.\n# TYPE tgt_requests_total counter\n"
                        "tgt_requests_total %d\n"
                        "# HELP tgt_temperature_celsius Temperature.\n# TYPE tgt_temperature_celsius gauge\n"
                        "tgt_temperature_celsius %s\n"
                        "# TYPE tgt_queue gauge\ntgt_queue{q=\"a\"} %d\ntgt_queue{q=\"b\"} 0.5\n"
                        % (3 * n, repr(20.0 + n / 8.0), n % 4)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()


def samples_read(url, matchers, start, end):
    st, _, res = pp.remote_read(url, [(start, end, matchers, None)])
    assert st == 200, res
    return {labels: samples for labels, samples in res[0]}


def test_prometheus_remote_writes_into_sluice(start_sluice, prometheus):
    sl = start_sluice()
    tgt = Target()
    # 2 s scrapes: the raw tier keeps one sample per second, and 1 s scrapes with a few ms of
    # jitter could put two scrapes into one second (the later would replace the earlier).
    cfg = """
global: {scrape_interval: 2s, scrape_timeout: 1s, evaluation_interval: 1h}
scrape_configs:
  - job_name: static
    static_configs: [{targets: ["127.0.0.1:%d"]}]
remote_write:
  - url: %s/api/v1/write
    queue_config: {batch_send_deadline: 1s, min_backoff: 100ms, max_backoff: 1s}
    metadata_config: {send: true, send_interval: 2s}
""" % (tgt.port, sl.url)
    start_ms = int(time.time() * 1000) - 1000
    prom = prometheus(cfg)
    try:
        deadline = time.time() + 60
        while tgt.scrapes < 6 and time.time() < deadline:
            time.sleep(0.5)
        assert tgt.scrapes >= 6, prom.log()
    finally:
        tgt.stop()  # Prometheus now marks every series of the target stale and writes the markers
    time.sleep(5)

    m = [(pp.EQ, "job", "static")]
    deadline = time.time() + 90
    while True:
        end = int(time.time() * 1000) + 1000
        want = samples_read(prom.url, m, start_ms, end)
        got = samples_read(sl.url, m, start_ms, end)
        if got == want or time.time() > deadline:
            break
        time.sleep(1)
    assert set(got) == set(want)
    for labels in want:
        assert got[labels] == want[labels], labels
    names = {dict(l)["__name__"] for l in want}
    assert {"tgt_requests_total", "tgt_temperature_celsius", "tgt_queue", "up"} <= names
    counter = want[(("__name__", "tgt_requests_total"), ("instance", "127.0.0.1:%d" % tgt.port), ("job", "static"))]
    assert len(counter) >= 7 and counter[-1][1] == pp.STALE_NAN_BITS  # ends with a staleness marker

    # the same PromQL through Prometheus' engine over its own data agrees with sluice's samples
    last_t = max(t for t, b in counter if b != pp.STALE_NAN_BITS)
    q = prom.api("/api/v1/query", query="tgt_requests_total", time="%.3f" % (last_t / 1000))
    assert float(q["result"][0]["value"][1]) == pp.bits2f(dict(got[tuple(sorted(
        [("__name__", "tgt_requests_total"), ("instance", "127.0.0.1:%d" % tgt.port), ("job", "static")]))])[last_t])

    # metadata arrives on its own schedule
    deadline = time.time() + 30
    while time.time() < deadline:
        with urllib.request.urlopen(sl.url + "/api/v1/metadata", timeout=10) as r:
            md = json.loads(r.read())["data"]
        if "tgt_requests_total" in md:
            break
        time.sleep(0.5)
    assert md.get("tgt_requests_total") == [{"type": "counter", "help": "Requests handled.", "unit": ""}], md
    assert md.get("tgt_temperature_celsius") == [{"type": "gauge", "help": "Temperature.", "unit": ""}], md


def test_prometheus_reads_sluice(start_sluice, prometheus):
    sl = start_sluice()
    step = 15000
    now = int(time.time() * 1000)
    t0 = (now - 90 * 60000) // step * step
    old_end = (now - 10 * 60000) // step * step

    def val(i, k):
        return float(i * 10000 + k) + 0.25

    series = [([("__name__", "pr_m"), ("job", "remote"), ("i", str(i))],
               [(t, val(i, (t - t0) // step)) for t in range(t0, old_end + 1, step)]) for i in range(3)]
    series.append(([("__name__", "pr_m"), ("job", "old")], [(t, 1.0) for t in range(t0, old_end + 1, step)]))
    assert pp.remote_write(sl.url, series)[0] == 204

    cfg = """
global: {scrape_interval: 1s, evaluation_interval: 1h}
scrape_configs:
  - job_name: self
    static_configs: [{targets: ["127.0.0.1:PROMPORT"]}]
remote_read:
  - url: %s/api/v1/read
    read_recent: true
    required_matchers: {job: remote}
  - url: %s/api/v1/read
    read_recent: false
    required_matchers: {job: old}
""" % (sl.url, sl.url)
    prom = prometheus(cfg)
    time.sleep(3)  # local TSDB has samples: its start time is now "after" the old data
    # recent data, written after Prometheus started: negative values, so they are recognisable
    recent = int(time.time() * 1000) // 1000 * 1000
    assert pp.remote_write(sl.url, [([("__name__", "pr_m"), ("job", "remote"), ("i", "0")], [(recent, -5.0)]),
                                     ([("__name__", "pr_m"), ("job", "old")], [(recent, -7.0)])])[0] == 204

    # query_range returns exactly sluice's samples (steps land on sample timestamps)
    r = prom.api("/api/v1/query_range", query='pr_m{job="remote"}', start="%.3f" % (t0 / 1000),
                 end="%.3f" % (old_end / 1000), step="15")
    assert r["resultType"] == "matrix"
    assert len(r["result"]) == 3
    for s in r["result"]:
        i = int(s["metric"]["i"])
        assert s["metric"] == {"__name__": "pr_m", "job": "remote", "i": str(i)}
        assert [(round(float(t) * 1000), float(v)) for t, v in s["values"]] == [
            (t, val(i, (t - t0) // step)) for t in range(t0, old_end + 1, step)]

    # instant query at the recent sample: read_recent lets Prometheus see it
    q = prom.api("/api/v1/query", query='pr_m{job="remote",i="0"}', time="%.3f" % (recent / 1000 + 1))
    assert [float(x["value"][1]) for x in q["result"]] == [-5.0]
    # read_recent: false asks only for what predates the local TSDB's start time, and Prometheus
    # 2.42 adds a 4h safety margin (2 x min block duration) to that start: for a fresh Prometheus
    # everything up to now+4h still comes from sluice, the recent sample included.
    q = prom.api("/api/v1/query", query='pr_m{job="old"}', time="%.3f" % (recent / 1000 + 1))
    assert [float(x["value"][1]) for x in q["result"]] == [-7.0]
    # required_matchers: without job=remote/old nothing is asked from sluice
    assert prom.api("/api/v1/query", query="pr_m", time="%.3f" % (old_end / 1000))["result"] == []
    assert prom.api("/api/v1/query", query='pr_m{job="other"}', time="%.3f" % (old_end / 1000))["result"] == []

    with urllib.request.urlopen(sl.url + "/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    n = [l for l in metrics.splitlines() if l.startswith("sluice_remote_read_samples_requests_total ")]
    assert n and float(n[0].split()[1]) > 0, "Prometheus 2.42 asks for SAMPLES"


def test_streamed_chunks_match_prometheus(start_sluice, prometheus):
    sl = start_sluice()
    prom = prometheus("global: {scrape_interval: 1h}\nscrape_configs: []\n",
                      extra=("--web.enable-remote-write-receiver",))
    now = int(time.time() * 1000) // 1000 * 1000
    t0 = now - 50 * 60000
    series = []
    for i in range(6):
        stepms = 1000 if i < 2 else 10000
        pts = [(t0 + k * stepms + i * 7, float((k * 131 + i) % 977) / 4) for k in range((now - 60000 - t0) // stepms)]
        series.append(([("__name__", "ds_m"), ("i", str(i))], pts))
    for url in (sl.url, prom.url):
        st, _, body = pp.remote_write(url, series)
        assert st in (200, 204), (url, st, body)
    start, end = t0 + 61234, t0 + 1500000 + 789
    q = [(start, end, [(pp.EQ, "__name__", "ds_m")], None)]

    def decoded(url):
        st, hdrs, body = pp.remote_read(url, q, (pp.STREAMED_XOR_CHUNKS,))
        assert st == 200, body
        assert hdrs.get("Content-Type") == "application/x-streamed-protobuf; proto=prometheus.ChunkedReadResponse"
        frames = list(pp.parse_frames(body))
        flat = [(labels, c) for _, labels, chunks, _ in frames for c in chunks]
        out = {}
        for (labels, c), samples in zip(flat, xor_decode([c[3] for _, c in flat])):
            assert samples[0][0] == c[0] and samples[-1][0] == c[1]
            out.setdefault(labels, []).extend(samples)
        return [labels for _, labels, _, _ in frames], out

    order_p, prom_data = decoded(prom.url)
    order_s, sl_data = decoded(sl.url)
    assert sorted(set(order_s)) == sorted(set(order_p))
    assert prom_data == sl_data
    assert all(start <= t <= end for s in sl_data.values() for t, _ in s)
