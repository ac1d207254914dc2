"""GET /federate against real Prometheus 2.42 (api/federate.c, docs/operations.md "Federation").

- differential: the same samples remote-written into sluice and into a real Prometheus; both
  /federate answers compared (text and protobuf, errors included);
- a real Prometheus scrapes sluice's /federate (honor_labels: true, and a second job without it)
  and must then hold exactly the series, values and timestamps sluice has;
- bounds: --query.max-samples, --query.max-memory-per-query, POST forms, a large streamed answer.
"""
# ctest-labels: peer
import math
import os
import shutil
import signal
import subprocess
import tempfile
import time

import requests

import promproto as pp
from conftest import PROMETHEUS, free_port, prometheus_beside_sluice

STALE = pp.bits2f(0x7ff0000000000002)
PROTO_ACCEPT = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,"
                "text/plain;version=0.0.4;q=0.3")


def write(url, series):
    st, _, body = pp.remote_write(url, series)
    assert st in (200, 204), body


def dataset(now):
    """Series chosen to reach every rule of the format: special values, escaping, label order
    (an upper-case label name sorts before __name__), instance present or not, a sample older
    than the lookback, a series ending in a staleness marker, a name shared by many series."""
    s = [
        ([("__name__", "zeta"), ("job", "j1"), ("instance", "i1")], [(now - 20000, 1.5), (now - 10000, 2.5)]),
        ([("__name__", "alpha"), ("job", "j1")], [(now - 10000, 1e21)]),
        ([("__name__", "alpha"), ("job", "j2"), ("a", 'x"y\\z\nw')], [(now - 10000, math.nan)]),
        ([("__name__", "alpha"), ("Zed", "1")], [(now - 10000, math.inf)]),
        ([("__name__", "alpha"), ("job", "j3")], [(now - 10000, -math.inf)]),
        ([("__name__", "old"), ("job", "j1")], [(now - 400000, 3)]),
        ([("__name__", "mid"), ("job", "j1")], [(now - 200000, -0.0000001)]),
        ([("__name__", "gone"), ("job", "j1")], [(now - 20000, 5), (now - 10000, STALE)]),
        ([("__name__", "big"), ("job", "j1"), ("le", "ç ü")], [(now - 10000, 123456789012)]),
        ([("__name__", "int"), ("job", "j1")], [(now - 30000, 0.1), (now - 5000, 42)]),
    ]
    for i in range(40):  # one family large enough that its order is not an accident
        s.append(([("__name__", "many"), ("job", "j%d" % (i % 3)), ("k", "%03d" % (39 - i))],
                  [(now - 15000, float(i))]))
    return s


def federate(url, params, headers=None, method="GET"):
    if method == "GET":
        return requests.get(url + "/federate", params=params, headers=headers or {}, timeout=60)
    return requests.post(url + "/federate", data=params, headers=headers or {}, timeout=60)


def families(text):
    """Text exposition -> [(name, sorted lines)]: family order and each family's series, which is
    what Prometheus fixes (it sorts by metric name only, with an unstable sort)."""
    out = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            out.append((line, []))
        else:
            assert out, text
            out[-1][1].append(line)
    return [(t, sorted(lines)) for t, lines in out]


def proto_families(data):
    """Delimited MetricFamily stream -> [(name, type, sorted [(labels, value bits, ts)])]."""
    out, pos = [], 0
    while pos < len(data):
        n, pos = pp.read_uvarint(data, pos)
        msg, pos = data[pos:pos + n], pos + n
        name, typ, metrics = None, None, []
        for f, _, v in pp.parse(msg):
            if f == 1:
                name = v.decode()
            elif f == 3:
                typ = v
            elif f == 4:
                labels, val, ts = [], None, None
                for mf, _, mv in pp.parse(v):
                    if mf == 1:
                        lp = {lf: lv for lf, _, lv in pp.parse(mv)}
                        labels.append((lp.get(1, b"").decode(), lp.get(2, b"").decode()))
                    elif mf == 5:
                        val = {uf: uv for uf, _, uv in pp.parse(mv)}.get(1)
                    elif mf == 6:
                        ts = mv
                metrics.append((tuple(labels), val, ts))
        out.append((name, typ, sorted(metrics)))
    return out


