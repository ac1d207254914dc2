"""Fault injection: high-cardinality abuse against --storage.max-series.

A client sends a million series with unique label values (900,000 by remote write in requests of
10,000, then 100,000 by push in bodies of 5,000) to a daemon limited to 50,000 series. Checks:
  - the limit holds: sluice_storage_head_series never exceeds it;
  - refusals are clear: remote write 503 (retry later, as Prometheus' sender expects) and push 400,
    both saying "series limit reached (storage.max-series)"; refused samples are counted
    (sluice_storage_rejected_max_series_total);
  - series that exist keep taking samples, reads keep working;
  - memory stays within budget: once the limit is reached, another 900,000 refused series move
    RSS by less than 64 MiB (requests are transient; nothing of a refused series is kept).
"""
import os
import time

import requests

import promproto as pp


# RSS is meaningful in the Release and ASan builds (ASan's quarantine of freed memory is kept
# small for these daemons so it does not look like growth); under TSan (tests/tsan.sh sets
# SLUICE_SKIP_RSS_CHECKS=1) shadow memory and history make it meaningless, so only liveness and
# race freedom are checked there.
RSS_CHECKS = os.environ.get("SLUICE_SKIP_RSS_CHECKS") != "1"
SAN_ENV = {"ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=8:thread_local_quarantine_size_kb=64"}

MAX_SERIES = 50000
PER_REQUEST = 10000
RW_TOTAL = 900000
PUSH_TOTAL = 100000
PUSH_PER_BODY = 5000


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def metric(url, name):
    for line in requests.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name}")


def write_body(first, n, t_ms):
    """A WriteRequest of n series card{u="<first..first+n-1>"} with one sample each, built from
    pre-encoded pieces (encoding a million series through promproto's helpers is too slow)."""
    name = pp.bytes_field(1, pp.label_msg("__name__", "card"))
    sample = pp.bytes_field(2, pp.sample_msg(t_ms, 1.0))
    parts = []
    for u in range(first, first + n):
        ts = name + pp.bytes_field(1, pp.label_msg("u", "v%09d" % u)) + sample
        parts.append(pp.bytes_field(1, ts))
    return pp.snappy.compress(b"".join(parts))


def test_million_unique_series_hit_max_series(start_sluice):
    s = start_sluice(f"--storage.max-series={MAX_SERIES}", env=SAN_ENV)
    pid = s.proc.pid
    t = (int(time.time()) - 60) * 1000
    statuses = {}
    first_refusal = None
    rss_at_limit = None
    for first in range(0, RW_TOTAL, PER_REQUEST):
        st, _, body = pp.post(s.url + "/api/v1/write", write_body(first, PER_REQUEST, t), pp.WRITE_HEADERS)
        statuses[st] = statuses.get(st, 0) + 1
        if st != 204:
            assert st == 503, (st, body)
            assert b"series limit reached (storage.max-series)" in body, body
            if first_refusal is None:
                first_refusal = first
                rss_at_limit = rss_kb(pid)
        assert metric(s.url, "sluice_storage_head_series") <= MAX_SERIES
    assert first_refusal is not None and first_refusal <= MAX_SERIES, statuses
    assert metric(s.url, "sluice_storage_head_series") == MAX_SERIES

    sess = requests.Session()
    for g in range(PUSH_TOTAL // PUSH_PER_BODY):
        body = "".join('card_push{u="p%09d"} 1\n' % (g * PUSH_PER_BODY + i) for i in range(PUSH_PER_BODY))
        r = sess.put(f"{s.url}/metrics/job/card/instance/i{g}", data=body, timeout=30)
        assert r.status_code == 400, (r.status_code, r.text[:300])
        assert "series limit reached (storage.max-series)" in r.text, r.text[:300]
    assert metric(s.url, "sluice_storage_head_series") == MAX_SERIES
    assert metric(s.url, "sluice_storage_rejected_max_series_total") >= RW_TOTAL - MAX_SERIES
    rss_end = rss_kb(pid)
    print(f"cardinality: {RW_TOTAL + PUSH_TOTAL} unique series sent, limit {MAX_SERIES} reached after "
          f"{first_refusal}; remote write statuses {statuses}; RSS at limit {rss_at_limit} KiB, "
          f"after the abuse {rss_end} KiB")
    assert not RSS_CHECKS or rss_end - rss_at_limit < 64 * 1024, (rss_at_limit, rss_end)

    # Existing series still take samples; reads work.
    st, _, body = pp.post(s.url + "/api/v1/write", write_body(0, 100, t + 1000), pp.WRITE_HEADERS)
    assert st == 204, body
    q = requests.get(s.url + "/api/v1/query", params={"query": "count(card)"}, timeout=30).json()
    assert q["status"] == "success" and q["data"]["result"][0]["value"][1] == str(MAX_SERIES), q
