"""The dashboard's HTTP side: the flow API against hand-computed per-second increments, its SSE
stream, and the embedded assets' headers (types, caching, ETag, Content-Security-Policy).

Flow data is written with remote write so every sample has an exact timestamp; the series carry
Flink's metric names and labels (job_name is the job)."""
import json
import os
import re
import struct
import subprocess
import time

import requests

from promproto import remote_write

SRC = os.environ.get("SLUICE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "../.."))
JOB = "orders"
STALE = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
NAN = float("nan")


def series(metric, job=JOB, **labels):
    base = {"__name__": metric, "job": "flink_tm", "job_name": job, "task_name": "t1", "subtask_index": "0"}
    base.update(labels)
    return sorted(base.items())


def write(url, items):
    status, _, body = remote_write(url, items)
    assert status == 204, body


def put_fixture(url, t0):
    """Three counter series, two backpressure subtasks, a busy gauge with a NaN, two lag gauges."""
    ms = lambda s, off=0: (t0 + s) * 1000 + off  # noqa: E731
    rin = "flink_taskmanager_job_task_operator_numRecordsIn"
    rout = "flink_taskmanager_job_task_operator_numRecordsOut"
    bp = "flink_taskmanager_job_task_backPressuredTimeMsPerSecond"
    busy = "flink_taskmanager_job_task_busyTimeMsPerSecond"
    lag = "flink_taskmanager_job_task_operator_KafkaSourceReader_KafkaConsumer_records_lag_max"
    write(url, [
        # TaskManager A pushes at t0, t0+10, misses t0+20, pushes t0+30, restarts before t0+40.
        (series(rin, tm_id="A", operator_name="Map"),
         [(ms(0), 100), (ms(10, 300), 200), (ms(30), 400), (ms(40), 50)]),
        # TaskManager B pushes at other seconds: t0+5, 15, 25, 35, 45.
        (series(rin, tm_id="B", operator_name="Map"),
         [(ms(5), 0), (ms(15), 100), (ms(25), 300), (ms(35), 300), (ms(45), 400)]),
        # records out: one series that went stale (group deleted) and came back.
        (series(rout, tm_id="C", operator_name="Map"),
         [(ms(0), 0), (ms(10), 100), (ms(12), STALE), (ms(30), 1000), (ms(40), 1100)]),
        (series(bp, tm_id="A", subtask_index="0"), [(ms(0), 100), (ms(20), 800)]),
        (series(bp, tm_id="A", subtask_index="1"), [(ms(10), 300)]),
        (series(bp, tm_id="A", subtask_index="0", task_name="t2"), [(ms(0), 50)]),
        (series(busy, tm_id="A", subtask_index="0"), [(ms(0), 500), (ms(10), NAN)]),
        (series(lag, tm_id="A", partition="0"), [(ms(0), 100)]),
        (series(lag, tm_id="A", partition="1"), [(ms(0), 50)]),
        # Another job with the same metrics must not leak in.
        (series(rin, job="other", tm_id="A", operator_name="Map"), [(ms(0), 0), (ms(10), 1000000)]),
    ])


def expected_records_in(t0, start, end):
    """By hand: A adds 10/s over t0+1..10, 200 over the 20 s gap (10/s) t0+11..30, 50 after its
    reset over t0+31..40 (5/s); B adds 10/s t0+6..15, 20/s t0+16..25, 0 t0+26..35, 10/s t0+36..45.
    complete_until = t0+40 (A's and C's newest sample), so t0+41.. are null."""
    per = {}
    for s in range(1, 11):
        per[s] = 10
    for s in range(11, 31):
        per[s] = 10
    for s in range(31, 41):
        per[s] = 5
    for s, v in [(range(6, 16), 10), (range(16, 26), 20), (range(26, 36), 0)]:
        for x in s:
            per[x] = per.get(x, 0) + v
    for x in range(36, 41):
        per[x] += 10
    return [per.get(s - t0) for s in range(start, end + 1)]


def get_flow(url, **params):
    r = requests.get(url + "/api/v1/flow", params=params)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "success"
    return body["data"]


def test_flow_hand_computed(sluice):
    t0 = int(time.time()) // 10 * 10 - 60
    put_fixture(sluice.url, t0)
    d = get_flow(sluice.url, job=JOB, window="50s", end=t0 + 45)
    start = t0 - 4
    assert (d["job"], d["start"], d["end"], d["step"]) == (JOB, start, t0 + 45, 1)
    assert d["complete_until"] == t0 + 40
    assert d["counter_series"] == 3
    assert d["records_in"] == expected_records_in(t0, start, t0 + 45)
    out = [None] * 5 + [10] * 10 + [None] * 20 + [10] * 10 + [None] * 5  # stale marker: no joining across it
    assert d["records_out"] == out
    tasks = {t["name"]: t for t in d["tasks"]}
    assert set(tasks) == {"t1", "t2"}
    t1 = tasks["t1"]
    assert t1["subtasks"] == 2 and t1["level"] == "high" and t1["backpressure_now"] == 0.8
    # max over subtasks, each held from its sample: 0.1 from t0, 0.3 from t0+10, 0.8 from t0+20.
    assert t1["backpressure"] == [None] * 4 + [0.1] * 10 + [0.3] * 10 + [0.8] * 26
    # busy: 0.5 from t0 until the NaN sample at t0+10 ends it.
    assert t1["busy"] == [None] * 4 + [0.5] * 10 + [None] * 36
    assert tasks["t2"]["level"] == "ok" and tasks["t2"]["backpressure_now"] == 0.05
    assert d["lags"] == [{"name": "flink_taskmanager_job_task_operator_KafkaSourceReader_KafkaConsumer_records_lag_max",
                          "values": [None] * 4 + [150] * 46}]
    assert d["control"]["mode"] == "running" and d["control"]["version"] == 0
    # The job's control state travels with its flow.
    r = requests.post(sluice.url + f"/api/v1/control/jobs/{JOB}/rate-limit", json={"per_second": 500})
    assert r.status_code == 200, r.text
    d = get_flow(sluice.url, job=JOB, window="50s", end=str(t0 + 45))
    assert d["control"]["mode"] == "rate_limited" and d["control"]["rate_limit_per_second"] == 500


def test_flow_unknown_job_and_errors(sluice):
    d = get_flow(sluice.url, job="nobody", window="10s")
    assert d["complete_until"] is None and d["records_in"] == [None] * 10 and d["tasks"] == [] and d["lags"] == []
    for params, word in [({}, "job"), ({"job": ""}, "job"), ({"job": "x", "window": "0s"}, "window"),
                         ({"job": "x", "window": "2h"}, "window"), ({"job": "x", "window": "1500ms"}, "window"),
                         ({"job": "x", "end": "soon"}, "end"), ({"job": "a\x01b"}, "job")]:
        r = requests.get(sluice.url + "/api/v1/flow", params=params)
        assert r.status_code == 400, (params, r.text)
        assert r.json()["errorType"] == "bad_data" and word in r.json()["error"], r.text


def sse_events(resp, n):
    """The first n `event: flow` payloads of an SSE response."""
    out, event, data = [], None, []
    for line in resp.iter_lines(decode_unicode=True):
        if line == "":
            if event == "flow":
                out.append(json.loads("\n".join(data)))
                if len(out) == n:
                    return out
            event, data = None, []
        elif line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])
    raise AssertionError("stream ended early")


