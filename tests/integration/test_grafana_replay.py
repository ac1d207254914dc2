"""Grafana replay: the requests Grafana's Prometheus data source sends (PROTOCOLS.md §8), replayed
against sluice with Grafana's headers, asserting on exactly the fields Grafana reads.

Order as Grafana does it: Save & test (health check + buildinfo), data source load (rules,
exemplars probe, metadata), metric browser (label names/values, series), template variables
(label_values(...), query_result(...)), then a dashboard panel (query_range via POST form)."""
import gzip
import json
import re
import time

import pytest
import requests

import promproto

GRAFANA_HEADERS = {"User-Agent": "Grafana/9.5.2", "X-Grafana-Org-Id": "1", "Accept-Encoding": "gzip",
                   "Accept": "application/json, text/plain, */*"}
FORM = {**GRAFANA_HEADERS, "Content-Type": "application/x-www-form-urlencoded"}
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")


@pytest.fixture
def ds(start_sluice):
    """sluice holding Flink-shaped series for the last 10 minutes (10 s apart)."""
    s = start_sluice()
    now = int(time.time())
    t0 = (now - 600) * 1000
    series = []
    for job in ("wordcount", "etl"):
        for sub in range(3):
            base = [("job", job), ("subtask_index", str(sub)), ("task_name", "Source: kafka")]
            series.append(([("__name__", "flink_taskmanager_job_task_numRecordsIn")] + base,
                           [(t0 + i * 10000, float(i * 100 * (sub + 1))) for i in range(61)]))
            series.append(([("__name__", "flink_taskmanager_job_task_backPressuredTimeMsPerSecond")] + base,
                           [(t0 + i * 10000, float((i * 37 + sub * 11) % 1000)) for i in range(61)]))
    st, _, body = promproto.remote_write(s.url, series)
    assert st in (200, 204), body
    s.now = now
    return s


def call(s, method, path, params=None, data=None):
    """Sends like Grafana (gzip accepted) and returns the decoded JSON, checking the envelope."""
    if method == "GET":
        r = requests.get(s.url + path, params=params, headers=GRAFANA_HEADERS, timeout=30, stream=True)
    else:
        r = requests.post(s.url + path, data=data, headers=FORM, timeout=30, stream=True)
    raw = r.raw.read()
    if r.headers.get("Content-Encoding") == "gzip":
        raw = gzip.decompress(raw)
    assert r.headers["Content-Type"].startswith("application/json"), (path, r.headers)
    body = json.loads(raw)
    assert r.status_code == 200 and body["status"] == "success", (path, r.status_code, body)
    assert "warnings" not in body or isinstance(body["warnings"], list)
    return body["data"]


