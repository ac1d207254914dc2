"""Fault injection: one query, many queries, or one remote read must not take memory or time they
were not given (issue #16, cases 3 and 4).

Data: 2,000 series `hc` with a sample every 5 minutes over the last day (576,000 samples), held
raw (--retention.raw=2d). `count_over_time(hc[1d:400ms])` gathers 216,000 inner steps x 2,000
series (432 M samples) before Prometheus' sample limit would stop it; before the engine charged
its memory to budgets it peaked at 5.7 GB RSS in a Release build, and three at once took 6.4 GB.

  - per query: with --query.max-memory-per-query=256MiB the query ends with 422 (errorType
    execution, "more than ... bytes of memory") and RSS grows by at most the limit plus slack;
  - across queries: with --query.max-memory=600MiB, four such queries at once end with 422 or 503
    (errorType unavailable) and RSS grows by at most the shared limit plus slack; afterwards the
    budget is back to 0 (sluice_query_memory_bytes) and ordinary queries answer;
  - timeout everywhere: with --query.timeout=1s the query ends with 503 errorType timeout, a
    SAMPLES remote read repeating one query 80 times (46 M samples, under the sample limit)
    ends with 503 "timed out" instead of building its answer for minutes, and a streamed one of
    400 copies ends its stream with the error text;
  - remote read memory: with --query.max-memory-per-query=64MiB a SAMPLES read of 20 copies
    (11.5 M samples, ~150 MB of protobuf) is refused with 400 and RSS grows by at most the limit
    plus slack; one copy (~7 MB) is answered.
RSS is sampled from /proc/<pid>/status every 10 ms while the requests run.
"""
import os
import threading
import time

import requests

import promproto as pp

RSS_CHECKS = os.environ.get("SLUICE_SKIP_RSS_CHECKS") != "1"
SAN_ENV = {"ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=8:thread_local_quarantine_size_kb=64"}
# ASan's shadow memory and allocator overhead, glibc arenas of the query threads, the HTTP reply
SLACK_MB = 192
NSERIES = 2000
STEP_S = 300
HEAVY = "count_over_time(hc[1d:400ms])"


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


