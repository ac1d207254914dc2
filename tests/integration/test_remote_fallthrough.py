"""Remote-read fall-through against a real Prometheus 2.42 (Debian's, started here) as the remote
store (docs/deploy.md, "Fall-through to a remote store"):

  * Prometheus holds 3 hours of data (backfilled with `promtool tsdb create-blocks-from
    openmetrics`); sluice, with a 1-hour raw retention, holds only the last 20 minutes of the
    same samples (remote-written into it). The seam -- sluice's oldest sample -- lies inside every
    query below. Over the seam sluice (--remote-read.url = Prometheus) answers exactly what
    Prometheus alone answers for the full range: raw selectors, rate, sum by, *_over_time, range
    and instant queries, remote-only series, STREAMED_XOR_CHUNKS and SAMPLES answers.
  * Default mode cuts the remote at the seam (a series only the remote has after it is not
    read there); --remote-read.read-recent asks for everything and merges by timestamp, so the
    answer equals Prometheus' for the recent part too.
  * A remote that is down: --remote-read.on-error=warn answers from local data with a warning
    (partial response); =fail answers 503 "unavailable"; a remote that answers garbage (404)
    with fail gives 422 "execution".
  * /api/v1/series and label values reach the remote too.
  * The store over TLS (Prometheus with --web.config.file and the test CA of test_tls.py): over the
    seam the answer is the same as over plain HTTP, with the --remote-read.tls-* flags, with mTLS,
    and with per-URL tls-*= options overriding the flags. An untrusted CA, a wrong server name and a
    missing client certificate are refused in the handshake: a warning naming the store and a
    clear log line (warn), 503 (fail). Bad TLS files stop sluice at start with a message.

Nothing is skipped: a missing prometheus/promtool is a failure (deploy/install-deps.sh installs
them).
"""
# ctest-labels: peer
import math
import os
import re
import shutil
import subprocess
import time

import pytest
import requests

import promproto as pp
from conftest import free_port
from test_tls import pki, write_web_config  # noqa: F401 (pki is a fixture: the test CA and certificates)

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

STEP_S = 15
HISTORY_S = 3 * 3600
SLUICE_KEEPS_S = 20 * 60  # what sluice gets (its raw retention is 1h: a margin for slow runs)