def test_grafana_session(ds):
    s = ds
    start, end = s.now - 3600, s.now

    # Save & test: POST /api/v1/query query=1+1&time=4 must give the scalar [4, "2"]
    d = call(s, "POST", "/api/v1/query", data="query=1%2B1&time=4")
    assert d["resultType"] == "scalar" and d["result"] == [4, "2"]
    d = call(s, "GET", "/api/v1/status/buildinfo")
    assert SEMVER.match(d["version"]), d["version"]
    assert not d.get("features")  # non-empty features would make Grafana treat sluice as Mimir

    # data source load: rules, exemplars probe (start/end in milliseconds!), metadata
    d = call(s, "GET", "/api/v1/rules")
    assert d["groups"] == []
    d = call(s, "GET", "/api/v1/query_exemplars",
             {"query": "flink_taskmanager_job_task_numRecordsIn", "start": str(start * 1000), "end": str(end * 1000)})
    assert d == []
    d = call(s, "GET", "/api/v1/metadata")
    assert isinstance(d, dict)

    # metric browser
    d = call(s, "GET", "/api/v1/label/__name__/values", {"start": str(start), "end": str(end)})
    assert d == ["flink_taskmanager_job_task_backPressuredTimeMsPerSecond", "flink_taskmanager_job_task_numRecordsIn"]
    d = call(s, "GET", "/api/v1/labels", {"match[]": "flink_taskmanager_job_task_numRecordsIn", "start": str(start),
                                          "end": str(end)})
    assert d == ["__name__", "job", "subtask_index", "task_name"]
    d = call(s, "GET", "/api/v1/label/job/values", {"match[]": '{__name__="flink_taskmanager_job_task_numRecordsIn"}',
                                                     "start": str(start), "end": str(end)})
    assert d == ["etl", "wordcount"]
    d = call(s, "GET", "/api/v1/series", {"match[]": '{__name__="flink_taskmanager_job_task_numRecordsIn",job="etl"}',
                                          "start": str(start), "end": str(end), "limit": "40000"})
    assert [x["subtask_index"] for x in d] == ["0", "1", "2"]
    assert all(set(x) == {"__name__", "job", "subtask_index", "task_name"} for x in d)

    # template variables: label_values(job), label_values(metric, subtask_index), query_result(...)
    d = call(s, "GET", "/api/v1/label/job/values", {"start": str(start), "end": str(end)})
    assert d == ["etl", "wordcount"]
    d = call(s, "GET", "/api/v1/series", {"match[]": 'flink_taskmanager_job_task_numRecordsIn{job="wordcount"}',
                                          "start": str(start), "end": str(end)})
    assert sorted(x["subtask_index"] for x in d) == ["0", "1", "2"]
    d = call(s, "POST", "/api/v1/query",
             data=f"query=topk(1%2C+sum+by+(job)+(flink_taskmanager_job_task_numRecordsIn))&time={end}")
    assert d["resultType"] == "vector"
    assert [x["metric"] for x in d["result"]] == [{"job": "etl"}] or [x["metric"] for x in d["result"]] == \
        [{"job": "wordcount"}]

    # a panel: rate by job over the last 10 minutes, step = Grafana's interval, POST form
    q = "sum by (job) (rate(flink_taskmanager_job_task_numRecordsIn[1m]))"
    form = f"query={requests.utils.quote(q)}&start={end - 540}&end={end}&step=30"
    d = call(s, "POST", "/api/v1/query_range", data=form)
    assert d["resultType"] == "matrix"
    by_job = {x["metric"]["job"]: x["values"] for x in d["result"]}
    assert set(by_job) == {"etl", "wordcount"}
    for values in by_job.values():
        assert len(values) >= 17
        for ts, v in values:
            assert isinstance(ts, (int, float)) and isinstance(v, str)
            assert float(v) == pytest.approx(10 * (1 + 2 + 3), rel=1e-9)  # 100/10 s per step per subtask
        assert [ts for ts, _ in values] == sorted(ts for ts, _ in values)

    # a panel whose step Grafana floors to range/11000 with sub-second precision
    d = call(s, "POST", "/api/v1/query_range",
             data=f"query=flink_taskmanager_job_task_backPressuredTimeMsPerSecond&start={end - 600}.123"
                  f"&end={end}.456&step=0.5")
    assert len(d["result"]) == 6
    # instant panel (table), with Grafana's explicit timeout
    d = call(s, "POST", "/api/v1/query",
             data=f"query=count(flink_taskmanager_job_task_numRecordsIn)&time={end}&timeout=30s")
    assert d["result"][0]["value"][1] == "6"


def test_grafana_sees_errors_as_errors(ds):
    """A broken panel query: Grafana shows data.error, keyed by errorType, with status 400."""
    r = requests.post(ds.url + "/api/v1/query_range", data="query=sum(&start=1&end=2&step=1", headers=FORM, timeout=10)
    assert r.status_code == 400
    body = r.json()
    assert body["status"] == "error" and body["errorType"] == "bad_data"
    assert body["error"] == "1:5: parse error: unexpected end of input"
