"""Availability from push heartbeats and expected jobs (api/availability.c), against the built
sluice with real HTTP pushes (python3-prometheus-client's push_to_gateway):

- a group pushing every second stops for 6 s (the issue's "10 s pushes stop for 60 s", scaled by
  ten; test_availability_60s.py runs the unscaled one, labelled slow): the gap, its length, the
  missed heartbeats and the availability match, to the second, through the API and PromQL, and
  survive a restart;
- an expected job that never pushes is missing (sluice_job_up 0), stays missing, and is up only
  once it pushes;
- the expected-jobs endpoints refuse what the control API refuses;
- the expected-jobs file is reloaded on SIGHUP and POST /-/reload.
"""
import re
import signal
import socket
import time

import pytest
import requests
from prometheus_client import CollectorRegistry, Gauge, push_to_gateway


def poll(fn, timeout=30, step=0.1):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(step)
    raise AssertionError(f"condition not met in {timeout}s (last: {last!r})")


def push(url, job, job_name, instance="tm1"):
    """One Flink-like push (job label in the path, job_name on the series); returns the client
    time at the middle of the request."""
    reg = CollectorRegistry()
    g = Gauge("flink_taskmanager_job_task_numRecordsIn", "records", ["job_name"], registry=reg)
    g.labels(job_name).set(1)
    t0 = time.time()
    push_to_gateway(url.replace("http://", ""), job=job, registry=reg, grouping_key={"instance": instance})
    return (t0 + time.time()) / 2


def query(s, q, t=None):
    params = {"query": q}
    if t is not None:
        params["time"] = t
    r = requests.get(s.url + "/api/v1/query", params=params)
    assert r.status_code == 200, r.text
    return r.json()["data"]["result"]


def availability(s, job, rng="1h"):
    r = requests.get(s.url + "/api/v1/availability", params={"job": job, "range": rng})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "success"
    return body["data"]


def sleep_until(t):
    d = t - time.time()
    if d > 0:
        time.sleep(d)