def test_flow_stream_window_then_patches(sluice):
    t0 = int(time.time()) // 10 * 10 - 60
    put_fixture(sluice.url, t0)
    with requests.get(sluice.url + "/api/v1/flow/stream", params={"job": JOB, "window": "120s"}, stream=True,
                      timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        first, second, third = sse_events(r, 3)
    assert first["end"] - first["start"] == 119 and first["complete_until"] == t0 + 40
    full = get_flow(sluice.url, job=JOB, window="120s", end=first["end"])
    assert first["records_in"] == full["records_in"]
    # Later events carry only the seconds that can still change: after complete_until.
    assert second["start"] == t0 + 41 and second["end"] >= first["end"]
    assert third["start"] == t0 + 41 and third["end"] > first["end"]
    assert all(v is None for v in third["records_in"])


def test_flow_stream_errors(sluice):
    r = requests.get(sluice.url + "/api/v1/flow/stream", params={"window": "5m"})
    assert r.status_code == 400 and "job" in r.json()["error"]


# ---- assets ------------------------------------------------------------------------------------

def test_index_headers_and_conditional_get(sluice):
    r = requests.get(sluice.url + "/")
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "text/html; charset=utf-8"
    assert r.headers["Cache-Control"] == "no-cache"
    csp = r.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp and "connect-src 'self'" in csp
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    etag = r.headers["ETag"]
    assert re.fullmatch(r'"[0-9a-f]{12}"', etag)
    r2 = requests.get(sluice.url + "/", headers={"If-None-Match": etag})
    assert r2.status_code == 304 and r2.content == b"" and r2.headers["ETag"] == etag
    r3 = requests.get(sluice.url + "/", headers={"If-None-Match": 'W/"nope", ' + etag})
    assert r3.status_code == 304
    assert requests.get(sluice.url + "/", headers={"If-None-Match": '"nope"'}).status_code == 200
    h = requests.head(sluice.url + "/")
    assert h.status_code == 200 and h.content == b""


def test_assets_hashed_immutable_and_typed(sluice):
    html = requests.get(sluice.url + "/").text
    refs = re.findall(r'(?:src|href)="(assets/[^"]+)"', html)
    kinds = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
    assert {os.path.splitext(x)[1] for x in refs} == set(kinds)
    assert any("uPlot.iife.min." in x for x in refs) and any(re.search(r"app\.[0-9a-f]{12}\.js$", x) for x in refs)
    for ref in set(refs):
        r = requests.get(sluice.url + "/" + ref)
        assert r.status_code == 200, ref
        assert r.headers["Content-Type"] == kinds[os.path.splitext(ref)[1]]
        assert r.headers["Cache-Control"] == "public, max-age=31536000, immutable"
        assert "default-src 'none'" in r.headers["Content-Security-Policy"]
        # The name carries the content's hash, and so does the ETag.
        h = re.search(r"\.([0-9a-f]{12})\.[a-z]+$", ref).group(1)
        assert r.headers["ETag"] == f'"{h}"'
    missing = requests.get(sluice.url + "/assets/app.000000000000.js")
    assert missing.status_code == 404


def test_vendored_uplot_matches_lockfile():
    with open(os.path.join(SRC, "web/package-lock.json")) as f:
        lock = json.load(f)
    with open(os.path.join(SRC, "web/package.json")) as f:
        pkg = json.load(f)
    version = lock["packages"]["node_modules/uplot"]["version"]
    assert pkg["dependencies"]["uplot"] == version  # pinned exactly, not a range
    with open(os.path.join(SRC, "web/vendor/uPlot.iife.min.js")) as f:
        head = f.readline()
    assert f"(v{version})" in head, head


def test_job_health_queries_answer_for_flink_data(sluice):
    """The job-health charts' queries (HEALTH_PANELS in web/app.js), with $job = orders, return
    data from sluice for the series Flink pushes (flink_gen --ops: JobManager and TaskManagers
    pushed like the reporter does), and a job that does not exist gets none."""
    tools = os.environ.get("SLUICE_TOOLS_DIR", os.path.join(SRC, "build-asan", "tests", "tools"))
    for tick in range(3):
        out = subprocess.run([os.path.join(tools, "flink_gen"), "--ops", "7", str(tick), str(tick)],
                             capture_output=True, check=True, text=True).stdout
        parts = re.split(r"^# flink_gen ops tick=\d+ job=(\S+) instance=\S+\n", out, flags=re.M)
        assert len(parts) == 11
        for i in range(1, len(parts), 2):
            r = requests.put(f"{sluice.url}/metrics/job/{parts[i]}", data=parts[i + 1],
                             headers={"Content-Type": "text/plain; version=0.0.4"})
            assert r.status_code == 200, r.text
        time.sleep(1.05)  # one push per second: rates need two samples
    app = open(os.path.join(SRC, "web", "app.js")).read()
    block = app[app.index("const HEALTH_PANELS = ["):app.index("const health = {")]
    queries = []
    for m in re.finditer(r"query:\s*((?:\s*\+?\s*(?:'[^']*'|\"[^\"]*\"))+)", block):
        queries.append("".join(s[1:-1] for s in re.findall(r"'[^']*'|\"[^\"]*\"", m.group(1))))
    assert len(queries) == 4, queries
    now = time.time()
    for q in queries:
        for job, want in (("orders", True), ("no_such_job", False)):
            r = requests.get(f"{sluice.url}/api/v1/query_range",
                             params={"query": q.replace("$job", job), "start": now - 60, "end": now, "step": 15}).json()
            assert r["status"] == "success", (q, r)
            assert bool(r["data"]["result"]) == want, (q, job, r["data"])
    gc = [q for q in queries if "GarbageCollector" in q][0]
    r = requests.get(f"{sluice.url}/api/v1/query", params={"query": gc.replace("$job", "orders")}).json()
    # orders runs on ops TaskManagers 0 and 2 only
    assert sorted(s["metric"]["tm_id"] for s in r["data"]["result"]) == ["ops_tm_0", "ops_tm_2"], r
