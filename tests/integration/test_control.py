"""Flow control (issue 7): REST API, validation, long-polls (incl. 1,000 parked at once), the SSE
stream and its Last-Event-ID resume, auth, the TIS-compatible poll, restart and expiry, sluicectl."""
# ctest-labels: slow
import json
import os
import queue
import re
import socket
import subprocess
import threading
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from conftest import SLUICE_BIN

SLUICECTL_BIN = os.environ.get("SLUICECTL_BIN", os.path.join(os.path.dirname(SLUICE_BIN), "sluicectl"))
TIMING_HISTOGRAMS = ("sluice_control_commit_duration_seconds", "sluice_control_fanout_duration_seconds",
                     "sluice_control_propagation_seconds")
TIS_PATH = "/config/config.ajax?action=fullbuild_workflow_action&event_submit_do_get_rate_controller=true"


def job_url(s, job, suffix=""):
    return f"{s.url}/api/v1/control/jobs/{requests.utils.quote(job, safe='')}{suffix}"


def metric(s, name):
    text = requests.get(s.url + "/metrics").text
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def wait_until(cond, what, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)


# --- raw HTTP for parked requests ---------------------------------------------------------------

def raw_send(port, path, headers=(), source=None):
    s = socket.create_connection(("127.0.0.1", port), timeout=60,
                                 source_address=(source, 0) if source else None)
    extra = "".join(f"{h}\r\n" for h in headers)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: sluice\r\n{extra}\r\n".encode())
    return s


