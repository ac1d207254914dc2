"""POST /api/v1/write (remote write 1.0) and GET /api/v1/metadata against the built sluice, with a
hand-written client (promproto.py): what is stored reads back bit for bit; every malformed or
refused request gets its exact status code and a one-line reason; a refused request stores
nothing (except the documented out-of-order case); a fuzzed stream of bodies never crashes the
daemon or half-writes a request."""
import json
import random
import struct
import time
import urllib.parse
import urllib.request

import snappy

import promproto as pp


def now_s():
    return int(time.time()) * 1000


def read_all(sl, matchers, start=None, end=None):
    """{labels: [(t, bits)]} from a SAMPLES read."""
    end = end or now_s() + 60000
    start = start or end - 3 * 3600 * 1000
    st, _, res = pp.remote_read(sl.url, [(start, end, matchers, None)])
    assert st == 200, res
    return {labels: samples for labels, samples in res[0]}


def lbl(name, **kw):
    return [("__name__", name)] + sorted(kw.items())


def key(name, **kw):
    return tuple(sorted([("__name__", name)] + list(kw.items())))


def test_write_read_back_bit_exact(start_sluice):
    sl = start_sluice()
    t0 = now_s() - 1800000
    specials = [0.0, -0.0, 1.5, float("inf"), float("-inf"), 5e-324, 1.7976931348623157e308,
                pp.bits2f(pp.STALE_NAN_BITS), float("nan"), 42.0]
    series = [
        (lbl("rw_a", job="x", instance="i1"), [(t0 + i * 10000, v) for i, v in enumerate(specials)]),
        # unsorted labels are tolerated
        ([("zone", "z"), ("__name__", "rw_a"), ("job", "x"), ("instance", "i2")],
         [(t0 + i * 15000, float(i)) for i in range(100)]),
        (lbl("rw_b", job="y"), [(t0 + 5000, 3.25)]),
    ]
    st, _, body = pp.remote_write(sl.url, series)
    assert st == 204, body
    got = read_all(sl, [(pp.RE, "__name__", "rw_.*")])
    assert set(got) == {key("rw_a", job="x", instance="i1"), key("rw_a", job="x", instance="i2", zone="z"),
                        key("rw_b", job="y")}
    assert got[key("rw_a", job="x", instance="i1")] == [(t0 + i * 10000, pp.f2bits(v))
                                                       for i, v in enumerate(specials)]
    assert got[key("rw_a", job="x", instance="i2", zone="z")] == [(t0 + i * 15000, pp.f2bits(float(i)))
                                                                  for i in range(100)]
    assert got[key("rw_b", job="y")] == [(t0 + 5000, pp.f2bits(3.25))]


def test_empty_request_and_series_without_samples(start_sluice):
    sl = start_sluice()
    assert pp.remote_write(sl.url, [])[0] == 204
    assert pp.remote_write(sl.url, [(lbl("rw_nosamples", job="x"), [])])[0] == 204
    assert read_all(sl, [(pp.EQ, "__name__", "rw_nosamples")]) == {}


def test_sub_second_samples_last_one_of_a_second_wins(start_sluice):
    """The raw tier keeps one sample per series per second: inside a request a later sample of the
    same second replaces the earlier one, as does a later request."""
    sl = start_sluice()
    t = now_s() - 120000
    assert pp.remote_write(sl.url, [(lbl("rw_sub", job="x"), [(t + 100, 1.0), (t + 700, 2.0), (t + 1200, 3.0)])])[0] == 204
    got = read_all(sl, [(pp.EQ, "__name__", "rw_sub")])
    assert got[key("rw_sub", job="x")] == [(t + 700, pp.f2bits(2.0)), (t + 1200, pp.f2bits(3.0))]
    assert pp.remote_write(sl.url, [(lbl("rw_sub", job="x"), [(t + 1900, 4.0)])])[0] == 204
    got = read_all(sl, [(pp.EQ, "__name__", "rw_sub")])
    assert got[key("rw_sub", job="x")] == [(t + 700, pp.f2bits(2.0)), (t + 1900, pp.f2bits(4.0))]


def raw_write(sl, body, headers=None, compress=True):
    data = snappy.compress(body) if compress else body
    return pp.remote_write(sl.url, None, raw=data, headers=headers)


