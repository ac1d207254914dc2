"""POST /api/v1/read against the built sluice with a hand-written client (promproto.py):
response-type negotiation, SAMPLES shape and sample limit, STREAMED_XOR_CHUNKS frames (CRC,
one series per frame, frame budget, series order, query_index, chunks trimmed to the range and
decoded by build/tests/tools/xor_roundtrip to exactly the stored samples, the head's integer
chunks among them), bad requests, and a slow reader of a large streamed answer not growing
sluice's memory by the answer's size."""
import os
import random
import socket
import subprocess
import time
import urllib.request

import snappy

import promproto as pp


def now_s():
    return int(time.time()) * 1000


def lbl(name, **kw):
    return [("__name__", name)] + sorted(kw.items())


def key(name, **kw):
    return tuple(sorted([("__name__", name)] + list(kw.items())))


def write_series(sl, series, batch=200):
    for i in range(0, len(series), batch):
        st, _, body = pp.remote_write(sl.url, series[i:i + batch])
        assert st == 204, body


def xor_decode(chunks):
    tool = os.path.join(os.environ["SLUICE_TOOLS_DIR"], "xor_roundtrip")
    p = subprocess.run([tool], input="".join(c.hex() + "\n" for c in chunks).encode(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    out = []
    for line in p.stdout.decode().splitlines():
        count, _, lst = line.split(" ")
        samples = [(int(t), int(v, 16)) for t, v in (it.split(":") for it in lst.split(","))] if lst else []
        assert len(samples) == int(count)
        out.append(samples)
    return out


def test_negotiation(start_sluice):
    sl = start_sluice()
    t = now_s() - 60000
    write_series(sl, [(lbl("rr_neg", job="x"), [(t, 1.0)])])
    q = [(t - 1000, t + 1000, [(pp.EQ, "__name__", "rr_neg")], None)]
    for accepted, want in [((), "samples"), ((pp.SAMPLES,), "samples"), ((pp.STREAMED_XOR_CHUNKS,), "streamed"),
                           ((pp.STREAMED_XOR_CHUNKS, pp.SAMPLES), "streamed"),
                           ((pp.SAMPLES, pp.STREAMED_XOR_CHUNKS), "samples"), ((7, pp.STREAMED_XOR_CHUNKS), "streamed")]:
        st, hdrs, body = pp.remote_read(sl.url, q, accepted)
        assert st == 200, (accepted, body)
        ctype = hdrs.get("Content-Type")
        if want == "samples":
            assert ctype == "application/x-protobuf" and hdrs.get("Content-Encoding") == "snappy"
            assert body == [[(key("rr_neg", job="x"), [(t, pp.f2bits(1.0))])]]
        else:
            assert ctype == "application/x-streamed-protobuf; proto=prometheus.ChunkedReadResponse", ctype
            assert hdrs.get("Content-Encoding") is None
            frames = list(pp.parse_frames(body))
            assert [(f[0], f[1]) for f in frames] == [(0, key("rr_neg", job="x"))]
    st, _, body = pp.remote_read(sl.url, q, (7, 9))
    assert st == 400 and b"response types" in body, body


def test_bad_requests(start_sluice):
    sl = start_sluice()
    t = now_s()
    cases = [
        (b"\xff\xff\xff\xff\xff", False, 400),              # not snappy
        (b"\x0a\x05\x08", True, 400),                      # truncated protobuf
        (pp.uvarint(1 << 31) + b"\x00", False, 413),       # huge declared length
    ]
    for body, compress, want in cases:
        st, _, reply = pp.remote_read(sl.url, None, raw=snappy.compress(body) if compress else body)
        assert st == want, (body, st, reply)
    st, _, reply = pp.remote_read(sl.url, [(t - 1000, t, [(pp.RE, "__name__", "a(")], None)])
    assert st == 400 and b"regexp" in reply, reply
    st, _, reply = pp.remote_read(sl.url, [(t - 1000, t, [(pp.RE, "__name__", "a(")], None)], (pp.STREAMED_XOR_CHUNKS,))
    assert st == 400, reply


def test_samples_multiple_queries_ranges_and_hints(start_sluice):
    sl = start_sluice()
    t0 = now_s() - 1800000
    series = [(lbl("rr_s", job="a", i=str(i)), [(t0 + k * 10000, float(i * 1000 + k)) for k in range(100)])
              for i in range(5)]
    series.append((lbl("rr_other", job="b"), [(t0 + 5000, 7.0)]))
    write_series(sl, series)
    st, _, res = pp.remote_read(sl.url, [
        (t0 + 100000, t0 + 200000, [(pp.EQ, "__name__", "rr_s"), (pp.NEQ, "i", "3")],
         {"step_ms": 10000, "func": "rate", "range_ms": 60000, "start_ms": t0 + 100000, "end_ms": t0 + 200000}),
        (t0, t0 + 10000, [(pp.RE, "job", "b|c")], None),
        (t0, t0 + 10000, [(pp.EQ, "__name__", "nothing_here")], None),
    ])
    assert st == 200, res
    assert len(res) == 3
    assert [s[0] for s in res[0]] == [key("rr_s", job="a", i=str(i)) for i in (0, 1, 2, 4)]
    for labels, samples in res[0]:
        i = int(dict(labels)["i"])
        assert samples == [(t0 + k * 10000, pp.f2bits(float(i * 1000 + k))) for k in range(10, 21)]
    assert res[1] == [(key("rr_other", job="b"), [(t0 + 5000, pp.f2bits(7.0))])]
    assert res[2] == []


def test_sample_limit(start_sluice):
    sl = start_sluice("--storage.remote.read-sample-limit=50")
    t0 = now_s() - 1800000
    write_series(sl, [(lbl("rr_lim", i=str(i)), [(t0 + k * 10000, 1.0) for k in range(20)]) for i in range(3)])
    q = [(t0, t0 + 3600000, [(pp.EQ, "__name__", "rr_lim")], None)]
    st, _, body = pp.remote_read(sl.url, q)
    assert st == 400 and body == b"exceeded sample limit (50)\n", body
    st, _, res = pp.remote_read(sl.url, [(t0, t0 + 100000, [(pp.EQ, "__name__", "rr_lim")], None)])
    assert st == 200 and sum(len(s) for _, s in res[0]) == 33
    # the queries of one request share the limit: two copies of a 33-sample query exceed 50
    small = (t0, t0 + 100000, [(pp.EQ, "__name__", "rr_lim")], None)
    st, _, body = pp.remote_read(sl.url, [small, small])
    assert st == 400 and body == b"exceeded sample limit (50)\n", body
    # streamed answers have no sample limit, as in Prometheus
    st, _, body = pp.remote_read(sl.url, q, (pp.STREAMED_XOR_CHUNKS,))
    assert st == 200 and len(list(pp.parse_frames(body))) == 3


def test_streamed_frames_chunks_and_trimming(start_sluice):
    budget = 1024
    sl = start_sluice("--storage.remote.read-max-bytes-in-frame=%d" % budget)
    t0 = (now_s() - 5400000) // 60000 * 60000
    expected = {}
    series = []
    for i in range(40):
        # series 0..4 are long (1 s resolution, 3000 samples: many chunks, several frames each);
        # 0..2 hold integers, which the head keeps in its own encoding once a chunk is closed and
        # which must still leave as XOR chunks
        n, step = (3000, 1000) if i < 5 else (50, 15000)
        if i < 3:
            pts = [(t0 + k * step + (i % 7), float(k * 1000 + (k * k + i) % 97)) for k in range(n)]
        else:
            pts = [(t0 + k * step + (i % 7), float((k * 37 + i) % 1000) / 8.0) for k in range(n)]
        labels = lbl("rr_stream", job="j%d" % (i % 3), i="%02d" % i)
        series.append((labels, pts))
        expected[tuple(sorted(labels))] = [(t, pp.f2bits(v)) for t, v in pts]
    write_series(sl, series, batch=5)
    start, end = t0 + 123456, t0 + 2000000  # cuts chunks on both sides
    q = [(start, end, [(pp.EQ, "__name__", "rr_stream")], None),
         (t0, t0 + 3600000, [(pp.EQ, "__name__", "rr_stream"), (pp.EQ, "i", "07")], None)]
    st, _, body = pp.remote_read(sl.url, q, (pp.STREAMED_XOR_CHUNKS,))
    assert st == 200
    frames = list(pp.parse_frames(body))
    order = []
    chunks_by_series = {}
    max_chunk = 0
    for qi, labels, chunks, flen in frames:
        assert chunks, "a frame without chunks"
        k = (qi, labels)
        if not order or order[-1] != k:
            assert k not in chunks_by_series, "a series came back after another one"
            order.append(k)
        chunks_by_series.setdefault(k, []).extend(chunks)
        max_chunk = max(max_chunk, max(len(c[3]) for c in chunks))
        # frame budget: exceeded by at most one chunk (plus its few bytes of framing)
        assert flen <= budget + max(len(c[3]) for c in chunks) + 64, flen
    assert [k for k in order if k[0] == 0] == sorted(k for k in order if k[0] == 0)
    assert [k[0] for k in order] == sorted(k[0] for k in order), "queries out of order"
    assert len([k for k in order if k[0] == 0]) == 40
    assert [k for k in order if k[0] == 1] == [(1, key("rr_stream", job="j1", i="07"))]

    flat = [(k, c) for k in order for c in chunks_by_series[k]]
    decoded = xor_decode([c[3] for _, c in flat])
    got = {}
    for (k, (cmin, cmax, ctype, _)), samples in zip(flat, decoded):
        assert ctype == 1
        assert samples and samples[0][0] == cmin and samples[-1][0] == cmax
        got.setdefault(k, []).extend(samples)
    for (qi, labels), samples in got.items():
        lo, hi = (start, end) if qi == 0 else (t0, t0 + 3600000)
        assert samples == [s for s in expected[labels] if lo <= s[0] <= hi], labels
    nframes = {k: sum(1 for f in frames if (f[0], f[1]) == k) for k in order}
    long_ = [k for k in order if k[0] == 0 and int(dict(k[1])["i"]) < 5]
    assert all(nframes[k] > 1 for k in long_), ("long series should span several frames", nframes)
    m = urllib.request.urlopen(sl.url + "/metrics", timeout=10).read().decode()
    assert "sluice_remote_read_chunks_reencoded_total 0" not in m


def rss(sl):
    for line in urllib.request.urlopen(sl.url + "/metrics", timeout=30).read().decode().splitlines():
        if line.startswith("process_resident_memory_bytes "):
            return float(line.split()[1])
    raise AssertionError("no process_resident_memory_bytes")


def test_slow_reader_does_not_buffer_the_answer(start_sluice):
    # Under AddressSanitizer freed memory sits in a quarantine (256 MB by default) and would count
    # as growth for every piece sent; keep it small so RSS shows what is actually held.
    asan = os.environ.get("ASAN_OPTIONS", "")
    sl = start_sluice(env={"ASAN_OPTIONS": (asan + ":" if asan else "") + "quarantine_size_mb=1"})
    t0 = (now_s() - 7000000) // 1000 * 1000
    n_series, n_samples = 400, 6000  # 2.4M random values: about 20 MB of chunks on the wire
    rng = random.Random(7)
    for i in range(0, n_series, 10):
        batch = [(lbl("rr_big", i="%04d" % j), [(t0 + k * 1000, rng.random()) for k in range(n_samples)])
                 for j in range(i, i + 10)]
        st, _, body = pp.remote_write(sl.url, batch)
        assert st == 204, body
    time.sleep(0.5)
    before = rss(sl)
    req = snappy.compress(pp.read_request([(t0, t0 + 7200000, [(pp.EQ, "__name__", "rr_big")], None)],
                                          (pp.STREAMED_XOR_CHUNKS,)))
    s = socket.create_connection(("127.0.0.1", sl.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    s.sendall(("POST /api/v1/read HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
               "Content-Encoding: snappy\r\nContent-Length: %d\r\n\r\n" % len(req)).encode() + req)
    received = 0
    peak = before
    data = bytearray()
    deadline = time.time() + 240
    while time.time() < deadline:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
        received += len(chunk)
        if received < 4 * 1024 * 1024:
            time.sleep(0.02)  # slow for the first 4 MiB, while sluice could be racing ahead
            if received % (256 * 1024) < 65536:
                peak = max(peak, rss(sl))
        if data.endswith(b"\r\n0\r\n\r\n"):
            break
    s.close()
    total = len(data)
    assert total > 15 * 1024 * 1024, total
    # sluice must not have buffered the answer: its RSS grew by far less than the answer's size
    print("rss before %d peak %d answer %d" % (before, peak, total))
    assert peak - before < total / 3, (before, peak, total)