def raw_read(s):
    """Reads one response (Content-Length framed); returns (status, headers, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise AssertionError("connection closed before a response: %r" % data)
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
    n = int(headers.get("content-length", "0"))
    while len(body) < n:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body


class SSE:
    """An SSE subscriber on a background thread; events land in .events (a queue of dicts)."""

    def __init__(self, url, headers=None):
        self.events = queue.Queue()
        self.resp = requests.get(url, stream=True, headers=headers or {}, timeout=60)
        assert self.resp.status_code == 200, self.resp.text
        assert self.resp.headers["Content-Type"].startswith("text/event-stream")
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        ev = {}
        try:
            for raw in self.resp.iter_lines(chunk_size=1, decode_unicode=False):
                line = raw.decode()
                if line == "":
                    if "data" in ev:
                        ev["json"] = json.loads(ev["data"])
                        self.events.put(ev)
                    ev = {}
                elif line.startswith(":"):
                    continue
                elif ":" in line:
                    k, v = line.split(":", 1)
                    ev[k] = v[1:] if v.startswith(" ") else v
        except Exception:
            pass

    def next(self, timeout=30):
        return self.events.get(timeout=timeout)

    def close(self):
        self.resp.close()


# --- REST ----------------------------------------------------------------------------------------

def test_states_changes_history_and_list(sluice):
    r = requests.get(job_url(sluice, "orders"))
    assert r.status_code == 200
    j = r.json()
    assert j["job"] == "orders" and j["mode"] == "running" and j["version"] == 0
    assert r.headers["ETag"] == '"0"'

    r = requests.post(job_url(sluice, "orders", "/pause"), json={"reason": "dba fix"})
    assert r.status_code == 200, r.text
    j = r.json()
    assert (j["mode"], j["version"], j["reason"], j["updated_by"]) == ("paused", 1, "dba fix", "anonymous@127.0.0.1")
    assert r.headers["ETag"] == '"1"'

    r = requests.post(job_url(sluice, "orders", "/rate-limit"), json={"per_second": 5000})
    assert r.json()["mode"] == "rate_limited" and r.json()["rate_limit_per_second"] == 5000
    r = requests.post(job_url(sluice, "orders", "/drain"), json={"match": [{"attribute": "table", "regex": "^tmp_"}]})
    assert r.json()["drain"] == [{"attribute": "table", "regex": "^tmp_"}]
    r = requests.post(job_url(sluice, "orders", "/drain"))  # empty body: drop everything
    assert r.json()["mode"] == "draining" and r.json()["drain"] == []
    r = requests.put(job_url(sluice, "orders"), json={"mode": "running", "reason": "done"})
    assert r.json()["version"] == 5
    # optimistic concurrency on PUT
    r = requests.put(job_url(sluice, "orders"), json={"mode": "paused", "version": 4})
    assert r.status_code == 409 and r.json()["field"] == "version"
    r = requests.put(job_url(sluice, "orders"), json={"mode": "paused", "version": 5})
    assert r.status_code == 200 and r.json()["version"] == 6

    r = requests.get(job_url(sluice, "orders", "/history"), params={"limit": 4})
    h = r.json()
    assert [e["version"] for e in h["entries"]] == [6, 5, 4, 3]
    assert h["next_before"] == 3
    h2 = requests.get(job_url(sluice, "orders", "/history"), params={"before": 3}).json()
    assert [e["version"] for e in h2["entries"]] == [2, 1] and h2["next_before"] is None
    assert h2["entries"][1]["reason"] == "dba fix"
    ids = [e["event_id"] for e in h["entries"] + h2["entries"]]
    assert ids == sorted(ids, reverse=True)

    # a job name with '/', spaces and non-ASCII survives the path
    odd = "数据 sync/prod"
    r = requests.post(job_url(sluice, odd, "/pause"))
    assert r.status_code == 200 and r.json()["job"] == odd
    jobs = requests.get(sluice.url + "/api/v1/control/jobs").json()["jobs"]
    assert sorted(j["job"] for j in jobs) == sorted(["orders", odd])

    text = requests.get(sluice.url + "/metrics").text
    assert 'sluice_control_mode{job="orders",mode="paused"} 1' in text
    assert 'sluice_control_mode{job="orders",mode="running"} 0' in text
    assert 'sluice_control_rate_limit_per_second{job="orders"} 0' in text
    assert "sluice_control_changes_total 7" in text
    assert "sluice_control_long_polls_parked 0" in text


@pytest.mark.parametrize("suffix,method,body,field", [
    ("", "PUT", {"mode": "stopped"}, "mode"),
    ("", "PUT", {"mode": "rate_limited"}, "rate_limit_per_second"),
    ("", "PUT", {"mode": "running", "colour": "red"}, "colour"),
    ("/rate-limit", "POST", {"per_second": 0}, "per_second"),
    ("/rate-limit", "POST", {"per_second": -5}, "per_second"),
    ("/rate-limit", "POST", {"per_second": 10**13}, "per_second"),
    ("/drain", "POST", {"match": [{"attribute": "table", "regex": "(unclosed"}]}, "match"),
    ("/drain", "POST", {"match": [{"attribute": "table", "regex": "x", "extra": 1}]}, "match"),
    ("/pause", "POST", {"for": "ten minutes"}, "for"),
    ("/pause", "POST", {"reason": "x" * 2000}, "reason"),
    ("/pause", "POST", "not json", "body"),
    ("/pause", "POST", "x" * 70000, "body"),
])
def test_bad_input_is_400_naming_the_field_and_changes_nothing(sluice, suffix, method, body, field):
    data = body if isinstance(body, str) else json.dumps(body)
    r = requests.request(method, job_url(sluice, "j", suffix), data=data, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    j = r.json()
    assert j["status"] == "error" and j["field"] == field, j
    assert field.split("[")[0] in j["error"] or field == "body"
    assert requests.get(job_url(sluice, "j")).json()["version"] == 0
    assert requests.get(job_url(sluice, "j", "/history")).json()["entries"] == []


def test_bad_job_names_and_actions(sluice):
    assert requests.post(sluice.url + "/api/v1/control/jobs/a%0Ab/pause").json()["field"] == "job"
    assert requests.post(sluice.url + "/api/v1/control/jobs//pause").status_code == 400
    assert requests.post(job_url(sluice, "x" * 300, "/pause")).status_code == 400
    assert requests.post(sluice.url + "/api/v1/control/jobs/a%00b/pause").status_code == 400
    assert requests.post(job_url(sluice, "j", "/explode")).status_code == 404
    assert requests.get(job_url(sluice, "j", "/pause")).status_code == 405
    assert requests.get(job_url(sluice, "j"), params={"wait": "10m", "version": 0}).json()["field"] == "wait"
    assert requests.get(job_url(sluice, "j"), params={"version": "x"}).json()["field"] == "version"


# --- long-polls ----------------------------------------------------------------------------------

def test_long_poll_wakes_on_change_and_times_out_with_304(sluice):
    port = sluice.port
    s = raw_send(port, "/api/v1/control/jobs/j?version=0&wait=60s")
    wait_until(lambda: metric(sluice, "sluice_control_long_polls_parked") == 1, "the poll to park")
    # a change to another job does not wake it
    requests.post(job_url(sluice, "other", "/pause"))
    r = requests.post(job_url(sluice, "j", "/rate-limit"), json={"per_second": 42})
    assert r.status_code == 200
    status, headers, body = raw_read(s)
    s.close()
    assert status == 200 and headers["etag"] == '"1"'
    assert json.loads(body)["rate_limit_per_second"] == 42
    # newer than the client's version: answered at once, no parking
    r = requests.get(job_url(sluice, "j"), params={"version": 0, "wait": "60s"})
    assert r.status_code == 200 and r.json()["version"] == 1
    # unchanged until the wait runs out: 304 with the ETag
    r = requests.get(job_url(sluice, "j"), params={"version": 1, "wait": "200ms"})
    assert r.status_code == 304 and r.headers["ETag"] == '"1"' and r.content == b""
    # ETag / If-None-Match
    r = requests.get(job_url(sluice, "j"), headers={"If-None-Match": '"1"'})
    assert r.status_code == 304
    r = requests.get(job_url(sluice, "j"), headers={"If-None-Match": '"0"'})
    assert r.status_code == 200
    s = raw_send(port, "/api/v1/control/jobs/j?wait=60s", headers=['If-None-Match: "1"'])
    wait_until(lambda: metric(sluice, "sluice_control_long_polls_parked") == 1, "the poll to park")
    requests.post(job_url(sluice, "j", "/resume"))
    status, headers, body = raw_read(s)
    assert status == 200 and json.loads(body)["mode"] == "running"
    s.close()


def test_thousand_parked_long_polls_and_an_sse_subscriber_all_see_a_change(sluice):
    n = 1000
    sse = SSE(sluice.url + "/api/v1/control/stream?job=bulk")
    socks = [raw_send(sluice.port, "/api/v1/control/jobs/bulk?version=0&wait=120s") for _ in range(n)]
    wait_until(lambda: metric(sluice, "sluice_control_long_polls_parked") == n, "1000 polls to park")
    assert metric(sluice, "sluice_control_stream_subscribers") == 1
    before = {h: (metric(sluice, h + "_count"), metric(sluice, h + "_sum")) for h in TIMING_HISTOGRAMS}
    r = requests.post(job_url(sluice, "bulk", "/pause"), json={"reason": "bulk"})
    assert r.status_code == 200
    for s in socks:
        status, headers, body = raw_read(s)
        assert status == 200
        j = json.loads(body)
        assert j["mode"] == "paused" and j["version"] == 1
        s.close()
    ev = sse.next()
    assert ev["event"] == "change" and ev["json"]["mode"] == "paused" and ev["json"]["job"] == "bulk"
    sse.close()
    assert metric(sluice, "sluice_control_long_polls_parked") == 0
    assert metric(sluice, "sluice_control_long_polls_answered_total") == n
    # where the change's time went: one commit, one fan-out (1,000 sends), one propagation
    fams = {f.name: f for f in text_string_to_metric_families(requests.get(sluice.url + "/metrics").text)}
    took = {}
    for h in TIMING_HISTOGRAMS:
        f = fams[h]
        assert f.type == "histogram"
        count = next(s.value for s in f.samples if s.name == h + "_count")
        total = next(s.value for s in f.samples if s.name == h + "_sum")
        buckets = [s for s in f.samples if s.name == h + "_bucket"]
        assert count == before[h][0] + 1, h
        assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == count
        assert all(a.value <= b.value for a, b in zip(buckets, buckets[1:])), "buckets are cumulative"
        took[h] = total - before[h][1]
        assert took[h] > 0, h
    # the commit and then the fan-out are both part of the propagation
    prop = took["sluice_control_propagation_seconds"]
    assert prop >= took["sluice_control_fanout_duration_seconds"]
    assert prop >= took["sluice_control_commit_duration_seconds"]


def test_shutdown_answers_parked_polls(start_sluice):
    s = start_sluice()
    sock = raw_send(s.port, "/api/v1/control/jobs/j?version=0&wait=120s")
    wait_until(lambda: metric(s, "sluice_control_long_polls_parked") == 1, "the poll to park")
    sse = SSE(s.url + "/api/v1/control/stream")
    assert s.stop() == 0
    status, headers, _ = raw_read(sock)
    assert status == 304
    sse.thread.join(timeout=30)
    assert not sse.thread.is_alive()


# --- SSE -------------------------------------------------------------------------------------------

def test_sse_stream_filter_and_resume_across_restart(start_sluice, tmpdir_path):
    data = os.path.join(tmpdir_path, "data-sse")
    s = start_sluice(data_dir=data)
    everything = SSE(s.url + "/api/v1/control/stream")
    only_a = SSE(s.url + "/api/v1/control/stream?job=a")
    requests.post(job_url(s, "a", "/pause"))
    requests.post(job_url(s, "b", "/pause"))
    requests.post(job_url(s, "a", "/resume"))
    got = [everything.next() for _ in range(3)]
    assert [(e["json"]["job"], e["json"]["mode"]) for e in got] == [("a", "paused"), ("b", "paused"), ("a", "running")]
    ids = [int(e["id"]) for e in got]
    assert ids == sorted(ids) and len(set(ids)) == 3
    got_a = [only_a.next() for _ in range(2)]
    assert [int(e["id"]) for e in got_a] == [ids[0], ids[2]]
    everything.close()
    only_a.close()

    # resume from the first event: the two after it, then live ones
    resumed = SSE(s.url + "/api/v1/control/stream", headers={"Last-Event-ID": str(ids[0])})
    assert [int(resumed.next()["id"]) for _ in range(2)] == ids[1:]
    requests.post(job_url(s, "b", "/resume"))
    live = resumed.next()
    assert int(live["id"]) == ids[2] + 1 and live["json"]["job"] == "b"
    resumed.close()

    # ids and history survive a restart; resume works against the persisted log
    assert s.stop() == 0
    s2 = start_sluice(data_dir=data)
    again = SSE(s2.url + "/api/v1/control/stream", headers={"Last-Event-ID": str(ids[1])})
    assert [int(again.next()["id"]) for _ in range(2)] == [ids[2], ids[2] + 1]
    r = requests.post(job_url(s2, "a", "/pause"))
    ev = again.next()
    assert int(ev["id"]) == ids[2] + 2 and ev["json"]["version"] == 3
    again.close()
    assert requests.get(job_url(s2, "b")).json()["version"] == 2
    assert requests.get(job_url(s2, "a", "/history")).json()["entries"][0]["version"] == 3


def test_restart_keeps_state_and_reverts_what_expired_while_down(start_sluice, tmpdir_path):
    data = os.path.join(tmpdir_path, "data-expiry")
    s = start_sluice(data_dir=data)
    requests.post(job_url(s, "keep", "/rate-limit"), json={"per_second": 700})
    r = requests.post(job_url(s, "temp", "/rate-limit"), json={"per_second": 100})
    r = requests.post(job_url(s, "temp", "/pause"), json={"for": "1s", "reason": "short"})
    j = r.json()
    assert j["expires_at_ms"] - j["updated_at_ms"] == 1000 and j["revert_to"]["rate_limit_per_second"] == 100
    assert s.stop() == 0
    wait_until(lambda: time.time() * 1000 > j["expires_at_ms"] + 50, "the change to expire while down")
    s2 = start_sluice(data_dir=data)
    keep = requests.get(job_url(s2, "keep")).json()
    assert (keep["mode"], keep["rate_limit_per_second"], keep["version"]) == ("rate_limited", 700, 1)
    temp = requests.get(job_url(s2, "temp")).json()
    assert (temp["mode"], temp["rate_limit_per_second"], temp["version"]) == ("rate_limited", 100, 3)
    assert temp["updated_by"] == "sluice (expiry)" and temp["expires_at"] is None
    hist = requests.get(job_url(s2, "temp", "/history")).json()["entries"]
    assert [e["updated_by"] for e in hist] == ["sluice (expiry)", "anonymous@127.0.0.1", "anonymous@127.0.0.1"]


def test_expiry_while_running_wakes_pollers(sluice):
    r = requests.post(job_url(sluice, "t", "/drain"), json={"for": "1s"})
    assert r.json()["version"] == 1
    # parked at version 1: the expiry (version 2) is what answers it
    r = requests.get(job_url(sluice, "t"), params={"version": 1, "wait": "60s"})
    assert r.status_code == 200
    j = r.json()
    assert (j["mode"], j["version"], j["updated_by"]) == ("running", 2, "sluice (expiry)")
    assert metric(sluice, "sluice_control_expirations_total") == 1


# --- auth ------------------------------------------------------------------------------------------

def test_no_token_file_means_loopback_only(sluice):
    # 127.0.0.2 is loopback too, but not 127.0.0.1: it stands in for a remote peer
    s = socket.create_connection(("127.0.0.1", sluice.port), source_address=("127.0.0.2", 0))
    s.sendall(b"POST /api/v1/control/jobs/j/pause HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    status, _, body = raw_read(s)
    s.close()
    assert status == 403
    assert json.loads(body)["errorType"] == "forbidden"
    # reads stay open
    s = raw_send(sluice.port, "/api/v1/control/jobs/j", source="127.0.0.2")
    status, _, _ = raw_read(s)
    s.close()
    assert status == 200
    assert requests.get(job_url(sluice, "j")).json()["version"] == 0
    assert requests.post(job_url(sluice, "j", "/pause")).status_code == 200


def test_browser_cross_site_changes_refused(sluice):
    """A page on another site can make a browser POST a form or a text/plain fetch to sluice, from
    the visitor's machine (loopback). Such requests must not change anything."""
    url = job_url(sluice, "x", "/pause")
    cases = [
        ({"Content-Type": "text/plain"}, b'{"reason":"csrf"}', 415),  # fetch(no-cors) with a body
        ({"Content-Type": "application/x-www-form-urlencoded"}, b"reason=csrf", 415),  # HTML form
        ({"Content-Type": "multipart/form-data; boundary=x"}, b"--x--\r\n", 415),
        ({"Origin": "http://evil.example"}, b"", 403),  # bodiless fetch from another site
        ({"Origin": "null"}, b"", 403),  # sandboxed frame or file: page
        ({"Origin": f"http://127.0.0.1:{sluice.port + 1}"}, b"", 403),  # another port: another origin
        ({"Sec-Fetch-Site": "cross-site"}, b"", 403),
        ({"Sec-Fetch-Site": "same-site"}, b"", 403),
        ({"Sec-Fetch-Site": "cross-site", "Content-Type": "application/json"}, b"{}", 403),
    ]
    for headers, body, want in cases:
        r = requests.post(url, headers=headers, data=body)
        assert r.status_code == want, (headers, r.status_code, r.text)
        assert r.json()["status"] == "error"
    r = requests.put(job_url(sluice, "x"), headers={"Content-Type": "text/plain"}, data='{"mode":"paused"}')
    assert r.status_code == 415
    assert requests.get(job_url(sluice, "x")).json()["version"] == 0  # nothing changed
    # sluice's own dashboard (same origin, JSON) and plain clients (no Origin) still work
    own = {"Origin": sluice.url, "Sec-Fetch-Site": "same-origin", "Content-Type": "application/json"}
    r = requests.post(url, headers=own, data=b'{"reason":"from the dashboard"}')
    assert r.status_code == 200, r.text
    r = requests.post(job_url(sluice, "x", "/resume"), headers={"Content-Type": "application/json; charset=utf-8"},
                      data=b"{}")
    assert r.status_code == 200, r.text
    assert requests.post(job_url(sluice, "x", "/pause")).status_code == 200  # no body, no Origin: curl -X POST
    assert requests.get(job_url(sluice, "x")).json()["version"] == 3
    # refusals are logged at warn with the client's address, at most a line a second
    log = sluice.read_log()
    lines = [l for l in log.splitlines() if 'msg="request refused"' in l]
    assert lines and "level=warn" in lines[0] and "client=127.0.0.1" in lines[0], log
    assert "status=415" in lines[0] and "Content-Type must be application/json" in lines[0], lines[0]
    assert len(lines) <= 3, lines  # ten refusals within a second or two