def build_data(now_s):
    """{(name, labels tuple): [(t_ms, value)]}, every series on the same 15 s grid ending a
    minute ago. Job "c" plays a job another node received: only Prometheus has it."""
    end = (now_s - 60) // STEP_S * STEP_S
    start = end - HISTORY_S
    ts = list(range(start, end + 1, STEP_S))
    data = {}
    for job, inst, seed in (("a", "i1", 1), ("a", "i2", 2), ("b", "i1", 3), ("c", "i1", 4)):
        c, pts = 0.0, []
        for k, t in enumerate(ts):
            c += (k * seed * 7919) % 13 + 0.25 * seed
            if job == "b" and k == len(ts) // 3:
                c = 1.0  # a counter reset in the old part
            pts.append((t * 1000, c))
        data[("ft_requests_total", (("instance", inst), ("job", job)))] = pts
    data[("ft_temp", (("instance", "i1"), ("job", "a")))] = [
        (t * 1000, round(20 + 5 * math.sin(k / 17.0) + (k % 7) * 0.125, 3)) for k, t in enumerate(ts)]
    # A series that stopped before sluice's time: only the remote can answer for it.
    data[("ft_old_only", (("job", "a"),))] = [(t * 1000, float(k)) for k, t in enumerate(ts[:len(ts) // 2])]
    return data, start, end


def backfill(tsdb, data, workdir):
    om = os.path.join(workdir, "data.om")
    fams = {}
    for (name, labels), pts in data.items():
        fams.setdefault(name, []).append((labels, pts))
    with open(om, "w") as f:
        for name, members in fams.items():
            f.write("# TYPE %s gauge\n" % name)
            for labels, pts in members:
                lab = ",".join('%s="%s"' % kv for kv in labels)
                for ms, v in pts:
                    f.write("%s{%s} %r %d.%03d\n" % (name, lab, v, ms // 1000, ms % 1000))
        f.write("# EOF\n")
    os.makedirs(tsdb)
    p = subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", om, tsdb],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    assert p.returncode == 0, p.stdout.decode()


class Prom:
    """Prometheus serving tsdb; with web_config over https://<host>, reached with the requests
    keyword arguments in client (verify=, cert=)."""

    def __init__(self, workdir, tsdb, web_config=None, host="127.0.0.1", client=None):
        assert os.access(PROMETHEUS, os.X_OK), "prometheus not installed"
        self.port = free_port()
        self.url = "%s://%s:%d" % ("https" if web_config else "http", host, self.port)
        self.client = client or {}
        cfg = os.path.join(workdir, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write("global:\n  scrape_interval: 1h\n  evaluation_interval: 1h\nscrape_configs: []\n")
        self.log_path = os.path.join(workdir, "prometheus.log")
        log = open(self.log_path, "wb")
        args = [PROMETHEUS, "--config.file=" + cfg, "--storage.tsdb.path=" + tsdb,
                "--storage.tsdb.retention.time=3650d", "--web.listen-address=127.0.0.1:%d" % self.port]
        if web_config:
            args.append("--web.config.file=" + web_config)
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.time() + 120
        while True:
            assert self.proc.poll() is None, self.log()
            try:
                if self.get("/-/ready", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.time() < deadline, "prometheus not ready:\n" + self.log()
            time.sleep(0.2)

    def get(self, path, **kw):
        return requests.get(self.url + path, **self.client, **kw)

    def wait_blocks(self, start):
        """Waits until Prometheus sees every backfilled block (before it serves as a store)."""
        deadline = time.time() + 60
        while True:
            r = self.get("/api/v1/query", params={"query": "count(ft_temp)", "time": start + 1}).json()
            if r["data"]["result"]:
                return
            assert time.time() < deadline, self.log()
            time.sleep(0.5)

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-5000:]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("fallthrough"))
    now_s = int(time.time())
    data, start, end = build_data(now_s)
    tsdb = os.path.join(workdir, "tsdb")
    backfill(tsdb, data, workdir)
    prom = Prom(workdir, tsdb)
    prom.wait_blocks(start)  # before it is the reference
    yield {"prom": prom, "data": data, "start": start, "end": end, "now": now_s}
    prom.stop()


def load_recent(sluice_url, w):
    """Remote-writes the last SLUICE_KEEPS_S of every series but job c / ft_old_only into sluice;
    returns the seam (the oldest timestamp sent, ms)."""
    cut = (w["end"] - SLUICE_KEEPS_S) * 1000
    series = []
    for (name, labels), pts in w["data"].items():
        if dict(labels).get("job") == "c" or name == "ft_old_only":
            continue
        recent = [(t, v) for t, v in pts if t >= cut]
        series.append(((("__name__", name),) + labels, recent))
    st, _, body = pp.remote_write(sluice_url, series)
    assert st == 204, body
    return min(t for _, pts in series for t, _ in pts)


def api(base, path, **params):
    r = requests.get(base + path, params=params, timeout=120)
    return r.status_code, r.json()


def result_map(data):
    """{frozen metric: [(t, value)]} of a vector or matrix result."""
    out = {}
    for s in data["result"]:
        key = frozenset(s["metric"].items())
        assert key not in out, "series %s twice" % s["metric"]
        if "values" in s:
            out[key] = [(float(t), float(v)) for t, v in s["values"]]
        else:
            out[key] = [(float(s["value"][0]), float(s["value"][1]))]
    return out


def assert_same(got, want, what):
    g, w = result_map(got), result_map(want)
    assert set(g) == set(w), "%s: series differ:\n sluice %s\n prom %s" % (what, sorted(map(sorted, g)),
                                                                         sorted(map(sorted, w)))
    for k in w:
        gt, wt = [t for t, _ in g[k]], [t for t, _ in w[k]]
        assert gt == wt, "%s %s: timestamps differ (%d vs %d points): first diff at %s" % (
            what, sorted(k), len(gt), len(wt), next((a, b) for a, b in zip(gt + [None] * 9, wt + [None] * 9)
                                                    if a != b))
        for (t, a), (_, b) in zip(g[k], w[k]):
            assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), (
                "%s %s at %s: sluice %r, prometheus %r" % (what, sorted(k), t, a, b))


RANGE_QUERIES = [
    'ft_requests_total{job!="c"}',
    'rate(ft_requests_total{job!="c"}[5m])',
    'sum by (job) (rate(ft_requests_total{job!="c"}[5m]))',
    'increase(ft_requests_total{job="b"}[10m])',
    "max_over_time(ft_temp[10m])",
    "min_over_time(ft_temp[7m])",
    "avg_over_time(ft_temp[5m])",
    "sum_over_time(ft_temp[3m])",
    'count_over_time(ft_requests_total{job!="c"}[5m])',
    "ft_old_only",
    "ft_temp - ft_temp offset 10m",
]


def check_over_seam(sl_url, w, seam_ms, queries):
    start, end = w["start"] + 1800, w["end"]
    assert start * 1000 < seam_ms < end * 1000, "the seam must fall inside the queried range"
    for q in queries:
        for step in (60, 15):
            st, got = api(sl_url, "/api/v1/query_range", query=q, start=start, end=end, step=step)
            assert st == 200 and got["status"] == "success", (q, got)
            assert not got.get("warnings"), (q, got.get("warnings"))
            _, want = api(w["prom"].url, "/api/v1/query_range", query=q, start=start, end=end, step=step)
            assert want["data"]["result"], "the reference answered nothing for " + q
            assert_same(got["data"], want["data"], "%s step %d" % (q, step))
    # Instant queries whose windows straddle the seam, vector and matrix results.
    seam = seam_ms / 1000
    for q, at in (('rate(ft_requests_total{job!="c"}[10m])', seam + 120), ("ft_temp[20m]", seam + 300),
                  ('ft_requests_total{job!="c"}[4m]', seam + 60), ("avg_over_time(ft_temp[30m])", seam + 600),
                  ("ft_temp", seam - 1), ("ft_temp", seam + 7.5)):
        st, got = api(sl_url, "/api/v1/query", query=q, time=at)
        assert st == 200 and got["status"] == "success", (q, got)
        _, want = api(w["prom"].url, "/api/v1/query", query=q, time=at)
        assert want["data"]["result"], "the reference answered nothing for " + q
        assert_same(got["data"], want["data"], "instant %s @%s" % (q, at))


def test_fall_through_matches_prometheus_streamed(world, start_sluice):
    w = world
    sl = start_sluice("--retention.raw=1h", "--storage.rollups=1m:2h", "--log.level=debug",
                      "--remote-read.url=%s/api/v1/read name=central" % w["prom"].url)
    seam = load_recent(sl.url, w)
    check_over_seam(sl.url, w, seam, RANGE_QUERIES)

    # Default mode: the remote is read only before the seam; job c (only in Prometheus) ends there.
    st, got = api(sl.url, "/api/v1/query_range", query='ft_requests_total{job="c"}', start=w["start"],
                  end=w["end"], step=60)
    assert st == 200
    pts = got["data"]["result"][0]["values"]
    assert pts and max(float(t) for t, _ in pts) * 1000 < seam + 5 * 60 * 1000  # lookback after the seam only
    # A query within what sluice holds never asks the remote: job c is not there.
    st, got = api(sl.url, "/api/v1/query", query='ft_requests_total{job="c"}', time=w["end"])
    assert st == 200 and got["data"]["result"] == []

    # Series and label values over the seam include what only the remote has.
    st, got = api(sl.url, "/api/v1/series", **{"match[]": "ft_old_only", "start": w["start"], "end": w["end"]})
    assert st == 200 and got["data"] == [{"__name__": "ft_old_only", "job": "a"}], got
    st, got = api(sl.url, "/api/v1/label/job/values", start=w["start"], end=w["end"])
    assert st == 200 and got["data"] == ["a", "b", "c"], got
    st, got = api(sl.url, "/api/v1/label/job/values", start=seam / 1000 + 60, end=w["end"])
    assert st == 200 and got["data"] == ["a", "b"], got
    # Prometheus answered in chunks (the decoder this test proves); never in SAMPLES here.
    log = sl.read_log()
    assert "response_type=STREAMED_XOR_CHUNKS" in log and "response_type=SAMPLES" not in log, log[-3000:]


def test_fall_through_read_recent_samples(world, start_sluice):
    w = world
    sl = start_sluice("--retention.raw=1h", "--storage.rollups=1m:2h", "--remote-read.read-recent", "--log.level=debug",
                      "--remote-read.url=%s/api/v1/read response-type=samples" % w["prom"].url)
    seam = load_recent(sl.url, w)
    # Everything, job c included, equals Prometheus: merged by timestamp without duplicates.
    check_over_seam(sl.url, w, seam, RANGE_QUERIES + ["ft_requests_total", "sum by (job) (rate(ft_requests_total[5m]))"])
    st, got = api(sl.url, "/api/v1/query_range", query='ft_requests_total{job="c"}', start=w["end"] - 600,
                  end=w["end"], step=15)
    _, want = api(w["prom"].url, "/api/v1/query_range", query='ft_requests_total{job="c"}', start=w["end"] - 600,
                  end=w["end"], step=15)
    assert st == 200 and want["data"]["result"]
    assert_same(got["data"], want["data"], "read_recent job c")
    log = sl.read_log()
    assert "response_type=SAMPLES" in log and "response_type=STREAMED_XOR_CHUNKS" not in log, log[-3000:]


def test_remote_down_warn_and_fail(world, start_sluice):
    w = world
    dead = "http://127.0.0.1:%d/api/v1/read" % free_port()
    warn = start_sluice("--retention.raw=1h", "--remote-read.url=%s name=gone" % dead, "--remote-read.timeout=5s")
    fail = start_sluice("--retention.raw=1h", "--remote-read.url=%s name=gone" % dead, "--remote-read.on-error=fail")
    bad = start_sluice("--retention.raw=1h", "--remote-read.url=%s/api/v1/nothing-here" % w["prom"].url,
                       "--remote-read.on-error=fail")
    seam = load_recent(warn.url, w)
    load_recent(fail.url, w)
    load_recent(bad.url, w)
    params = dict(query="ft_temp", start=w["start"], end=w["end"], step=60)

    st, got = api(warn.url, "/api/v1/query_range", **params)
    assert st == 200 and got["status"] == "success", got
    assert got["warnings"] and "gone" in got["warnings"][0] and "partial response" in got["warnings"][0], got
    pts = got["data"]["result"][0]["values"]
    assert min(float(t) for t, _ in pts) * 1000 >= seam  # only what sluice holds
    # Within what sluice holds the remote is not asked: no warning.
    st, got = api(warn.url, "/api/v1/query", query="ft_temp", time=w["end"])
    assert st == 200 and not got.get("warnings") and got["data"]["result"], got

    st, got = api(fail.url, "/api/v1/query_range", **params)
    assert st == 503 and got["status"] == "error" and got["errorType"] == "unavailable", got
    assert "gone" in got["error"], got
    st, got = api(fail.url, "/api/v1/series", **{"match[]": "ft_temp", "start": w["start"], "end": w["end"]})
    assert st == 503 and got["errorType"] == "unavailable", got
    st, got = api(fail.url, "/api/v1/query", query="ft_temp", time=w["end"])
    assert st == 200 and got["data"]["result"], got  # local-only queries are unaffected

    st, got = api(bad.url, "/api/v1/query_range", **params)
    assert st == 422 and got["errorType"] == "execution" and "404" in got["error"], got
    # The daemon says which remote failed.
    assert "remote read failed" in warn.read_log()


# ---- the store over TLS and mTLS (docs/deploy.md, "Client: https:// targets") --------------------


@pytest.fixture(scope="module")
def tls_stores(world, pki, tmp_path_factory):
    """Two more Prometheus with the world's data (backfilled again), serving over TLS with the test
    CA's server certificate: "tls" without client certificates, "mtls" requiring one from the CA."""
    stores = {}
    client_auth = {"client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": pki["ca.crt"]}
    for kind, host, extra, cert in (("tls", "127.0.0.1", {}, None),
                                    ("mtls", "localhost", client_auth, (pki["client.crt"], pki["client.key"]))):
        d = str(tmp_path_factory.mktemp("fallthrough-" + kind))
        tsdb = os.path.join(d, "tsdb")
        backfill(tsdb, world["data"], d)
        web = os.path.join(d, "web.yml")
        write_web_config(web, tls={"cert_file": pki["server.crt"], "key_file": pki["server.key"], **extra})
        stores[kind] = Prom(d, tsdb, web_config=web, host=host, client={"verify": pki["ca.crt"], "cert": cert})
        stores[kind].wait_blocks(world["start"])
    # the mTLS store really refuses a client without a certificate
    with pytest.raises(requests.exceptions.ConnectionError):  # SSLError, or a reset
        requests.get(stores["mtls"].url + "/-/ready", verify=pki["ca.crt"], timeout=10).raise_for_status()
    yield stores
    for p in stores.values():
        p.stop()


TLS_QUERIES = RANGE_QUERIES[:3] + ["max_over_time(ft_temp[10m])", "ft_old_only"]


def test_fall_through_over_tls_and_mtls(world, tls_stores, pki, start_sluice):
    """Over TLS and mTLS sluice answers over the seam exactly what the plain-HTTP reference does."""
    w = world
    # TLS, verified against the flag's CA by the certificate's IP SAN (the URL names 127.0.0.1)
    tls = start_sluice("--retention.raw=1h", "--log.level=debug", "--remote-read.tls-ca-file=" + pki["ca.crt"],
                       "--remote-read.url=%s/api/v1/read name=tls" % tls_stores["tls"].url)
    # mTLS with the flags' CA and client certificate, by DNS name (localhost)
    mtls = start_sluice("--retention.raw=1h", "--log.level=debug", "--remote-read.tls-ca-file=" + pki["ca.crt"],
                        "--remote-read.tls-cert-file=" + pki["client.crt"],
                        "--remote-read.tls-key-file=" + pki["client.key"],
                        "--remote-read.url=%s/api/v1/read name=mtls" % tls_stores["mtls"].url)
    # mTLS from per-URL options overriding flags that would fail (wrong CA, no certificate), the
    # certificate checked for the configured server name rather than the URL's IP; SAMPLES answers
    port = tls_stores["mtls"].port
    override = start_sluice(
        "--retention.raw=1h", "--log.level=debug", "--remote-read.tls-ca-file=" + pki["evil-ca.crt"],
        "--remote-read.url=https://127.0.0.1:%d/api/v1/read name=override response-type=samples "
        "tls-ca-file=%s tls-cert-file=%s tls-key-file=%s tls-server-name=localhost"
        % (port, pki["ca.crt"], pki["client.crt"], pki["client.key"]))
    for sl, name in ((tls, "tls"), (mtls, "mtls"), (override, "override")):
        seam = load_recent(sl.url, w)
        check_over_seam(sl.url, w, seam, TLS_QUERIES)
        assert 'msg="remote read answered" remote_name=%s ' % name in sl.read_log(), sl.read_log()[-3000:]


def test_fall_through_tls_refused(world, tls_stores, pki, start_sluice):
    """Stores whose certificate cannot be trusted, or that want a certificate sluice does not
    send, are refused in the handshake: a warning naming the store (warn) or 503 (fail), and a
    clear log line; the stores that can be trusted still answer."""
    w = world
    tp, mp = tls_stores["tls"].port, tls_stores["mtls"].port
    read = "--remote-read.url=https://%s:%d/api/v1/read name=%s %s"
    warn = start_sluice(
        "--retention.raw=1h", "--remote-read.tls-ca-file=" + pki["ca.crt"],
        "--remote-read.tls-cert-file=" + pki["client.crt"], "--remote-read.tls-key-file=" + pki["client.key"],
        read % ("127.0.0.1", tp, "untrusted", "tls-ca-file=" + pki["evil-ca.crt"]),
        read % ("127.0.0.1", tp, "wronghost", "tls-server-name=elsewhere.example"),
        read % ("localhost", mp, "nocert", "tls-cert-file= tls-key-file="),
        read % ("localhost", mp, "good", ""),
        # verification off: the untrusted CA is accepted (and that is logged at start)
        read % ("127.0.0.1", tp, "insecure", "tls-ca-file=%s tls-insecure-skip-verify=true" % pki["evil-ca.crt"]))
    # no CA configured: the system store, which does not know the test CA
    fail = start_sluice("--retention.raw=1h", "--remote-read.on-error=fail",
                        read % ("127.0.0.1", tp, "system", ""))
    seam = load_recent(warn.url, w)
    load_recent(fail.url, w)
    start, end = w["start"] + 1800, w["end"]
    assert start * 1000 < seam
    q = dict(query="ft_temp", start=start, end=end, step=60)

    st, got = api(warn.url, "/api/v1/query_range", **q)
    assert st == 200 and got["status"] == "success", got
    expected = {
        "untrusted": "TLS handshake failed: certificate verify failed (unable to get local issuer certificate)",
        "wronghost": "TLS handshake failed: certificate verify failed (hostname mismatch)",
        "nocert": "(the server asked for a client certificate and none is configured)",
    }
    warnings = got.get("warnings") or []
    for name, msg in expected.items():
        assert any(x.startswith("remote read %s: " % name) and msg in x and "partial response" in x
                   for x in warnings), (name, warnings)
    assert len(set(warnings)) == 3, warnings
    _, want = api(w["prom"].url, "/api/v1/query_range", **q)
    assert_same(got["data"], want["data"], "warn mode with good stores")  # good and insecure answered

    log = warn.read_log()
    for name, msg in expected.items():
        assert re.search(r'msg="remote read failed" remote_name=%s err="[^"]*%s' % (name, re.escape(msg)), log), (
            name, log[-4000:])
    assert re.search(r'level=warn .*TLS certificate verification is off for this target.* remote_name=insecure', log)

    st, got = api(fail.url, "/api/v1/query_range", **q)
    assert st == 503 and got["errorType"] == "unavailable", got
    assert "system" in got["error"] and "certificate verify failed (unable to get local issuer certificate)" in \
        got["error"], got


def test_remote_read_tls_startup_errors(pki, start_sluice):
    """Bad TLS settings stop sluice at start with a message naming the problem."""
    url = "--remote-read.url=https://127.0.0.1:9/api/v1/read"
    cases = [
        (["--remote-read.tls-ca-file=/nonexistent/ca.crt", url], "cannot load CA file /nonexistent/ca.crt"),
        ([url + " tls-cert-file=" + pki["client.crt"]], "needs both a cert file and a key file"),
        ([url + " tls-cert-file=%s tls-key-file=%s" % (pki["client.crt"], pki["server.key"])], "does not match"),
        ([url + " tls-insecure-skip-verify=yes"], "tls-insecure-skip-verify must be true or false"),
        (["--remote-read.url=http://127.0.0.1:9/api/v1/read tls-ca-file=" + pki["ca.crt"]],
         "tls-* options need an https:// URL"),
    ]
    for args, msg in cases:
        sl = start_sluice(*args, wait=False)
        rc = sl.proc.wait(timeout=60)
        log = sl.read_log()
        assert rc != 0 and msg in log and "--remote-read.url" in log, (args, rc, log[-2000:])