def test_federate_matches_prometheus():
    with prometheus_beside_sluice("fed-diff-") as (prom, sl):
        now = int(time.time() * 1000)
        data = dataset(now)
        write(prom, data)
        write(sl.url, data)
        cases = [
            ['{__name__=~".+"}'],
            ['{job="j1"}', "alpha"],                 # a union with overlap: each series once
            ["alpha", "alpha", '{__name__="alpha"}'],  # the same series three times
            ['{a=""}'],                               # every series without a (a matcher matching empty)
            ["{}"], ['{__name__=""}'],                # no matcher / nameless: nothing
            ['many{k=~"00.|03."}', "zeta", "nothing_here"],
            ["gone"], ["old"], ["mid"],
        ]
        for match in cases:
            a, b = federate(prom, {"match[]": match}), federate(sl.url, {"match[]": match})
            assert (a.status_code, a.headers["Content-Type"]) == (b.status_code, b.headers["Content-Type"]), match
            # requests asks for gzip, as a scraping Prometheus does
            assert a.headers.get("Content-Encoding") == b.headers.get("Content-Encoding") == "gzip", match
            assert families(b.text) == families(a.text), (match, a.text, b.text)
            pa = federate(prom, {"match[]": match}, {"Accept": PROTO_ACCEPT})
            pb = federate(sl.url, {"match[]": match}, {"Accept": PROTO_ACCEPT})
            assert pb.headers["Content-Type"] == pa.headers["Content-Type"], match
            assert proto_families(pb.content) == proto_families(pa.content), match
        # what the text looks like (and that sluice's family order is label order, stable)
        body = federate(sl.url, {"match[]": ["alpha", "zeta", "gone"]}).text
        assert body == ('# TYPE alpha untyped\n'
                        'alpha{Zed="1",instance=""} +Inf %d\n'
                        'alpha{a="x\\"y\\\\z\\nw",job="j2",instance=""} NaN %d\n'
                        'alpha{job="j1",instance=""} 1e+21 %d\n'
                        'alpha{job="j3",instance=""} -Inf %d\n'
                        '# TYPE zeta untyped\n'
                        'zeta{instance="i1",job="j1"} 2.5 %d\n' % ((now - 10000,) * 5))
        # errors: the status, content type and message of Prometheus
        for params in ({"match[]": "alpha{"}, {"match[]": "zeta[5m]"}, {"match[]": "rate(zeta[5m])"},
                       {"match[]": ["zeta", "{"]}, {}, {"other": "x"}):
            a, b = federate(prom, params), federate(sl.url, params)
            assert (b.status_code, b.text) == (a.status_code, a.text), params
            assert b.headers["Content-Type"] == a.headers["Content-Type"], params


def test_federate_large_answer_is_streamed_and_equal():
    """More than one 64 KiB piece: the chunked path, compared with Prometheus line for line."""
    with prometheus_beside_sluice("fed-big-") as (prom, sl):
        now = int(time.time() * 1000)
        series = [([("__name__", "wide_%d" % (i % 7)), ("job", "flink"), ("task", "t%05d" % i),
                    ("pad", "p" * 40)], [(now - 5000, i * 0.5)]) for i in range(6000)]
        for k in range(0, len(series), 1000):
            write(prom, series[k:k + 1000])
            write(sl.url, series[k:k + 1000])
        a = federate(prom, {"match[]": '{job="flink"}'})
        b = federate(sl.url, {"match[]": '{job="flink"}'})
        assert b.status_code == 200 and len(b.content) > 4 * 65536
        assert b.headers.get("Transfer-Encoding") == "chunked" and b.headers["Content-Encoding"] == "gzip"
        assert families(b.text) == families(a.text)
        plain = federate(sl.url, {"match[]": '{job="flink"}'}, {"Accept-Encoding": "identity"})
        assert "Content-Encoding" not in plain.headers and plain.text == b.text
        pa = federate(prom, {"match[]": '{job="flink"}'}, {"Accept": PROTO_ACCEPT})
        pb = federate(sl.url, {"match[]": '{job="flink"}'}, {"Accept": PROTO_ACCEPT})
        assert proto_families(pb.content) == proto_families(pa.content)
        own = [l for l in b.text.splitlines() if not l.startswith("#")]
        names = [l.split("{")[0] for l in own]
        assert names == sorted(names)