def test_gap_counted_to_the_second(start_sluice, tmpdir_path):
    args = ("--push.expected-interval=1s", "--push.heartbeat-series-interval=1s")
    s = start_sluice(*args, data_dir=f"{tmpdir_path}/gapdata")
    start = time.time()
    times = []
    for k in range(4):  # pushes at 0..3 s
        sleep_until(start + k)
        times.append(push(s.url, "tm-a", "flinkA"))
    # pushes stop for 6 s (six heartbeats missing: 4..9), the job is in a gap meanwhile
    poll(lambda: availability(s, "flinkA")["in_gap"], timeout=20)
    sleep_until(start + 10)
    times.append(push(s.url, "tm-a", "flinkA"))
    for k in (11, 12):
        sleep_until(start + k)
        times.append(push(s.url, "tm-a", "flinkA"))
    want_gap = times[4] - times[3] - 1.0  # it starts when the first missing heartbeat was due

    d = poll(lambda: (lambda a: a if a["gaps"]["count"] == 1 and not a["in_gap"] else None)(availability(s, "flinkA")))
    assert abs(d["gaps"]["total_seconds"] - want_gap) < 0.5, d
    assert d["gaps"]["longest_seconds"] == d["gaps"]["total_seconds"]
    gap = d["recent_gaps"][0]
    assert gap["open"] is False and gap["end_reason"] == "push"
    assert abs(gap["start"] - (times[3] + 1)) < 0.5 and abs(gap["end"] - times[4]) < 0.5
    # availability = 1 - gap / observed time, observed since the job's first push
    want = 100 * (1 - d["gaps"]["total_seconds"] / d["observed_seconds"])
    assert abs(d["availability"] - want) < 1e-3
    assert abs(d["observed_seconds"] - (d["end"] - times[0])) < 0.5
    assert d["expected"] is False and d["up"] is True and d["groups"] == 1
    # the group's own gap is listed too, with its labels
    assert any(g["group"] == '{instance="tm1",job="tm-a"}' and not g["open"] for g in d["group_gaps"])
    # the job label of the path is a job of its own, with the same gap
    assert availability(s, "tm-a")["gaps"]["count"] == 1

    # PromQL on the stored series: the group missed exactly six pushes, the job six intervals
    def series_caught_up():
        r = query(s, 'sluice_push_received_total{job="tm-a",instance="tm1"}')
        return r and float(r[0]["value"][1]) == len(times)
    poll(series_caught_up)
    missed = query(s, 'sluice_push_expected_total{job="tm-a"} - sluice_push_received_total{job="tm-a"}')
    assert len(missed) == 1 and float(missed[0]["value"][1]) == 6, missed
    assert float(query(s, 'sluice_push_interval_seconds{job="tm-a"}')[0]["value"][1]) == 1
    last = float(query(s, 'sluice_push_last_seconds{job="tm-a"}')[0]["value"][1])
    assert abs(last - times[-1]) < 0.5
    jm = query(s, 'sluice_job_push_expected_total{job="flinkA"} - sluice_job_push_received_total{job="flinkA"}')
    assert abs(float(jm[0]["value"][1]) - want_gap) < 0.5  # missed intervals x 1 s = gap seconds
    # the SLI from the counters agrees with the API's availability
    now = time.time()
    sli = query(s, '100 * (1 - (sluice_job_push_expected_total{job="flinkA"} - '
                   'sluice_job_push_received_total{job="flinkA"}) / sluice_job_push_expected_total{job="flinkA"})',
                t=now)
    api = availability(s, "flinkA")["availability"]
    assert abs(float(sli[0]["value"][1]) - api) < 100 * 1.5 / (now - times[0]), (sli, api)
    assert query(s, 'sluice_job_up{job="flinkA"}')[0]["value"][1] == "1"
    # over a range: increase() of the counters over the whole run
    inc = query(s, '1 - (increase(sluice_push_expected_total{job="tm-a"}[1h]) - '
                   'increase(sluice_push_received_total{job="tm-a"}[1h])) / '
                   'increase(sluice_push_expected_total{job="tm-a"}[1h])')
    assert 0 < float(inc[0]["value"][1]) < 1

    # the gap survives a restart
    assert s.stop() == 0
    s2 = start_sluice(*args, data_dir=f"{tmpdir_path}/gapdata")
    d2 = availability(s2, "flinkA")
    assert d2["gaps"]["count"] == 1
    assert abs(d2["gaps"]["total_seconds"] - d["gaps"]["total_seconds"]) < 1e-3
    assert d2["recent_gaps"][0]["end_reason"] == "push"

    # every job at once
    r = requests.get(s2.url + "/api/v1/availability", params={"range": "24h"})
    assert r.status_code == 200
    assert {j["job"] for j in r.json()["data"]["jobs"]} >= {"flinkA", "tm-a"}


def test_bad_parameters(sluice):
    for params, word in (({"job": "x", "range": "soon"}, "range"), ({"job": "x", "range": "-5m"}, "range"),
                         ({"job": "x", "range": "0s"}, "range"), ({"job": ""}, "job")):
        r = requests.get(sluice.url + "/api/v1/availability", params=params)
        assert r.status_code == 400, (params, r.text)
        assert r.json()["status"] == "error" and r.json()["errorType"] == "bad_data" and word in r.json()["error"]
    r = requests.get(sluice.url + "/api/v1/availability", params={"job": "never-seen"})
    assert r.status_code == 404 and r.json()["errorType"] == "not_found"


def expected_url(s, job, suffix=""):
    return f"{s.url}/api/v1/control/jobs/{job}{suffix}"


