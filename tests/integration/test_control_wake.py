"""Flow-control propagation (issue 19): parked long-polls answered by the control thread straight
on their sockets (a whole HTTP response, then the connection closed; HEAD polls through their
worker), group commit of concurrent changes (versions, event ids and the stream in commit order),
and durability of a change whose answer a client already has (SIGKILL right after it)."""
# ctest-labels:
import json
import os
import re
import socket
import threading

import requests

from test_control import SSE, job_url, metric, raw_read, raw_send, wait_until


def test_poll_answer_written_by_the_control_thread_is_a_whole_response(sluice):
    """The control thread writes a parked GET's answer straight to its socket: status, the same
    headers as any other answer, the body, and the connection is closed after it. A HEAD poll
    (no body) and a poll on a keep-alive connection that already carried a request are answered
    correctly too."""
    port = sluice.port
    get = raw_send(port, "/api/v1/control/jobs/w?version=0&wait=60s")
    head = socket.create_connection(("127.0.0.1", port), timeout=60)
    head.sendall(b"HEAD /api/v1/control/jobs/w?version=0&wait=60s HTTP/1.1\r\nHost: sluice\r\n\r\n")
    # a keep-alive connection: one ordinary request, then a poll on the same connection
    ka = raw_send(port, "/api/v1/control/jobs/w")
    status, headers, body = raw_read(ka)
    assert status == 200 and json.loads(body)["version"] == 0
    ka.sendall(b"GET /api/v1/control/jobs/w?version=0&wait=60s HTTP/1.1\r\nHost: sluice\r\n\r\n")
    wait_until(lambda: metric(sluice, "sluice_control_long_polls_parked") == 3, "three polls to park")
    r = requests.post(job_url(sluice, "w", "/pause"), json={"reason": "direct"})
    assert r.status_code == 200
    for s in (get, ka):
        status, headers, body = raw_read(s)
        assert status == 200
        assert headers["etag"] == '"1"' and headers["cache-control"] == "no-cache"
        assert headers["content-type"] == "application/json" and headers["connection"] == "close"
        assert re.match(r"\w{3}, \d{2} \w{3} \d{4} \d{2}:\d{2}:\d{2} GMT$", headers["date"])
        assert int(headers["content-length"]) == len(body)
        j = json.loads(body)
        assert (j["job"], j["mode"], j["version"], j["reason"]) == ("w", "paused", 1, "direct")
        assert j == r.json()
        # nothing after the answer: the server closes the connection
        s.settimeout(30)
        assert s.recv(1) == b""
        s.close()
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = head.recv(65536)
        assert chunk, "HEAD poll closed without an answer"
        data += chunk
    assert data.startswith(b"HTTP/1.1 200") and b'ETag: "1"' in data
    assert data.endswith(b"\r\n\r\n")  # no body
    head.close()
    wait_until(lambda: metric(sluice, "sluice_control_long_polls_parked") == 0, "no poll parked")
    assert metric(sluice, "sluice_control_long_polls_answered_total") == 3
    # the server is fine afterwards: a new poll parks and is answered
    s = raw_send(port, "/api/v1/control/jobs/w?version=1&wait=60s")
    wait_until(lambda: metric(sluice, "sluice_control_long_polls_parked") == 1, "the poll to park")
    requests.post(job_url(sluice, "w", "/resume"))
    status, headers, body = raw_read(s)
    assert status == 200 and json.loads(body)["version"] == 2
    s.close()


def test_concurrent_changes_group_commit_in_order(sluice):
    """Many changes at once are committed in groups (one fsync each): every one gets its own
    version, versions and event ids count up in the order the changes were committed, a
    version-checked change sees the ones before it, and parked polls get the newest state."""
    jobs = ["g1", "g2"]
    polls = [raw_send(sluice.port, f"/api/v1/control/jobs/{j}?version=0&wait=60s") for j in jobs for _ in range(5)]
    sse = SSE(sluice.url + "/api/v1/control/stream")
    wait_until(lambda: metric(sluice, "sluice_control_long_polls_parked") == 10, "ten polls to park")
    results = []
    lock = threading.Lock()

    def change(job, i):
        action = "/pause" if i % 2 == 0 else "/resume"
        r = requests.post(job_url(sluice, job, action), json={"reason": f"{job}-{i}"})
        with lock:
            results.append((job, r.status_code, r.json()))

    threads = [threading.Thread(target=change, args=(j, i)) for i in range(20) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(code == 200 for _, code, _ in results)
    for job in jobs:
        versions = sorted(b["version"] for j, _, b in results if j == job)
        assert versions == list(range(1, 21))
        hist = requests.get(job_url(sluice, job, "/history"), params={"limit": 100}).json()["entries"]
        # newest first; event ids and versions both strictly decreasing, updated_at never increasing
        assert [e["version"] for e in hist] == list(range(20, 0, -1))
        assert all(a["event_id"] > b["event_id"] for a, b in zip(hist, hist[1:]))
        assert all(a["updated_at_ms"] > b["updated_at_ms"] for a, b in zip(hist, hist[1:]))
        # what each change returned is what the log holds for its version
        by_version = {e["version"]: e for e in hist}
        for j, _, b in results:
            if j == job:
                assert by_version[b["version"]]["reason"] == b["reason"]
    # a version-checked change after all that: conflicts on a stale version, applies on the right one
    r = requests.put(job_url(sluice, "g1"), json={"mode": "running", "version": 19})
    assert r.status_code == 409
    r = requests.put(job_url(sluice, "g1"), json={"mode": "running", "version": 20})
    assert r.status_code == 200 and r.json()["version"] == 21
    # every poll was answered with a state newer than it had, of its own job
    for i, s in enumerate(polls):
        status, headers, body = raw_read(s)
        assert status == 200
        j = json.loads(body)
        assert j["job"] == jobs[i // 5] and j["version"] >= 1 and headers["etag"] == f'"{j["version"]}"'
        s.close()
    # the stream saw all 41 changes, event ids increasing, each job's versions in order
    seen = [sse.next() for _ in range(41)]
    ids = [int(e["id"]) for e in seen]
    assert ids == sorted(ids) and len(set(ids)) == 41
    for job in jobs:
        vs = [e["json"]["version"] for e in seen if e["json"]["job"] == job]
        assert vs == list(range(1, 21 + (job == "g1")))
    sse.close()


def test_answered_change_survives_kill9(start_sluice, tmpdir_path):
    """Once a parked poll has its answer, the change is on disk: SIGKILL right after the answer
    arrives (before the change's own request is even read) loses nothing."""
    data = os.path.join(tmpdir_path, "data-kill9")
    s = start_sluice(data_dir=data)
    for round_ in range(3):
        version = requests.get(job_url(s, "k")).json()["version"]
        poll = raw_send(s.port, f"/api/v1/control/jobs/k?version={version}&wait=60s")
        wait_until(lambda: metric(s, "sluice_control_long_polls_parked") == 1, "the poll to park")
        post = socket.create_connection(("127.0.0.1", s.port), timeout=60)
        body = json.dumps({"per_second": 100 + round_}).encode()
        post.sendall(b"POST /api/v1/control/jobs/k/rate-limit HTTP/1.1\r\nHost: sluice\r\n"
                     b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() +
                     b"\r\n\r\n" + body)
        status, _, answer = raw_read(poll)
        assert status == 200
        told = json.loads(answer)
        s.kill9()
        post.close()
        poll.close()
        s = start_sluice(data_dir=data)
        now = requests.get(job_url(s, "k")).json()
        assert (now["version"], now["rate_limit_per_second"]) == (told["version"], 100 + round_)
