"""XOR chunk interop: storage/chunk_xor.c against a real Prometheus (Debian's 2.42).

How it works:
  1. Write an OpenMetrics file whose series cover the awkward corners of the XOR encoding:
     timestamps whose delta-of-delta falls in every bucket (0, 14, 17, 20 and 64 bits, both
     signs), NaN, +Inf, -Inf, -0, denormals, DBL_MAX, repeated values, and a long series so
     Prometheus cuts several 120-sample chunks, plus one series crossing a 2h block boundary.
  2. Backfill it with `promtool tsdb create-blocks-from openmetrics`, start `prometheus` on that
     TSDB, and ask /api/v1/read for STREAMED_XOR_CHUNKS, i.e. Prometheus' own chunk bytes.
  3. Parse the frames (uvarint length, big-endian CRC32C, ChunkedReadResponse), check the CRCs,
     and hand every chunk to build/tests/tools/xor_roundtrip, which decodes it with our iterator
     and re-encodes the samples with our appender.
  4. Assert per chunk: our re-encoding is byte-identical to Prometheus' chunk, the chunk's
     min/max time match its first/last sample; per series: the decoded samples are exactly the
     backfilled ones (values compared by their IEEE-754 bits, so NaN payloads and -0 count).

Protobuf and CRC32C are hand-written here (no python protobuf on Debian's python3 in CI).
Nothing is skipped: a missing promtool/prometheus is a failure (deploy/install-deps.sh installs
both).
"""
# ctest-labels: peer

import math
import os
import shutil
import struct
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest
import snappy

GO_NAN_BITS = 0x7FF8000000000001  # what Go's strconv.ParseFloat("NaN") returns

# --------------------------------------------------------------------------------------------
# Minimal protobuf wire format
# --------------------------------------------------------------------------------------------


# Protobuf wire helpers and CRC32C are shared with the remote read/write tests.
from promproto import bytes_field as pb_bytes_field  # noqa: E402
from promproto import crc32c, f2bits, read_uvarint, to_int64  # noqa: E402
from promproto import parse as pb_parse  # noqa: E402
from promproto import uvarint as pb_uvarint  # noqa: E402
from promproto import varint_field as pb_varint_field  # noqa: E402
from conftest import free_port  # noqa: E402


def pb_int64(n):
    return pb_uvarint(n & 0xFFFFFFFFFFFFFFFF)


def test_crc32c_check_value():
    assert crc32c(b"123456789") == 0xE3069283


# --------------------------------------------------------------------------------------------
# Test data
# --------------------------------------------------------------------------------------------


def format_value(v):
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)  # shortest round-trip digits, which Go's ParseFloat reads back exactly