def test_reload_needs_change_auth(start_sluice, tmp_path):
    """POST /-/reload changes the running rules: it gets the auth of a flow-control change."""
    s = start_sluice()
    assert requests.post(s.url + "/-/reload").status_code == 200  # loopback, no token file
    sock = socket.create_connection(("127.0.0.1", s.port), source_address=("127.0.0.2", 0))
    sock.sendall(b"POST /-/reload HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    status, _, _ = raw_read(sock)
    sock.close()
    assert status == 403
    assert requests.post(s.url + "/-/reload", headers={"Origin": "http://evil.example"}).status_code == 403
    tf = tmp_path / "tokens"
    tf.write_text("ops:ops-token-0123456789\n")
    s2 = start_sluice(f"--web.control-token-file={tf}")
    assert requests.post(s2.url + "/-/reload").status_code == 401
    r = requests.post(s2.url + "/-/reload", headers={"Authorization": "Bearer ops-token-0123456789"})
    assert r.status_code == 200, r.text


def test_tokens(start_sluice, tmp_path):
    tf = tmp_path / "tokens"
    tf.write_text("# operators\nalice:s3cret-alice-token\n\nalertmanager:am-token-123456\n")
    s = start_sluice(f"--web.control-token-file={tf}")
    r = requests.post(job_url(s, "j", "/pause"))
    assert r.status_code == 401 and r.json()["errorType"] == "unauthorized"
    assert "Bearer" in r.headers["WWW-Authenticate"]
    r = requests.post(job_url(s, "j", "/pause"), headers={"Authorization": "Bearer s3cret-alice-tokeX"})
    assert r.status_code == 401
    r = requests.post(job_url(s, "j", "/pause"), headers={"Authorization": "Bearer s3cret-alice-token-longer"})
    assert r.status_code == 401
    r = requests.post(job_url(s, "j", "/pause"), headers={"Authorization": "Bearer am-token-123456"},
                      json={"reason": "alert: db lag"})
    assert r.status_code == 200 and r.json()["updated_by"] == "alertmanager"
    # a token works from any peer
    sock = socket.create_connection(("127.0.0.1", s.port), source_address=("127.0.0.2", 0))
    sock.sendall(b"POST /api/v1/control/jobs/j/resume HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                 b"Authorization: Bearer s3cret-alice-token\r\n\r\n")
    status, _, body = raw_read(sock)
    sock.close()
    assert status == 200 and json.loads(body)["updated_by"] == "alice"
    assert requests.get(job_url(s, "j")).status_code == 200  # reads open by default


def test_read_auth(start_sluice, tmp_path):
    tf = tmp_path / "tokens"
    tf.write_text("grafana:read-token-abcdef\n")
    s = start_sluice(f"--web.control-token-file={tf}", "--web.control-read-auth")
    assert requests.get(job_url(s, "j")).status_code == 401
    assert requests.get(s.url + "/api/v1/control/stream").status_code == 401
    assert requests.get(job_url(s, "j"), headers={"Authorization": "Bearer read-token-abcdef"}).status_code == 200


def test_bad_token_file_fails_start(start_sluice, tmp_path):
    tf = tmp_path / "tokens"
    tf.write_text("just-a-token-without-a-name\n")
    s = start_sluice(f"--web.control-token-file={tf}", wait=False)
    assert s.proc.wait(timeout=30) != 0
    assert "line 1" in s.read_log()


# --- TIS ---------------------------------------------------------------------------------------------

def tis(s, pipeline, last_modified=None):
    form = {"pipeline": pipeline}
    if last_modified is not None:
        form["lastModified"] = str(last_modified)
    r = requests.post(s.url + TIS_PATH, data=form)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    return r.json()


def test_tis_poll_shape(sluice):
    empty = {"success": True, "errormsg": [], "msg": [], "bizresult": {}}
    # unknown pipeline: running at version 0, nothing newer than the client's lastModified
    assert tis(sluice, "tis-job", 0) == empty
    assert tis(sluice, "tis-job")["bizresult"] == {
        "pause": False, "lastModified": 0, "controllerType": "NoLimitParam", "payloadParams": {"rateLimitPerSecond": 0}}

    t = requests.post(job_url(sluice, "tis-job", "/pause")).json()["updated_at_ms"]
    assert tis(sluice, "tis-job", t - 1) == {"success": True, "errormsg": [], "msg": [], "bizresult": {
        "pause": True, "lastModified": t, "controllerType": "Paused", "payloadParams": {"rateLimitPerSecond": 0}}}
    assert tis(sluice, "tis-job", t) == empty
    # the exact bytes, key order included
    raw = requests.post(sluice.url + TIS_PATH, data={"pipeline": "tis-job", "lastModified": "0"}).text
    assert raw == ('{"success":true,"errormsg":[],"msg":[],"bizresult":{"pause":true,"lastModified":%d,'
                   '"controllerType":"Paused","payloadParams":{"rateLimitPerSecond":0}}}' % t)

    t = requests.post(job_url(sluice, "tis-job", "/rate-limit"), json={"per_second": 2500}).json()["updated_at_ms"]
    b = tis(sluice, "tis-job", t - 1)["bizresult"]
    assert b == {"pause": False, "lastModified": t, "controllerType": "RateLimit",
                 "payloadParams": {"rateLimitPerSecond": 2500}}
    t = requests.post(job_url(sluice, "tis-job", "/drain")).json()["updated_at_ms"]
    assert tis(sluice, "tis-job", t - 1)["bizresult"]["controllerType"] == "FloodDischargeRate"
    t = requests.post(job_url(sluice, "tis-job", "/resume")).json()["updated_at_ms"]
    assert tis(sluice, "tis-job", t - 1)["bizresult"]["controllerType"] == "NoLimitParam"

    r = requests.post(sluice.url + "/config/config.ajax?action=other", data={"pipeline": "x"})
    assert r.status_code == 400 and r.json()["success"] is False
    r = requests.post(sluice.url + TIS_PATH, data={})
    assert r.status_code == 400 and "pipeline" in r.json()["errormsg"][0]


def test_tis_poll_every_mode_and_drain(sluice):
    """Each of sluice's four modes reaches a polling TIS job as the controllerType TIS acts on; a
    drain of everything is a flood discharge, a drain by matchers is SkipProcess with the matchers
    (never FloodDischargeRate, which would discard the records the matchers spare). The poll is
    driven like TIS drives it: lastModified is the last answer's, so each change arrives once."""
    job = "tis-drain"
    last = tis(sluice, job)["bizresult"]["lastModified"]  # 0: never changed
    seen = []

    def change(path, body=None):
        nonlocal last
        r = requests.post(job_url(sluice, job, path), json=body) if body is not None else \
            requests.post(job_url(sluice, job, path))
        assert r.status_code == 200, r.text
        t = r.json()["updated_at_ms"]
        got = tis(sluice, job, last)["bizresult"]
        assert got["lastModified"] == t
        last = t
        assert tis(sluice, job, last)["bizresult"] == {}  # nothing newer: TIS keeps its state
        seen.append(got["controllerType"])
        return got

    assert change("/pause") == {"pause": True, "lastModified": last, "controllerType": "Paused",
                                "payloadParams": {"rateLimitPerSecond": 0}}
    assert change("/rate-limit", {"per_second": 700}) == {
        "pause": False, "lastModified": last, "controllerType": "RateLimit",
        "payloadParams": {"rateLimitPerSecond": 700}}
    # drain with no matchers: every record is discarded (TIS's flood discharge)
    assert change("/drain") == {"pause": False, "lastModified": last, "controllerType": "FloodDischargeRate",
                                "payloadParams": {"rateLimitPerSecond": 0}}
    # drain by matchers: only some records go, so not a flood discharge
    got = change("/drain", {"match": [{"attribute": "table", "regex": "^tmp_"}, "db=^scratch$"]})
    assert got == {"pause": False, "lastModified": last, "controllerType": "SkipProcess",
                   "payloadParams": {"rateLimitPerSecond": 0, "drain": [
                       {"attribute": "table", "regex": "^tmp_"}, {"attribute": "db", "regex": "^scratch$"}]}}
    # the same drain through PUT (the whole state) maps the same way
    r = requests.put(job_url(sluice, job), json={"mode": "draining", "drain": [{"attribute": "table",
                                                                                 "regex": "^tmp_"}]})
    assert r.status_code == 200, r.text
    b = tis(sluice, job, last)["bizresult"]
    assert b["controllerType"] == "SkipProcess" and b["payloadParams"]["drain"] == [
        {"attribute": "table", "regex": "^tmp_"}]
    last = b["lastModified"]
    r = requests.put(job_url(sluice, job), json={"mode": "draining"})
    assert r.status_code == 200, r.text
    b = tis(sluice, job, last)["bizresult"]
    assert b["controllerType"] == "FloodDischargeRate" and "drain" not in b["payloadParams"]
    last = b["lastModified"]
    assert change("/resume") == {"pause": False, "lastModified": last, "controllerType": "NoLimitParam",
                                 "payloadParams": {"rateLimitPerSecond": 0}}
    assert seen == ["Paused", "RateLimit", "FloodDischargeRate", "SkipProcess", "NoLimitParam"]

    # a temporary drain runs out: the poll reports the state that comes back
    r = requests.post(job_url(sluice, job, "/drain"), json={"match": ["table=^tmp_"], "for": "1s"})
    assert r.status_code == 200, r.text
    assert tis(sluice, job, last)["bizresult"]["controllerType"] == "SkipProcess"
    last = r.json()["updated_at_ms"]
    deadline = time.time() + 30
    while time.time() < deadline:
        b = tis(sluice, job, last)["bizresult"]
        if b:
            break
        time.sleep(0.1)
    assert b["controllerType"] == "NoLimitParam" and b["lastModified"] > last


# --- sluicectl -------------------------------------------------------------------------------------------

def ctl(s, *args, check=True):
    r = subprocess.run([SLUICECTL_BIN, "--server", s.url, *args], capture_output=True, text=True, timeout=60)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def test_sluicectl(sluice, tmp_path):
    r = ctl(sluice, "pause", "orders", "--reason", "db maintenance", "--for", "10m")
    assert "paused" in r.stdout and "db maintenance" in r.stdout and r.stdout.startswith("JOB")
    ctl(sluice, "rate-limit", "orders", "5000")
    ctl(sluice, "drain", "orders", "--match", "table=^tmp_")
    j = json.loads(ctl(sluice, "--output", "json", "get", "orders").stdout)
    assert j["drain"] == [{"attribute": "table", "regex": "^tmp_"}] and j["version"] == 3
    r = ctl(sluice, "jobs")
    assert "orders" in r.stdout and "draining" in r.stdout
    h = json.loads(ctl(sluice, "history", "orders", "--output=json").stdout)
    assert [e["mode"] for e in h["entries"]] == ["draining", "rate_limited", "paused"]
    r = ctl(sluice, "resume", "orders")
    assert "running" in r.stdout

    # watch follows the stream until stopped
    w = subprocess.Popen([SLUICECTL_BIN, "--server", sluice.url, "--output", "json", "watch", "orders"],
                         stdout=subprocess.PIPE, text=True)
    wait_until(lambda: metric(sluice, "sluice_control_stream_subscribers") == 1, "watch to subscribe")
    ctl(sluice, "pause", "orders")
    line = w.stdout.readline()
    w.terminate()
    w.wait(timeout=30)
    assert json.loads(line)["mode"] == "paused"

    r = ctl(sluice, "rate-limit", "orders", "0", check=False)
    assert r.returncode == 1 and "per_second" in r.stderr
    r = ctl(sluice, "frobnicate", "orders", check=False)
    assert r.returncode == 2 and "unknown command" in r.stderr
    r = subprocess.run([SLUICECTL_BIN, "--server", "http://127.0.0.1:1", "jobs"], capture_output=True, text=True)
    assert r.returncode == 1 and "cannot connect" in r.stderr


def test_sluicectl_token_file(start_sluice, tmp_path):
    tf = tmp_path / "tokens"
    tf.write_text("ops:ops-token-0123456789\n")
    s = start_sluice(f"--web.control-token-file={tf}")
    r = ctl(s, "pause", "j", check=False)
    assert r.returncode == 1 and "Bearer" in r.stderr and "401" in r.stderr
    r = ctl(s, "--token-file", str(tf), "pause", "j")
    assert "ops" in r.stdout