def test_federate_bounds_and_forms(start_sluice):
    s = start_sluice("--query.max-samples=100")
    now = int(time.time() * 1000)
    write(s.url, [([("__name__", "m%d" % (i % 3)), ("i", str(i))], [(now - 1000, i)]) for i in range(150)])
    r = federate(s.url, {"match[]": "m0"})
    assert r.status_code == 200 and len(r.text.splitlines()) == 51
    r = federate(s.url, {"match[]": '{__name__=~".+"}'})
    assert r.status_code == 422 and r.text == "federation would hold more than 100 series (--query.max-samples)\n"
    # POST with a form body, as GET
    r = federate(s.url, {"match[]": ["m1", 'm2{i="2"}']}, method="POST")
    assert r.status_code == 200 and r.text == federate(s.url, {"match[]": ["m1", 'm2{i="2"}']}).text
    assert 'm2{i="2",instance=""} 2 %d' % (now - 1000) in r.text
    # the failures are counted
    m = requests.get(s.url + "/metrics").text
    assert "sluice_federate_refused_total 1" in m and "sluice_federate_requests_total 4" in m

    t = start_sluice("--query.max-memory-per-query=64KiB")
    write(t.url, [([("__name__", "wide"), ("i", "%06d" % i), ("pad", "x" * 100)], [(now - 1000, i)])
                  for i in range(2000)])
    r = federate(t.url, {"match[]": "wide"})
    assert r.status_code == 422
    assert r.text == "federation would use more than 65536 bytes of memory (--query.max-memory-per-query)\n"
    assert federate(t.url, {"match[]": 'wide{i="000007"}'}).status_code == 200
    # the refused request gave its memory back: a small one still fits, again and again
    for _ in range(3):
        assert federate(t.url, {"match[]": 'wide{i=~"00000."}'}).status_code == 200


def test_federate_clients_that_go_away(start_sluice):
    """Clients that close at once (while the read runs) or after a few bytes of a streamed answer
    (mid-stream) leave nothing behind: sluice answers the next one and exits cleanly (ASan)."""
    import socket
    s = start_sluice()
    now = int(time.time() * 1000)
    for k in range(0, 6000, 1000):
        write(s.url, [([("__name__", "wide"), ("i", "%06d" % i), ("pad", "x" * 60)], [(now - 1000, i)])
                      for i in range(k, k + 1000)])
    req = ("GET /federate?match[]=wide HTTP/1.1\r\nHost: x\r\nAccept-Encoding: identity\r\n\r\n").encode()
    for read_first in (0, 0, 2000, 70000, 2000):
        c = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        c.sendall(req)
        got = b""
        while len(got) < read_first:
            chunk = c.recv(65536)
            if not chunk:
                break
            got += chunk
        if read_first:
            assert got.startswith(b"HTTP/1.1 200") and b"chunked" in got.split(b"\r\n\r\n")[0].lower()
        c.close()
    r = federate(s.url, {"match[]": "wide"})
    assert r.status_code == 200 and len(r.text.splitlines()) == 6001


def test_federate_external_labels(start_sluice):
    s = start_sluice("--external-label=region=eu", "--external-label=instance=sluice-1")
    now = int(time.time() * 1000)
    write(s.url, [([("__name__", "x"), ("job", "a")], [(now - 1000, 1)]),
                  ([("__name__", "x"), ("job", "b"), ("region", "us"), ("instance", "h:1")], [(now - 1000, 2)])])
    assert federate(s.url, {"match[]": "x"}).text == (
        '# TYPE x untyped\n'
        'x{instance="h:1",job="b",region="us"} 2 %d\n'
        'x{job="a",instance="sluice-1",region="eu"} 1 %d\n' % (now - 1000, now - 1000))


# --- a real Prometheus scrapes sluice's /federate ---------------------------------------------------