def format_ts(ms):
    return "%d.%03d" % (ms // 1000, ms % 1000)


def parsed_ms(ms):
    """The ms timestamp Prometheus' OpenMetrics parser makes of format_ts(ms): int64(ts*1000)."""
    return int(float(format_ts(ms)) * 1000)


def exact_ms(ms):
    """The nearest ms >= ms that survives the seconds-as-float round trip unchanged."""
    while parsed_ms(ms) != ms:
        ms += 1
    return ms


def dod_bucket(dod):
    if dod == 0:
        return 0
    for bits in (14, 17, 20):
        if -((1 << (bits - 1)) - 1) <= dod <= 1 << (bits - 1):
            return bits
    return 64


def build_series(window_start_ms):
    """{(metric name, ((label, value), ...)): [(ts_ms, value_bits)]} with float values kept too."""
    series = {}
    w = window_start_ms

    # Irregular timestamps: each gap change below lands in a chosen dod bucket (both signs).
    gaps = [15000, 15000, 15000,        # dod 0
            15001, 15000,               # dod +1, -1 (14 bits)
            23192, 15000,               # +8192 (edge of 14 bits), -8192 (17 bits)
            80536, 15000,               # +65536 (17 bits edge), -65536 (20 bits)
            539288, 15000,              # +524288 (20 bits edge), -524288 (64 bits)
            1200000, 1,                 # +20 min (64 bits), back to 1 ms (64 bits, negative)
            2, 4, 100, 5000, 70000, 3000, 600000, 599999, 15000,
            215000, 15000, 45000, 15000, 16000]  # mid-bucket: 20 bits +/-, 17 bits +/-, 14 bits +
    vals = [1.0, 1.0, 2.5, -3.75, 1e-300, 1e300, 0.1, 0.2, 0.30000000000000004, 42.0,
            42.0, 42.0, -0.0, 0.0, 123456.789, 5e-324, -1.7976931348623157e308, 7.0, 7.0,
            2.2250738585072014e-308, 1e-5, 99.5, 99.25, 3.14159, 2.71828, 2.71828, -1.5,
            float("nan"), float("inf"), 8.0]
    t = w + 60000
    pts = []
    for i, v in enumerate(vals):
        pts.append((t, v))
        if i < len(gaps):
            t += gaps[i]
    series[("interop_irregular", (("case", "dod"),))] = pts

    # Special values at a steady 15s, crossing the 2h block boundary at w + 2h.
    specials = [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, -0.0, 5e-324,
                -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, float("nan"),
                float("nan"), 1.0, float("inf"), float("inf"), -1e-320, 1e15 + 0.5, -42.0]
    t = w + 7200000 - 600000
    pts = []
    for i in range(80):
        pts.append((t, specials[i % len(specials)]))
        t += 15000
    series[("interop_special", (("case", "values"), ("job", "x")))] = pts

    # Long series: several 120-sample chunks; a counter with repeats and a jittery scrape.
    t = w + 120000
    pts = []
    v = 0.0
    for i in range(400):
        pts.append((t, v))
        if i % 7 != 3:  # some repeated values
            v += (i * 37 % 101) / 8.0
        t += 10000 + (i * 13 % 7) - 3  # jitter of a few ms around 10 s
    series[("interop_long", (("case", "long"), ("instance", "a:9100")))] = pts

    # A second series of the long family with gauge-like noisy values.
    t = w + 130000
    pts = []
    for i in range(250):
        pts.append((t, round(math.sin(i / 5.0) * 1000, 3 if i % 3 else 1)))
        t += 15000
    series[("interop_long", (("case", "long"), ("instance", "b:9100")))] = pts

    # Values one ulp apart (XORs with >= 32 leading zeros: the clamped 5-bit field), big
    # integers counting by one, and a 64-significant-bit XOR (sig written as 0).
    one_up = struct.unpack("<d", struct.pack("<Q", f2bits(1.0) + 1))[0]
    ulps = [1.0, one_up, 1.0, one_up, -1.0, one_up, 5e-324, 0.0, 5e-324, 1e-323]
    ulps += [1e12 + i for i in range(40)]
    t = w + 200000
    pts = []
    for v in ulps:
        pts.append((t, v))
        t += 30000
    series[("interop_ulp", (("case", "ulp"),))] = pts

    # Make every timestamp survive the seconds-as-float encoding unchanged.
    out = {}
    for key, pts in series.items():
        fixed = []
        last = None
        for ms, val in pts:
            ms = exact_ms(ms)
            if last is not None and ms <= last:
                ms = exact_ms(last + 1)
            fixed.append((ms, val))
            last = ms
        out[key] = fixed
    return out


def write_openmetrics(path, series):
    families = {}
    for (name, labels), pts in series.items():
        families.setdefault(name, []).append((labels, pts))
    with open(path, "w") as f:
        for name, members in families.items():
            f.write("# TYPE %s gauge\n" % name)
            for labels, pts in members:
                lab = ",".join('%s="%s"' % (k, v) for k, v in labels)
                for ms, v in pts:
                    f.write("%s{%s} %s %s\n" % (name, lab, format_value(v), format_ts(ms)))
        f.write("# EOF\n")


def expected_bits(v):
    return GO_NAN_BITS if math.isnan(v) else f2bits(v)


# --------------------------------------------------------------------------------------------
# Prometheus
# --------------------------------------------------------------------------------------------


@pytest.fixture
def workdir():
    d = tempfile.mkdtemp(prefix="sluice-interop-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def start_prometheus(tsdb, workdir):
    prom = shutil.which("prometheus")
    assert prom, "prometheus not installed (deploy/install-deps.sh installs it)"
    cfg = os.path.join(workdir, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write("global:\n  scrape_interval: 1h\n  evaluation_interval: 1h\nscrape_configs: []\n")
    port = free_port()
    log = open(os.path.join(workdir, "prometheus.log"), "wb")
    proc = subprocess.Popen(
        [prom, "--config.file=" + cfg, "--storage.tsdb.path=" + tsdb,
         "--storage.tsdb.retention.time=3650d", "--web.listen-address=127.0.0.1:%d" % port],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    return proc, port


def wait_ready(proc, port, workdir):
    url = "http://127.0.0.1:%d/-/ready" % port
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.2)
    with open(os.path.join(workdir, "prometheus.log"), "rb") as f:
        log = f.read().decode(errors="replace")
    pytest.fail("prometheus did not become ready (exit %r):\n%s" % (proc.poll(), log[-4000:]))


def read_request(start_ms, end_ms, matchers):
    q = pb_varint_field(1, start_ms) + pb_varint_field(2, end_ms)
    for mtype, name, value in matchers:
        q += pb_bytes_field(3, pb_varint_field(1, mtype) + pb_bytes_field(2, name)
                            + pb_bytes_field(3, value))
    return pb_bytes_field(1, q) + pb_varint_field(2, 1)  # accepted_response_types: XOR chunks


def remote_read_chunks(port, body):
    req = urllib.request.Request(
        "http://127.0.0.1:%d/api/v1/read" % port, data=snappy.compress(body), method="POST",
        headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
                 "X-Prometheus-Remote-Read-Version": "0.1.0"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200
        ctype = r.headers.get("Content-Type", "")
        data = r.read()
    assert ctype.startswith("application/x-streamed-protobuf"), ctype
    assert "ChunkedReadResponse" in ctype, ctype
    return data


def parse_frames(data):
    """Yields (labels tuple, [(min_ms, max_ms, type, bytes)]) per ChunkedSeries, CRCs checked."""
    pos = 0
    nframes = 0
    while pos < len(data):
        n, pos = read_uvarint(data, pos)
        assert pos + 4 + n <= len(data), "truncated frame"
        crc = struct.unpack_from(">I", data, pos)[0]
        msg = data[pos + 4:pos + 4 + n]
        pos += 4 + n
        assert crc32c(msg) == crc, "frame %d: CRC32C mismatch" % nframes
        nframes += 1
        for field, _, val in pb_parse(msg):
            if field == 2:
                assert val == 0, "query_index"
                continue
            assert field == 1
            labels = []
            chunks = []
            for sf, _, sv in pb_parse(val):
                if sf == 1:
                    lp = {f: v for f, _, v in pb_parse(sv)}
                    labels.append((lp.get(1, b"").decode(), lp.get(2, b"").decode()))
                elif sf == 2:
                    c = {f: v for f, _, v in pb_parse(sv)}
                    chunks.append((to_int64(c.get(1, 0)), to_int64(c.get(2, 0)), c.get(3, 0),
                                   c.get(4, b"")))
            yield tuple(labels), chunks
    assert nframes > 0


def run_roundtrip(chunks_hex):
    tools = os.environ.get("SLUICE_TOOLS_DIR")
    assert tools, "SLUICE_TOOLS_DIR not set"
    tool = os.path.join(tools, "xor_roundtrip")
    assert os.access(tool, os.X_OK), tool + " not built"
    p = subprocess.run([tool], input="".join(h + "\n" for h in chunks_hex).encode(),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    lines = p.stdout.decode().splitlines()
    assert len(lines) == len(chunks_hex)
    out = []
    for line in lines:
        parts = line.split(" ")
        assert len(parts) == 3, line
        count, reenc, lst = int(parts[0]), parts[1], parts[2]
        samples = []
        if lst:
            for item in lst.split(","):
                t, v = item.split(":")
                samples.append((int(t), int(v, 16)))
        assert len(samples) == count
        out.append((count, reenc, samples))
    return out


def test_roundtrip_tool_rejects_garbage():
    tools = os.environ.get("SLUICE_TOOLS_DIR")
    assert tools, "SLUICE_TOOLS_DIR not set"
    p = subprocess.run([os.path.join(tools, "xor_roundtrip")], input=b"0005d00f3f\n",
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    assert p.returncode != 0


def test_chunks_match_prometheus(workdir):
    promtool = shutil.which("promtool")
    assert promtool, "promtool not installed (deploy/install-deps.sh installs it)"

    now_ms = int(time.time() * 1000)
    two_h = 7200000
    window = (now_ms - 6 * 3600000) // two_h * two_h  # a 2h block range well in the past
    series = build_series(window)

    om = os.path.join(workdir, "data.om")
    write_openmetrics(om, series)
    tsdb = os.path.join(workdir, "tsdb")
    os.mkdir(tsdb)
    p = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", om, tsdb],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    assert p.returncode == 0, p.stdout.decode()
    blocks = [d for d in os.listdir(tsdb) if os.path.isfile(os.path.join(tsdb, d, "meta.json"))]
    assert len(blocks) >= 2, "expected blocks on both sides of a 2h boundary: %r\n%s" % (
        blocks, p.stdout.decode())

    expected = {}
    for (name, labels), pts in series.items():
        key = tuple(sorted((("__name__", name),) + labels))
        expected[key] = [(ms, expected_bits(v)) for ms, v in pts]
    all_ts = [ms for pts in expected.values() for ms, _ in pts]

    proc, port = start_prometheus(tsdb, workdir)
    try:
        wait_ready(proc, port, workdir)
        body = read_request(min(all_ts) - 1000, max(all_ts) + 1000,
                            [(2, "__name__", "interop_.*")])
        data = remote_read_chunks(port, body)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    got_series = {}
    order = []
    for labels, chunks in parse_frames(data):
        if labels not in got_series:
            got_series[labels] = []
            order.append(labels)
        got_series[labels].extend(chunks)
    assert order == sorted(order), "series not sorted"
    assert set(got_series) == set(expected), (sorted(got_series), sorted(expected))

    all_chunks = [(labels, c) for labels in order for c in got_series[labels]]
    for _, c in all_chunks:
        assert c[2] == 1, "chunk type %r is not XOR" % c[2]
    results = run_roundtrip([c[3].hex() for _, c in all_chunks])

    decoded = {labels: [] for labels in order}
    buckets = set()
    total_chunks = {labels: 0 for labels in order}
    for (labels, (mint, maxt, _, raw)), (count, reenc, samples) in zip(all_chunks, results):
        assert count == struct.unpack(">H", raw[:2])[0]
        assert reenc == raw.hex(), "re-encoded chunk differs for %r\n prom %s\n ours %s" % (
            labels, raw.hex(), reenc)
        assert count > 0
        assert samples[0][0] == mint and samples[-1][0] == maxt
        for i in range(2, len(samples)):
            dod = (samples[i][0] - samples[i - 1][0]) - (samples[i - 1][0] - samples[i - 2][0])
            buckets.add((dod_bucket(dod), dod < 0))
        decoded[labels].extend(samples)
        total_chunks[labels] += 1

    for labels in order:
        assert decoded[labels] == expected[labels], labels

    # The data did reach the corners it was built for (inside chunks Prometheus encoded).
    for b in (14, 17, 20, 64):
        assert (b, False) in buckets and (b, True) in buckets, (b, sorted(buckets))
    assert (0, False) in buckets
    long_a = tuple(sorted({"__name__": "interop_long", "case": "long",
                           "instance": "a:9100"}.items()))
    assert total_chunks[long_a] >= 4, total_chunks
    special = tuple(sorted({"__name__": "interop_special", "case": "values", "job": "x"}.items()))
    assert total_chunks[special] >= 2, total_chunks  # cut at the block boundary
    seen = {bits for pts in decoded.values() for _, bits in pts}
    for v in (float("inf"), float("-inf"), -0.0, 5e-324, 1.7976931348623157e308):
        assert f2bits(v) in seen, v
    assert GO_NAN_BITS in seen
    assert f2bits(1.0) + 1 in seen
