"""Push ingest with real clients: Debian's python3-prometheus-client and Flink-shaped bodies from
the flink_gen tool; history lands in storage; groups expire and survive restarts."""
import base64
import os
import re
import subprocess
import time

import requests
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary
from prometheus_client.exposition import delete_from_gateway, push_to_gateway, pushadd_to_gateway

TOOLS = os.environ.get("SLUICE_TOOLS_DIR", os.path.join(os.path.dirname(__file__), "../../build/tests/tools"))


def groups(s):
    return requests.get(s.url + "/api/v1/metrics").json()["data"]


def group(s, **labels):
    for g in groups(s):
        if g["labels"] == labels:
            return g
    return None


def tsdb_series(s):
    return requests.get(s.url + "/api/v1/status/tsdb").json()["data"]["headStats"]["numSeries"]


def test_python_client_push_pushadd_delete(sluice):
    gw = sluice.url.replace("http://", "")
    reg = CollectorRegistry()
    g = Gauge("job_last_success_unixtime", "Last time a batch job successfully finished", registry=reg)
    g.set(1234.5)
    c = Counter("records_processed", "Records", ["table"], registry=reg)
    c.labels("orders").inc(7)
    h = Histogram("latency_seconds", "Latency", registry=reg, buckets=(0.1, 1.0))
    h.observe(0.5)
    sm = Summary("size_bytes", "Sizes", registry=reg)
    sm.observe(10)
    key = {"instance": "host/with/slashes", "pipeline": "a/b"}
    push_to_gateway(gw, job="batch/job", registry=reg, grouping_key=key)
    grp = group(sluice, job="batch/job", instance="host/with/slashes", pipeline="a/b")
    assert grp is not None, groups(sluice)
    assert grp["last_push_successful"] is True
    assert grp["job_last_success_unixtime"]["metrics"][0]["value"] == "1234.5"
    assert grp["records_processed_total"]["type"] == "COUNTER"
    assert grp["latency_seconds"]["metrics"][0]["buckets"]["1"] == "1"
    text = requests.get(sluice.url + "/metrics").text
    assert 'job_last_success_unixtime{instance="host/with/slashes",job="batch/job",pipeline="a/b"} 1234.5' in text

    reg2 = CollectorRegistry()
    Gauge("extra_gauge", "added by pushadd", registry=reg2).set(3)
    pushadd_to_gateway(gw, job="batch/job", registry=reg2, grouping_key=key)
    grp = group(sluice, job="batch/job", instance="host/with/slashes", pipeline="a/b")
    assert "extra_gauge" in grp and "job_last_success_unixtime" in grp  # POST keeps the rest

    push_to_gateway(gw, job="batch/job", registry=reg2, grouping_key=key)
    grp = group(sluice, job="batch/job", instance="host/with/slashes", pipeline="a/b")
    assert "extra_gauge" in grp and "job_last_success_unixtime" not in grp  # PUT replaces

    delete_from_gateway(gw, job="batch/job", grouping_key=key)
    assert group(sluice, job="batch/job", instance="host/with/slashes", pipeline="a/b") is None
    # History stays in storage (series were created, and staleness markers were written).
    assert tsdb_series(sluice) >= 5


def flink_body(tm, tick, seed=7):
    return subprocess.run([os.path.join(TOOLS, "flink_gen"), "1", str(seed), str(tick), str(tm)],
                          capture_output=True, check=True).stdout