def test_expected_job_missing_until_it_pushes(start_sluice):
    s = start_sluice("--push.heartbeat-series-interval=1s")
    r = requests.put(expected_url(s, "etl"), json={"expected": True, "interval": "1s"})
    assert r.status_code == 200, r.text
    declared = time.time()
    body = r.json()
    assert body["expected"] is True and body["source"] == "api" and body["interval"] == "1s"
    assert body["updated_by"].startswith("anonymous@")

    def up():
        r = query(s, 'sluice_job_up{job="etl"}')
        return r[0]["value"][1] if r else None
    poll(lambda: up() == "0")
    d = availability(s, "etl")
    assert d["up"] is False and d["expected"] is True and d["last_push"] is None and d["in_gap"] is True
    # its gap starts when the first heartbeat was due: one interval after the declaration
    assert abs(d["recent_gaps"][0]["start"] - (declared + 1)) < 0.5
    # it stays missing (several more intervals)
    t_end = time.time() + 4
    while time.time() < t_end:
        assert up() in ("0", None) and availability(s, "etl")["up"] is False
        time.sleep(0.5)
    assert up() == "0"
    listed = requests.get(s.url + "/api/v1/control/expected-jobs").json()["jobs"]
    assert [j["job"] for j in listed] == ["etl"] and listed[0]["up"] is False

    # it pushes: up again, the gap closes
    push(s.url, "etl", "etl")
    poll(lambda: up() == "1")
    d = availability(s, "etl")
    assert d["up"] is True and d["gaps"]["count"] == 1 and d["recent_gaps"][0]["open"] is False
    # the same through the sub-resource
    g = requests.get(expected_url(s, "etl", "/expected"))
    assert g.status_code == 200 and g.json()["up"] is True

    # no longer expected: the job stays while it pushes, but sluice_job_up is no longer pinned
    r = requests.delete(expected_url(s, "etl", "/expected"))
    assert r.status_code == 200 and r.json()["expected"] is False
    assert requests.get(s.url + "/api/v1/control/expected-jobs").json()["jobs"] == []
    # flow control on the same job is untouched by all this
    fc = requests.get(expected_url(s, "etl"))
    assert fc.status_code == 200 and fc.json()["mode"] == "running"
    r = requests.put(expected_url(s, "etl"), json={"mode": "paused"})
    assert r.status_code == 200 and r.json()["mode"] == "paused"


def raw(port, method, path, body=b"", headers=(), source="127.0.0.1"):
    sock = socket.create_connection(("127.0.0.1", port), source_address=(source, 0))
    hdr = "".join(f"{h}\r\n" for h in headers)
    sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
                 f"{hdr}\r\n".encode() + body)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    sock.close()
    return int(data.split(b" ", 2)[1]), data