def start_prometheus(d, config):
    port = free_port()
    cfg = os.path.join(d, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write(config)
    log = open(os.path.join(d, "prometheus.log"), "wb")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={d}/prom",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            if requests.get(url + "/-/ready", timeout=1).status_code == 200:
                return proc, log, url
        except requests.RequestException:
            pass
        if time.time() > deadline or proc.poll() is not None:
            raise RuntimeError("prometheus did not start")
        time.sleep(0.1)


def instant(url, query):
    r = requests.get(url + "/api/v1/query", params={"query": query}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["data"]["result"]


def as_set(result, drop=()):
    return {(tuple(sorted((k, v) for k, v in x["metric"].items() if k not in drop)), x["value"][1])
            for x in result}


def unexport(m):
    """A sample's labels as sluice had them: the scrape's job/instance dropped, exported_* back."""
    out = {k: v for k, v in m.items() if k not in ("job", "instance")}
    for k in ("job", "instance"):
        if "exported_" + k in out:
            out[k] = out.pop("exported_" + k)
    return out


def test_prometheus_scrapes_sluice_federate(start_sluice):
    s = start_sluice()
    now = int(time.time() * 1000)
    # Flink-style series: job/instance labels of the pushing side, plus one without instance
    series = []
    for tm in range(3):
        for op in ("Source", "Sink"):
            series.append(([("__name__", "flink_taskmanager_job_task_numRecordsIn"), ("job", "flink"),
                            ("instance", "tm-%d:9249" % tm), ("task_name", op), ("job_name", "orders")],
                           [(now - 20000, 100.0 * tm), (now - 2000, 100.0 * tm + (7 if op == "Sink" else 3))]))
    series.append(([("__name__", "flink_jobmanager_numRunningJobs"), ("job", "flink")], [(now - 2000, 2)]))
    series.append(([("__name__", "other_metric"), ("job", "other")], [(now - 2000, 9)]))
    series.append(([("__name__", "flink_ended"), ("job", "flink")], [(now - 9000, 1), (now - 2000, STALE)]))
    write(s.url, series)
    # push through the Pushgateway API too: its series carry sluice's grouping labels
    r = requests.put(s.url + "/metrics/job/flink/instance/tm-9", data="flink_pushed_gauge 5\n")
    assert r.status_code == 200, r.text

    target = s.url.split("//")[1]
    d = tempfile.mkdtemp(prefix="fed-scrape-")
    config = f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: federate
    honor_labels: true
    metrics_path: /federate
    params:
      'match[]': ['{{job="flink",__name__!~"sluice_.+"}}']
    static_configs:
      - targets: ['{target}']
  - job_name: federate_plain
    metrics_path: /federate
    params:
      'match[]': ['{{__name__=~"flink_taskmanager_.+"}}', 'flink_jobmanager_numRunningJobs']
    static_configs:
      - targets: ['{target}']
"""
    proc, log, prom = start_prometheus(d, config)
    try:
        # sluice's own heartbeat series (sluice_push_*, sluice_job_*) carry the group's job label
        # and change every few seconds: left out of the comparison
        sel = '{job="flink",__name__!~"sluice_.+"}'
        want = instant(s.url, sel)
        want_ts = instant(s.url, f'timestamp({sel})')
        assert len(want) == 8 and not any(x["metric"]["__name__"] == "flink_ended" for x in want)
        # wait until Prometheus has scraped both jobs successfully
        deadline = time.time() + 60
        while time.time() < deadline:
            up = {x["metric"]["job"]: x["value"][1] for x in instant(prom, "up")}
            if up == {"federate": "1", "federate_plain": "1"}:
                break
            time.sleep(0.2)
        assert up == {"federate": "1", "federate_plain": "1"}, up

        # honor_labels: true — exactly sluice's series (its job/instance kept), values and timestamps
        got = instant(prom, sel)
        assert as_set(got) == as_set(want)
        assert as_set(instant(prom, f'timestamp({sel})')) == as_set(want_ts)
        # a series sluice holds without instance stays without it (federation sends instance="")
        assert instant(prom, 'flink_jobmanager_numRunningJobs{job="flink"}')[0]["metric"] == {
            "__name__": "flink_jobmanager_numRunningJobs", "job": "flink"}
        # nothing the match[] did not select, nothing stale
        assert instant(prom, 'other_metric') == [] and instant(prom, "flink_ended") == []

        # without honor_labels: the scrape's own job/instance win, sluice's become exported_*
        plain = instant(prom, '{job="federate_plain",__name__!="up",__name__!~"scrape_.+"}')
        assert len(plain) == 7
        for x in plain:
            m = x["metric"]
            assert m["instance"] == target and m["exported_job"] == "flink"
            name = m["__name__"]
            if name == "flink_jobmanager_numRunningJobs":
                assert "exported_instance" not in m  # sluice sent instance="": nothing to export
            else:
                assert m["exported_instance"].startswith("tm-")
        renamed = {(tuple(sorted(unexport(x["metric"]).items())), x["value"][1]) for x in plain}
        want_plain = as_set([x for x in want if x["metric"]["__name__"] != "flink_pushed_gauge"])
        assert renamed == want_plain
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()
        shutil.rmtree(d, ignore_errors=True)