def good_ts(name, t):
    return pp.bytes_field(1, pp.timeseries(lbl(name, job="x"), [(t, 1.0)]))


def test_bad_requests_exact_status_and_nothing_stored(start_sluice):
    sl = start_sluice()
    t = now_s() - 60000
    ok = good_ts("rw_bad_ok", t)  # a valid series riding along in every bad request

    def series_msg(labels, samples):
        return pp.bytes_field(1, pp.timeseries(labels, samples))

    cases = [
        ("garbage body, not snappy", 400, b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", False, None),
        ("bad snappy (valid length, corrupt data)", 400, b"\x20\xfa\x00\x00\x01\x02\x03", False, None),
        ("huge declared length", 413, pp.uvarint(1 << 31) + b"\x00\x01", False, None),
        ("truncated protobuf", 400, (ok + ok)[:-3], True, None),
        ("wrong wire type for timeseries", 400, ok + pp.varint_field(1, 5), True, None),
        ("wrong wire type for a sample value", 400,
         ok + pp.bytes_field(1, pp.bytes_field(1, pp.label_msg("__name__", "rw_bad_x"))
                             + pp.bytes_field(2, pp.varint_field(1, 7) + pp.varint_field(2, t))), True, None),
        ("varint longer than 10 bytes", 400, ok + b"\x0a" + b"\xff" * 11 + b"\x01", True, None),
        ("length past the end", 400, ok + b"\x0a\x7f\x0a", True, None),
        ("duplicate label names", 400, ok + series_msg([("__name__", "rw_bad_x"), ("a", "1"), ("a", "2")], [(t, 1.0)]), True, None),
        ("empty label value", 400, ok + series_msg([("__name__", "rw_bad_x"), ("a", "")], [(t, 1.0)]), True, None),
        ("invalid label name", 400, ok + series_msg([("__name__", "rw_bad_x"), ("a-b", "1")], [(t, 1.0)]), True, None),
        ("missing __name__", 400, ok + series_msg([("job", "x")], [(t, 1.0)]), True, None),
        ("invalid metric name", 400, ok + series_msg([("__name__", "1abc")], [(t, 1.0)]), True, None),
        ("invalid UTF-8 value", 400, ok + series_msg([("__name__", "rw_bad_x"), ("a", b"\xff\xfe")], [(t, 1.0)]), True, None),
        ("out of order inside one series", 400, ok + series_msg(lbl("rw_bad_x", job="x"), [(t, 1.0), (t - 1000, 2.0)]), True, None),
        ("duplicate timestamp inside one series", 400, ok + series_msg(lbl("rw_bad_x", job="x"), [(t, 1.0), (t, 2.0)]), True, None),
        ("remote write 2.0", 415, ok, True,
         {"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request", "Content-Encoding": "snappy",
          "X-Prometheus-Remote-Write-Version": "2.0.0"}),
        ("gzip content encoding", 415, ok, True, {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}),
    ]
    for name, want, body, compress, headers in cases:
        st, _, reply = raw_write(sl, body, headers=headers, compress=compress)
        assert st == want, (name, st, reply)
        text = reply.decode()
        assert text.endswith("\n") and text.count("\n") == 1 and len(text) > 5, (name, text)
    assert read_all(sl, [(pp.RE, "__name__", "rw_bad_.*")]) == {}
    # the same valid series alone is accepted: the refusals were about the bad parts
    assert raw_write(sl, ok)[0] == 204
    assert list(read_all(sl, [(pp.RE, "__name__", "rw_bad_.*")])) == [key("rw_bad_ok", job="x")]


def test_out_of_order_against_stored_is_400_and_keeps_the_rest(start_sluice):
    sl = start_sluice()
    t = now_s() - 60000
    assert pp.remote_write(sl.url, [(lbl("rw_ooo", job="x"), [(t, 1.0)])])[0] == 204
    st, _, reply = pp.remote_write(sl.url, [(lbl("rw_ooo", job="x"), [(t - 5000, 2.0)]),
                                           (lbl("rw_ooo", job="y"), [(t - 5000, 3.0)])])
    assert st == 400, reply
    assert b"out of order" in reply and b"1 of 2" in reply
    got = read_all(sl, [(pp.EQ, "__name__", "rw_ooo")])
    assert got[key("rw_ooo", job="x")] == [(t, pp.f2bits(1.0))]
    assert got[key("rw_ooo", job="y")] == [(t - 5000, pp.f2bits(3.0))]
    # too old for the raw tier (retention 2h)
    st, _, reply = pp.remote_write(sl.url, [(lbl("rw_ooo", job="z"), [(now_s() - 5 * 3600 * 1000, 1.0)])])
    assert st == 400, reply


def test_limits(start_sluice):
    sl = start_sluice("--storage.max-samples-per-request=10", "--storage.max-series=3")
    t = now_s() - 60000
    st, _, reply = pp.remote_write(sl.url, [(lbl("rw_lim", job="x"), [(t + i * 1000, 1.0) for i in range(11)])])
    assert st == 400 and b"limit" in reply, reply
    assert read_all(sl, [(pp.EQ, "__name__", "rw_lim")]) == {}
    # max-series is a condition a retry can fix (series expire): 503
    st, _, reply = pp.remote_write(sl.url, [(lbl("rw_lim", job=str(i)), [(t, 1.0)]) for i in range(5)])
    assert st == 503, reply


def head_series(sl):
    with urllib.request.urlopen(sl.url + "/-/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("sluice_storage_head_series "):
                return float(line.split()[1])
    raise AssertionError("no sluice_storage_head_series")


def series_names(sl, name):
    q = urllib.parse.urlencode({"match[]": '{__name__="%s"}' % name})
    return get_json(sl.url + "/api/v1/series?" + q)["data"]


def test_refused_request_creates_no_series(start_sluice, tmp_path):
    """A request over --storage.max-series-per-request is refused whole and leaves nothing behind:
    no series in memory, none in the catalog after a restart, no share of --storage.max-series
    (before, the series resolved before the limit tripped stayed and locked new series out)."""
    data = str(tmp_path / "data")
    args = ("--storage.max-series-per-request=50", "--storage.max-series=80")
    sl = start_sluice(*args, data_dir=data)
    t = now_s() - 60000
    st, _, reply = pp.remote_write(sl.url, [(lbl("rw_refused", i=str(i)), [(t, 1.0)]) for i in range(51)])
    assert st == 400 and b"more than 50 series" in reply, reply
    assert head_series(sl) == 0
    assert series_names(sl, "rw_refused") == []
    # All of --storage.max-series is still there for a request within the limits.
    st, _, reply = pp.remote_write(sl.url, [(lbl("rw_kept", i=str(i)), [(t, 2.0)]) for i in range(50)])
    assert st == 204, reply
    assert head_series(sl) == 50
    assert sl.stop() == 0
    sl = start_sluice(*args, data_dir=data)
    assert series_names(sl, "rw_refused") == []
    assert len(series_names(sl, "rw_kept")) == 50


def test_future_samples_refused(start_sluice):
    """A sample stamped far ahead (a broken clock, INT64_MAX) would make every later sample of its
    series out of order until then: beyond --storage.max-future it is refused with 400, the rest
    of the request is stored, and the series keeps taking samples."""
    sl = start_sluice("--storage.max-future=10m")
    t = now_s()
    far = [(lbl("rw_future", k="year"), [(t + 365 * 86400 * 1000, 1.0)]),
           (lbl("rw_future", k="max"), [(2**63 - 1, 2.0)]),
           (lbl("rw_future", k="ok"), [(t - 5000, 3.0), (t + 60000, 4.0)])]  # a minute ahead is fine
    st, _, reply = pp.remote_write(sl.url, far)
    assert st == 400 and b"too far in the future" in reply and b"2 of 4 samples refused" in reply, reply
    got = read_all(sl, [(pp.EQ, "__name__", "rw_future")], end=t + 3600 * 1000)
    assert set(got) == {key("rw_future", k="ok")}, got
    # the refused series are not poisoned: a sample of now is taken
    st, _, reply = pp.remote_write(sl.url, [(lbl("rw_future", k="max"), [(t, 5.0)])])
    assert st == 204, reply


def test_decode_limit_follows_body_limit(start_sluice):
    sl = start_sluice("--web.max-body-size=64KiB")
    t = now_s() - 60000
    series = [(lbl("rw_big", job="x", pad="p" * 200, i=str(i)), [(t, 1.0)]) for i in range(400)]
    body = snappy.compress(pp.write_request(series))
    assert len(body) < 64 * 1024 < len(pp.write_request(series))
    st, _, reply = pp.remote_write(sl.url, None, raw=body)
    assert st == 413, reply
    assert read_all(sl, [(pp.EQ, "__name__", "rw_big")]) == {}


def get_json(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_metadata(start_sluice):
    sl = start_sluice()
    t = now_s() - 60000
    md = [(1, "md_requests_total", "Requests.", ""), (2, "md_temp", "Temperature \"now\".", "celsius"),
          (5, "md_latency", "Latency.", "seconds")]
    assert pp.remote_write(sl.url, [(lbl("md_temp", job="x"), [(t, 1.0)])], metadata=md)[0] == 204
    d = get_json(sl.url + "/api/v1/metadata")
    assert d["status"] == "success"
    assert d["data"] == {
        "md_latency": [{"type": "summary", "help": "Latency.", "unit": "seconds"}],
        "md_requests_total": [{"type": "counter", "help": "Requests.", "unit": ""}],
        "md_temp": [{"type": "gauge", "help": "Temperature \"now\".", "unit": "celsius"}],
    }
    assert list(get_json(sl.url + "/api/v1/metadata?metric=md_temp")["data"]) == ["md_temp"]
    assert get_json(sl.url + "/api/v1/metadata?metric=nope")["data"] == {}
    assert len(get_json(sl.url + "/api/v1/metadata?limit=2")["data"]) == 2
    assert get_json(sl.url + "/api/v1/metadata?limit_per_metric=0")["data"]["md_temp"] == []
    # newer metadata replaces older
    assert pp.remote_write(sl.url, [], metadata=[(2, "md_temp", "Temp.", "kelvin")])[0] == 204
    assert get_json(sl.url + "/api/v1/metadata?metric=md_temp")["data"]["md_temp"] == [
        {"type": "gauge", "help": "Temp.", "unit": "kelvin"}]
    try:
        urllib.request.urlopen(sl.url + "/api/v1/metadata?limit=x", timeout=10)
        assert False, "limit=x accepted"
    except urllib.error.HTTPError as e:
        assert e.code == 400
        assert json.loads(e.read())["errorType"] == "bad_data"


def mutate(rng, body):
    b = bytearray(body)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        if op == 0 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 1 and b:
            del b[rng.randrange(len(b)):]
        elif op == 2:
            pos = rng.randrange(len(b) + 1)
            b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 3 and b:
            pos = rng.randrange(len(b))
            b[pos] ^= 1 << rng.randrange(8)
        else:
            pos = rng.randrange(len(b) + 1)
            b[pos:pos] = pp.uvarint(rng.choice([0x7fffffff, 1 << 40, 2 ** 63, 300]))
    return bytes(b)


def test_fuzzed_bodies_never_crash_or_half_write(start_sluice):
    sl = start_sluice()
    rng = random.Random(1234)
    t = now_s() - 600000
    accepted, refused, replies = set(), set(), {}
    for i in range(400):
        # "it" names the request; "chk" repeats it so a mutation that turns another request's
        # "it" into this one's cannot be mistaken for a half-write of this one.
        series = [(lbl("fz_m%d" % (j % 3), it=str(i), chk=str(i), s=str(j)), [(t + k * 1000, float(k)) for k in range(3)])
                  for j in range(4)]
        body = pp.write_request(series, [(1, "fz_m0", "h", "")])
        mutated = mutate(rng, body)
        snappy_level = rng.random() < 0.8
        data = snappy.compress(mutated) if snappy_level else mutate(rng, snappy.compress(body))
        st, _, reply = pp.remote_write(sl.url, None, raw=data)
        assert st in (204, 400, 413), (i, st, reply)
        if st == 204:
            accepted.add(str(i))
        elif b"others were stored" not in reply:
            refused.add(str(i))
            replies[str(i)] = reply
    assert accepted and refused
    got = read_all(sl, [(pp.RE, "__name__", ".+")])
    for labels in got:
        it = dict(labels).get("it")
        if it != dict(labels).get("chk"):
            continue  # a mutated label set of some accepted request
        assert it not in refused, ("a refused request left series behind", labels, replies.get(it))
    assert sl.proc.poll() is None
    assert pp.remote_write(sl.url, [(lbl("fz_after", job="x"), [(now_s(), 1.0)])])[0] == 204