class PeakRss:
    """Samples the daemon's RSS in a thread; .peak is the most seen."""

    def __init__(self, pid):
        self.pid, self.peak, self._stop = pid, rss_mb(pid), threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb(self.pid))
            time.sleep(0.01)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def load(url):
    now = int(time.time()) * 1000
    ts = list(range(now - 86400_000, now, STEP_S * 1000))
    per = max(1, 20000 // NSERIES)
    for i in range(0, len(ts), per):
        series = [([("__name__", "hc"), ("job", "j"), ("s", "%05d" % s)],
                   [(t, float(s + (t // 1000) % 100)) for t in ts[i:i + per]]) for s in range(NSERIES)]
        st, _, body = pp.remote_write(url, series)
        assert st in (200, 204), (st, body)
    return now


def query(url, q, timeout=300):
    return requests.post(url + "/api/v1/query", data={"query": q}, timeout=timeout)


def metric(url, name):
    for line in requests.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name}")


def settle(s):
    """Loads the data, runs one ordinary query (so the query threads and caches exist) and
    returns the RSS to measure growth from."""
    load(s.url)
    r = query(s.url, "count(count_over_time(hc[1d]))")
    assert r.status_code == 200, r.text
    assert r.json()["data"]["result"][0]["value"][1] == str(NSERIES)
    time.sleep(0.5)
    return rss_mb(s.proc.pid)


def test_one_query_is_bounded_by_its_memory_limit(start_sluice):
    s = start_sluice("--retention.raw=2d", "--query.max-memory-per-query=256MiB", env=SAN_ENV)
    base = settle(s)
    with PeakRss(s.proc.pid) as p:
        r = query(s.url, HEAVY)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["errorType"] == "execution"
    assert "more than 268435456 bytes of memory (--query.max-memory-per-query)" in body["error"]
    if RSS_CHECKS:
        assert p.peak - base < 256 + SLACK_MB, f"RSS grew {p.peak - base:.0f} MiB"
    assert metric(s.url, "sluice_query_memory_bytes") == 0
    # the daemon is fine and answers the next query
    r = query(s.url, "count(last_over_time(hc[15m]))")
    assert r.status_code == 200 and r.json()["data"]["result"][0]["value"][1] == str(NSERIES)


def test_concurrent_queries_share_one_budget(start_sluice):
    s = start_sluice("--retention.raw=2d", "--query.max-memory=600MiB", "--query.max-memory-per-query=400MiB",
                     env=SAN_ENV)
    base = settle(s)
    assert metric(s.url, "sluice_query_memory_limit_bytes") == 600 << 20
    results = [None] * 4

    def one(i):
        results[i] = query(s.url, HEAVY)

    with PeakRss(s.proc.pid) as p:
        ts = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    codes = sorted(r.status_code for r in results)
    assert set(codes) <= {422, 503}, [r.text for r in results]
    unavailable = [r.json() for r in results if r.status_code == 503]
    assert unavailable, "four 400 MiB queries fit in a 600 MiB budget?"
    for u in unavailable:
        assert u["errorType"] == "unavailable"
        assert "--query.max-memory" in u["error"]
    if RSS_CHECKS:
        assert p.peak - base < 600 + SLACK_MB, f"RSS grew {p.peak - base:.0f} MiB"
    assert metric(s.url, "sluice_query_memory_bytes") == 0
    assert metric(s.url, "sluice_query_memory_refused_total") >= len(unavailable)
    r = query(s.url, "sum(last_over_time(hc[15m]))")
    assert r.status_code == 200, r.text


def test_query_timeout_holds_for_queries_and_remote_read(start_sluice):
    s = start_sluice("--retention.raw=2d", "--query.timeout=1s", env=SAN_ENV)
    now = load(s.url)
    t0 = time.time()
    r = query(s.url, HEAVY)
    assert r.status_code == 503, r.text
    assert r.json()["errorType"] == "timeout"
    assert time.time() - t0 < 30

    q = (now - 86400_000, now, [(pp.EQ, "__name__", "hc")], None)
    t0 = time.time()
    st, _, body = pp.remote_read(s.url, [q] * 80)
    assert st == 503, (st, body[:200] if isinstance(body, bytes) else "a whole answer")
    assert b"remote read timed out (--query.timeout)" in body
    assert time.time() - t0 < 30
    # streamed, the answer has begun: the stream ends with the error text, which no client
    # decodes as a frame (as a storage error mid-stream)
    t0 = time.time()
    st, hdrs, body = pp.remote_read(s.url, [q] * 400, accepted=(pp.STREAMED_XOR_CHUNKS,))
    assert st == 200
    assert body.endswith(b"remote read timed out (--query.timeout)"), body[-200:]
    assert time.time() - t0 < 30

    # a small read fits in the time, even on a loaded machine
    st, _, resp = pp.remote_read(s.url, [(now - 3600_000, now, [(pp.EQ, "__name__", "hc")], None)])
    assert st == 200
    assert len(resp[0]) == NSERIES


def test_remote_read_is_bounded_by_the_memory_limit(start_sluice):
    s = start_sluice("--retention.raw=2d", "--query.max-memory-per-query=64MiB", env=SAN_ENV)
    now = load(s.url)
    q = (now - 86400_000, now, [(pp.EQ, "__name__", "hc")], None)
    st, _, resp = pp.remote_read(s.url, [q])
    assert st == 200 and len(resp[0]) == NSERIES
    time.sleep(0.5)
    base = rss_mb(s.proc.pid)
    with PeakRss(s.proc.pid) as p:
        st, _, body = pp.remote_read(s.url, [q] * 20)
    assert st == 400, (st, "a whole answer" if st == 200 else body[:200])
    assert b"remote read would use more than 67108864 bytes of memory (--query.max-memory-per-query)" in body
    if RSS_CHECKS:
        assert p.peak - base < 64 + SLACK_MB, f"RSS grew {p.peak - base:.0f} MiB"
    assert metric(s.url, "sluice_query_memory_bytes") == 0