def test_flink_shaped_pushes(sluice):
    body = flink_body(0, 1)
    assert len(body) > 100000
    lines = [l for l in body.decode().splitlines() if l and not l.startswith("#")]
    r = requests.put(sluice.url + "/metrics/job/flink-tm-0", data=body,
                     headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
    assert r.status_code == 200, r.text
    text = requests.get(sluice.url + "/metrics").text
    assert "flink_taskmanager_job_task_operator_numRecordsIn{" in text
    assert "# TYPE flink_taskmanager_job_task_operator_numRecordsIn gauge" in text
    assert tsdb_series(sluice) >= len(lines)
    # A second report a second later replaces the first; both are history.
    time.sleep(1.1)
    r = requests.put(sluice.url + "/metrics/job/flink-tm-0", data=flink_body(0, 2))
    assert r.status_code == 200
    m = requests.get(sluice.url + "/metrics").text
    assert re.search(r"^sluice_push_pushes_total 2$", m, re.M)
    # Both reports are history, visible to PromQL.
    q = requests.post(sluice.url + "/api/v1/query", data={
        "query": 'count_over_time(flink_taskmanager_job_task_operator_numRecordsIn{job="flink-tm-0"}[1m])'}).json()
    assert q["status"] == "success" and q["data"]["resultType"] == "vector"
    assert q["data"]["result"], q
    assert all(r["value"][1] == "2" for r in q["data"]["result"]), q["data"]["result"][:3]


def test_bad_bodies_change_nothing(sluice):
    r = requests.put(sluice.url + "/metrics/job/x", data="ok 1\n")
    assert r.status_code == 200
    before = requests.get(sluice.url + "/api/v1/metrics").json()["data"]
    series_before = tsdb_series(sluice)
    import random
    rnd = random.Random(42)
    base = b'# TYPE ok gauge\nok{a="1",b="2"} 1\nother_metric{x="y"} 2.5\n'
    for i in range(300):
        b = bytearray(base)
        for _ in range(rnd.randint(1, 4)):
            op = rnd.randint(0, 2)
            pos = rnd.randrange(len(b))
            if op == 0:
                b[pos] = rnd.randrange(256)
            elif op == 1:
                del b[pos]
            else:
                b.insert(pos, rnd.choice(b'{}="\\\n #,'))
        r = requests.put(sluice.url + "/metrics/job/fuzz", data=bytes(b))
        assert r.status_code in (200, 400), (r.status_code, bytes(b))
        if r.status_code == 400:
            assert r.text.strip()
    # Garbage gzip and protobuf bodies are refused too.
    assert requests.put(sluice.url + "/metrics/job/fz", data=b"\x1f\x8b garbage",
                        headers={"Content-Encoding": "gzip"}).status_code == 400
    assert requests.put(sluice.url + "/metrics/job/fz", data=b"\xff\xff\xff\x0f",
                        headers={"Content-Type": "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"}).status_code == 400
    g = group(sluice, job="x")
    assert g == [x for x in before if x["labels"] == {"job": "x"}][0]
    assert requests.get(sluice.url + "/-/healthy").status_code == 200


def test_invalid_utf8_in_path_is_400_and_stores_nothing(sluice):
    """Label values and job names from the path must be UTF-8, as the Pushgateway's are (it
    answers 400 too): percent-encoded or base64-encoded bytes that are not UTF-8 are refused."""
    bad = ["/metrics/job/u/a/%ff", "/metrics/job/u%fe", "/metrics/job/u/a/%c0%80",
           "/metrics/job/u/a@base64/" + base64.urlsafe_b64encode(b"\xff\xfe").decode().rstrip("="),
           "/metrics/job@base64/" + base64.urlsafe_b64encode(b"\xed\xa0\x80").decode()]
    for path in bad:
        r = requests.put(sluice.url + path, data="m 1\n")
        assert r.status_code == 400 and "UTF-8" in r.text, (path, r.status_code, r.text)
    assert groups(sluice) == []
    r = requests.put(sluice.url + "/metrics/job/u/a/%e2%82%ac", data="m 1\n")  # U+20AC is fine
    assert r.status_code == 200, r.text
    assert group(sluice, job="u", a="\u20ac") is not None


def test_group_expiry_leaves_stale_markers(start_sluice):
    s = start_sluice("--push.group-ttl=2s")
    assert requests.put(s.url + "/metrics/job/short", data="ephemeral 1\n").status_code == 200
    assert group(s, job="short") is not None
    deadline = time.time() + 10
    while time.time() < deadline and group(s, job="short") is not None:
        time.sleep(0.2)
    assert group(s, job="short") is None
    assert "ephemeral" not in requests.get(s.url + "/metrics").text
    m = requests.get(s.url + "/metrics").text
    assert re.search(r"^sluice_push_groups_expired_total 1$", m, re.M)


def test_missed_intervals_expiry(start_sluice):
    s = start_sluice("--push.group-missed-intervals=3")
    for _ in range(3):
        assert requests.put(s.url + "/metrics/job/periodic", data="tick 1\n").status_code == 200
        time.sleep(0.5)
    # Pushed every ~0.5 s: three missed intervals later (~1.5 s) the group is gone.
    deadline = time.time() + 10
    while time.time() < deadline and group(s, job="periodic") is not None:
        time.sleep(0.2)
    assert group(s, job="periodic") is None


def test_admin_wipe(start_sluice):
    s = start_sluice()
    assert requests.put(s.url + "/api/v1/admin/wipe").status_code in (404, 405)
    s2 = start_sluice("--web.enable-admin-api")
    requests.put(s2.url + "/metrics/job/w", data="w 1\n")
    assert requests.put(s2.url + "/api/v1/admin/wipe").status_code == 202
    assert groups(s2) == []


def test_status_api(sluice):
    j = requests.get(sluice.url + "/api/v1/status").json()
    assert j["status"] == "success"
    assert "flags" in j["data"] and "build_information" in j["data"]


def test_groups_survive_clean_restart_and_kill9(start_sluice, tmp_path):
    data = str(tmp_path / "data")
    s = start_sluice(data_dir=data)
    body = flink_body(3, 1)
    assert requests.put(s.url + "/metrics/job/tm3", data=body).status_code == 200
    assert requests.put(s.url + "/metrics/job/small/instance/x", data="a 1\nb 2\n").status_code == 200
    assert requests.put(s.url + "/metrics/job/small/instance/x", data="a 5\nb 6\n").status_code == 200  # values only
    assert requests.put(s.url + "/metrics/job/bad", data="x 1 5\n").status_code == 400
    want = {json_key(g): g for g in groups(s)}
    assert s.stop() == 0
    s2 = start_sluice(data_dir=data)
    assert {json_key(g): g for g in groups(s2)} == want
    # Changes after the restart, then kill -9: the WAL brings them back.
    assert requests.put(s2.url + "/metrics/job/small/instance/x", data="a 7\nb 8\n").status_code == 200
    assert requests.delete(s2.url + "/metrics/job/tm3").status_code == 202
    assert requests.put(s2.url + "/metrics/job/new", data="n 1\n").status_code == 200
    want = {json_key(g): g for g in groups(s2)}
    s2.kill9()
    s3 = start_sluice(data_dir=data)
    got = {json_key(g): g for g in groups(s3)}
    assert got == want
    grp = group(s3, job="small", instance="x")
    assert grp["a"]["metrics"][0]["value"] == "7"


def json_key(g):
    import json
    return json.dumps(g["labels"], sort_keys=True)
