"""GET /metrics streams the pushed groups (~8 MB here) in pieces, each sent once the previous
one drained, off the worker's critical path: with one HTTP worker and a scraper that does not
read, pushes, /-/healthy and /-/metrics are still answered while the render is in progress; the
streamed body is the registry as it was when the render began; a scraper that goes away or a
shutdown mid-stream leaves nothing behind (ASan exit status)."""
import re
import socket

import requests

GROUPS = 10
SERIES = 4000  # ~200 bytes a line: ~8 MB of pushed groups, about twice what the socket buffers hold


def body(g):
    lines = ["# HELP big_metric_bytes A wide family pushed by every group.", "# TYPE big_metric_bytes gauge"]
    for i in range(SERIES):
        lines.append(f'big_metric_bytes{{tm="taskmanager-{g:03d}",operator="Source: kafka-events -> '
                     f'Map -> Filter -> Window(TumblingEventTimeWindows) -> Sink {i:05d}",'
                     f'subtask="{i % 16}"}} {g * SERIES + i}')
    return ("\n".join(lines) + "\n").encode()


def push_all(s):
    for g in range(GROUPS):
        r = requests.put(f"{s.url}/metrics/job/stream/instance/tm{g}", data=body(g), timeout=120)
        assert r.status_code == 200, r.text


def slow_scraper(s):
    """Sends GET /metrics on a socket with a small receive buffer and reads only the headers."""
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.connect(("127.0.0.1", s.port))
    c.settimeout(120)
    c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        data = c.recv(1)
        assert data, "connection closed before the headers"
        head += data
    return c, head.decode()


def read_chunked(c):
    """The rest of a chunked body, de-chunked; asserts the terminating zero-length chunk."""
    buf = b""
    out = []

    def need(n):
        nonlocal buf
        while len(buf) < n:
            data = c.recv(1 << 20)
            assert data, "connection closed mid-body"
            buf += data

    while True:
        while b"\r\n" not in buf:
            need(len(buf) + 1)
        line, _, buf = buf.partition(b"\r\n")
        n = int(line.split(b";")[0], 16)
        need(n + 2)
        out.append(buf[:n])
        assert buf[n:n + 2] == b"\r\n"
        buf = buf[n + 2:]
        if n == 0:
            return b"".join(out)


def in_flight(s):
    text = requests.get(s.url + "/-/metrics", timeout=60).text
    return float(re.search(r"^sluice_http_requests_in_flight (\S+)", text, re.M).group(1))


def test_render_streams_while_worker_serves_others(start_sluice):
    s = start_sluice("--web.workers=1")
    push_all(s)
    c, head = slow_scraper(s)
    assert head.startswith("HTTP/1.1 200"), head
    assert "transfer-encoding: chunked" in head.lower(), head
    # The scraper reads nothing more; the same (only) worker answers the rest meanwhile.
    assert requests.get(s.url + "/-/healthy", timeout=60).status_code == 200
    r = requests.put(f"{s.url}/metrics/job/during/instance/x", data=b"pushed_during_render 1\n", timeout=60)
    assert r.status_code == 200, r.text
    assert requests.get(s.url + "/-/healthy", timeout=60).status_code == 200
    # ... while the render is still in progress: this request and the stalled stream.
    assert in_flight(s) >= 2
    text = read_chunked(c).decode()
    c.close()
    # The stream is the registry at the render's start: every pushed series, in Pushgateway
    # order, and not the group pushed after it began.
    lines = [ln for ln in text.split("\n") if ln.startswith("big_metric_bytes{")]
    assert len(lines) == GROUPS * SERIES
    assert "pushed_during_render" not in text
    assert text.index("# TYPE big_metric_bytes gauge") < text.index("# TYPE push_time_seconds gauge")
    # sluice's own metrics follow the pushed groups, as in a one-shot render.
    assert re.search(r"^process_start_time_seconds ", text, re.M)
    # A scrape now (read at once) shows the same pushed series plus the new group.
    now = requests.get(s.url + "/metrics", timeout=120).text
    assert [ln for ln in now.split("\n") if ln.startswith("big_metric_bytes{")] == lines
    assert re.search(r'^pushed_during_render\{instance="x",job="during"\} 1$', now, re.M)


def test_scraper_gone_mid_stream_and_shutdown_mid_stream(start_sluice):
    s = start_sluice("--web.workers=1", "--web.shutdown-timeout=1s")
    push_all(s)
    # A scraper that leaves after the headers: its render is dropped (pins released).
    for _ in range(3):
        c, head = slow_scraper(s)
        assert head.startswith("HTTP/1.1 200"), head
        c.close()
    assert requests.get(s.url + "/-/healthy", timeout=60).status_code == 200
    whole = requests.get(s.url + "/metrics", timeout=120).text
    assert len([ln for ln in whole.split("\n") if ln.startswith("big_metric_bytes{")]) == GROUPS * SERIES
    # Replacing every group while a stalled stream pins the old ones, then shutting down with
    # the stream still open: the exit status (ASan) tells whether anything leaked or was freed
    # while in use.
    c, head = slow_scraper(s)
    push_all(s)
    assert in_flight(s) >= 2
    assert s.stop() == 0, s.read_log()
    c.close()