def test_expected_jobs_auth_and_validation(start_sluice, tmp_path):
    s = start_sluice()
    body = b'{"expected":true}'
    ct = "Content-Type: application/json"
    # a remote peer without a token file: refused, nothing changes
    st, _ = raw(s.port, "PUT", "/api/v1/control/jobs/j1", body, [ct], source="127.0.0.2")
    assert st == 403
    st, _ = raw(s.port, "DELETE", "/api/v1/control/jobs/j1/expected", b"", [], source="127.0.0.2")
    assert st == 403
    # cross-site browser requests and form posts
    r = requests.put(expected_url(s, "j1"), data=body, headers={"Content-Type": "application/json",
                                                                 "Origin": "http://evil.example"})
    assert r.status_code == 403
    r = requests.put(expected_url(s, "j1"), data=body, headers={"Content-Type": "text/plain",
                                                                 "Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 415
    r = requests.put(expected_url(s, "j1", "/expected"), data=body,
                     headers={"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    assert requests.get(s.url + "/api/v1/control/expected-jobs").json()["jobs"] == []
    # bad bodies: 400 naming the field
    for b, field in (({"expected": "yes"}, "expected"), ({"expected": True, "interval": "soon"}, "interval"),
                     ({"expected": True, "interval": "0s"}, "interval"), ({"expected": True, "mode": "paused"}, "mode")):
        r = requests.put(expected_url(s, "j1"), json=b)
        assert r.status_code == 400 and r.json()["field"] == field, (b, r.text)
    r = requests.put(expected_url(s, "j1", "/expected"), data=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    r = requests.post(expected_url(s, "j1", "/expected"), json={"expected": True})
    assert r.status_code == 405
    assert requests.get(s.url + "/api/v1/control/expected-jobs").json()["jobs"] == []
    # PUT on the sub-resource needs no "expected" (it is the declaration); interval in seconds works
    r = requests.put(expected_url(s, "j1", "/expected"), json={"interval": 30})
    assert r.status_code == 200 and r.json()["interval"] == "30s"

    # with a token file: a token is needed, and names who declared
    tf = tmp_path / "tokens"
    tf.write_text("ops:ops-token-0123456789\n")
    s2 = start_sluice(f"--web.control-token-file={tf}", "--web.control-read-auth")
    r = requests.put(expected_url(s2, "j2"), json={"expected": True})
    assert r.status_code == 401
    assert requests.get(s2.url + "/api/v1/control/expected-jobs").status_code == 401
    auth = {"Authorization": "Bearer ops-token-0123456789"}
    r = requests.put(expected_url(s2, "j2"), json={"expected": True}, headers=auth)
    assert r.status_code == 200 and r.json()["updated_by"] == "ops"
    r = requests.get(s2.url + "/api/v1/control/expected-jobs", headers=auth)
    assert [j["job"] for j in r.json()["jobs"]] == ["j2"]


def test_expected_jobs_file_reload(start_sluice, tmp_path):
    f = tmp_path / "expected.txt"
    f.write_text("# jobs that must run\nfile-job interval=2s\n")
    s = start_sluice(f"--control.expected-jobs-file={f}", "--push.heartbeat-series-interval=1s")

    def listed():
        r = requests.get(s.url + "/api/v1/control/expected-jobs")
        return {j["job"]: j for j in r.json()["jobs"]}
    assert set(listed()) == {"file-job"} and listed()["file-job"]["source"] == "file"
    assert listed()["file-job"]["interval"] == "2s"
    f.write_text("file-job interval=2s\norders etl\n")
    s.proc.send_signal(signal.SIGHUP)
    poll(lambda: set(listed()) == {"file-job", "orders etl"})
    poll(lambda: query(s, 'sluice_job_up{job="orders etl"}'))
    # a bad file: the reload fails, the declarations stay
    f.write_text("ok-job\nbad interval=soon\n")
    r = requests.post(s.url + "/-/reload")
    assert r.status_code == 500 and "line 2" in r.text
    assert set(listed()) == {"file-job", "orders etl"}
    # POST /-/reload picks up a good file; a job declared through the API too stays
    requests.put(expected_url(s, "file-job"), json={"expected": True, "interval": "5s"}).raise_for_status()
    f.write_text("new-job\n")
    assert requests.post(s.url + "/-/reload").status_code == 200
    got = listed()
    assert set(got) == {"file-job", "new-job"}
    assert got["file-job"]["source"] == "api" and got["new-job"]["source"] == "file"
    # a job dropped from the file and never pushed is forgotten
    assert requests.get(s.url + "/api/v1/availability", params={"job": "orders etl"}).status_code in (200, 404)


def test_bad_file_fails_startup(start_sluice, tmp_path):
    f = tmp_path / "expected.txt"
    f.write_text("a\n\x01bad\n")
    s = start_sluice(f"--control.expected-jobs-file={f}", wait=False)
    assert s.proc.wait(timeout=30) != 0
    assert "expected-jobs file" in s.read_log()


def test_dashboard_shows_availability(sluice):
    """The built-in dashboard's availability card asks the API for 24 h and 30 d and lists the
    gaps it returns (the fields it reads are the ones test_gap_counted_to_the_second checks)."""
    page = requests.get(sluice.url + "/").text
    assert 'id="avail-summary"' in page and 'id="avail-gaps"' in page
    src = re.search(r'<script src="([^"]*app[^"]*\.js)"', page).group(1)
    js = requests.get(sluice.url + "/" + src.lstrip("./")).text
    assert "api/v1/availability?job=" in js and '"24h"' in js and '"30d"' in js
    for field in ("availability", "recent_gaps", "total_seconds", "longest_seconds", "end_reason"):
        assert field in js
