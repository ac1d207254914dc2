"""Prometheus remote-storage wire formats for the integration tests, hand-written (Debian's
python3 has no protobuf runtime in CI): protobuf encode/parse, WriteRequest / ReadRequest
builders, ReadResponse and ChunkedReadResponse frame parsers, CRC32-Castagnoli, and small HTTP
helpers for /api/v1/write and /api/v1/read.

Field numbers are those of shared/PROTOCOLS.md §5-6 (internal/proto/remote.proto, types.proto).
"""

import math
import struct
import urllib.error
import urllib.request

import snappy

SAMPLES = 0
STREAMED_XOR_CHUNKS = 1
EQ, NEQ, RE, NRE = 0, 1, 2, 3
STALE_NAN_BITS = 0x7FF0000000000002

# ---- protobuf wire format ---------------------------------------------------------------------


def uvarint(n):
    assert n >= 0
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def key(field, wire):
    return uvarint(field << 3 | wire)


def varint_field(field, n):
    return key(field, 0) + uvarint(n & 0xFFFFFFFFFFFFFFFF)


def bytes_field(field, data):
    if isinstance(data, str):
        data = data.encode()
    return key(field, 2) + uvarint(len(data)) + data


def double_field(field, v):
    return key(field, 1) + struct.pack("<d", v)


def read_uvarint(buf, pos):
    shift = 0
    result = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ValueError("varint too long")


def parse(buf):
    """[(field, wire, value)]: int for varint/fixed, bytes for length-delimited."""
    fields = []
    pos = 0
    while pos < len(buf):
        k, pos = read_uvarint(buf, pos)
        field, wire = k >> 3, k & 7
        if wire == 0:
            val, pos = read_uvarint(buf, pos)
        elif wire == 1:
            val = struct.unpack_from("<Q", buf, pos)[0]
            pos += 8
        elif wire == 2:
            n, pos = read_uvarint(buf, pos)
            if pos + n > len(buf):
                raise ValueError("truncated length-delimited field")
            val = bytes(buf[pos:pos + n])
            pos += n
        elif wire == 5:
            val = struct.unpack_from("<I", buf, pos)[0]
            pos += 4
        else:
            raise ValueError("unsupported wire type %d" % wire)
        fields.append((field, wire, val))
    return fields


def to_int64(u):
    return u - (1 << 64) if u >= 1 << 63 else u


def f2bits(v):
    return struct.unpack("<Q", struct.pack("<d", v))[0]


def bits2f(b):
    return struct.unpack("<d", struct.pack("<Q", b))[0]


# ---- CRC32-Castagnoli ----------------------------------------------------------------------------


def _crc_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_CRC = _crc_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    tab = _CRC
    for b in data:
        crc = tab[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


# ---- messages ------------------------------------------------------------------------------------


def label_msg(name, value):
    return bytes_field(1, name) + bytes_field(2, value)


def sample_msg(t, v):
    return double_field(1, v) + varint_field(2, t)


def timeseries(labels, samples):
    """labels: list of (name, value) in the order to send; samples: [(t_ms, value)]."""
    body = b"".join(bytes_field(1, label_msg(n, v)) for n, v in labels)
    body += b"".join(bytes_field(2, sample_msg(t, v)) for t, v in samples)
    return body


def write_request(series, metadata=()):
    """series: [(labels, samples)]; metadata: [(type, family, help, unit)]."""
    body = b"".join(bytes_field(1, timeseries(l, s)) for l, s in series)
    for mtype, fam, help_, unit in metadata:
        body += bytes_field(3, varint_field(1, mtype) + bytes_field(2, fam) + bytes_field(4, help_)
                            + bytes_field(5, unit))
    return body


def read_request(queries, accepted=()):
    """queries: [(start_ms, end_ms, [(type, name, value)], hints dict or None)]."""
    body = b""
    for start, end, matchers, hints in queries:
        q = varint_field(1, start) + varint_field(2, end)
        for mtype, name, value in matchers:
            q += bytes_field(3, varint_field(1, mtype) + bytes_field(2, name) + bytes_field(3, value))
        if hints:
            h = b""
            for f, name in ((1, "step_ms"), (3, "start_ms"), (4, "end_ms"), (7, "range_ms")):
                if name in hints:
                    h += varint_field(f, hints[name])
            if "func" in hints:
                h += bytes_field(2, hints["func"])
            q += bytes_field(4, h)
        body += bytes_field(1, q)
    for t in accepted:
        body += varint_field(2, t)
    return body


def parse_labels(fields):
    out = []
    for f, _, v in fields:
        if f == 1:
            lp = {lf: lv for lf, _, lv in parse(v)}
            out.append((lp.get(1, b"").decode(), lp.get(2, b"").decode()))
    return tuple(out)


def parse_read_response(data):
    """ReadResponse bytes (already un-snappied) -> [[(labels, [(t, value_bits)])]] per query."""
    results = []
    for f, _, qr in parse(data):
        assert f == 1
        series = []
        for tf, _, ts in parse(qr):
            assert tf == 1
            fields = parse(ts)
            samples = []
            for sf, _, sv in fields:
                if sf == 2:
                    sp = {k: v for k, _, v in parse(sv)}
                    samples.append((to_int64(sp.get(2, 0)), sp.get(1, 0)))
            series.append((parse_labels(fields), samples))
        results.append(series)
    return results


def parse_frames(data, check_crc=True):
    """Yields (query_index, labels, [(min_ms, max_ms, type, bytes)], frame_len) per frame."""
    pos = 0
    while pos < len(data):
        n, pos = read_uvarint(data, pos)
        if pos + 4 + n > len(data):
            raise ValueError("truncated frame")
        crc = struct.unpack_from(">I", data, pos)[0]
        msg = data[pos + 4:pos + 4 + n]
        pos += 4 + n
        if check_crc and crc32c(msg) != crc:
            raise ValueError("CRC32C mismatch")
        qi = 0
        series = []
        for f, _, val in parse(msg):
            if f == 2:
                qi = val
            elif f == 1:
                series.append(val)
        assert len(series) == 1, "a frame must hold exactly one series, got %d" % len(series)
        fields = parse(series[0])
        chunks = []
        for sf, _, sv in fields:
            if sf == 2:
                c = {k: v for k, _, v in parse(sv)}
                chunks.append((to_int64(c.get(1, 0)), to_int64(c.get(2, 0)), c.get(3, 0), c.get(4, b"")))
        yield qi, parse_labels(fields), chunks, n


# ---- HTTP ------------------------------------------------------------------------------------------


def post(url, body, headers, timeout=60):
    """(status, headers, body bytes) without raising on 4xx/5xx."""
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


WRITE_HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
                 "X-Prometheus-Remote-Write-Version": "0.1.0"}
READ_HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
                "X-Prometheus-Remote-Read-Version": "0.1.0"}


def remote_write(base_url, series, metadata=(), raw=None, headers=None):
    body = raw if raw is not None else snappy.compress(write_request(series, metadata))
    return post(base_url + "/api/v1/write", body, headers or WRITE_HEADERS)


def remote_read(base_url, queries, accepted=(), raw=None):
    """Returns (status, headers, body): SAMPLES bodies are un-snappied and parsed into
    parse_read_response's shape; streamed bodies are returned raw."""
    body = raw if raw is not None else snappy.compress(read_request(queries, accepted))
    st, hdrs, data = post(base_url + "/api/v1/read", body, READ_HEADERS)
    if st == 200 and hdrs.get("Content-Type", "") == "application/x-protobuf":
        assert hdrs.get("Content-Encoding") == "snappy"
        return st, hdrs, parse_read_response(snappy.uncompress(data))
    return st, hdrs, data


def same_value(a_bits, b):
    """Compares a value's bits with a float (NaN equals any NaN)."""
    a = bits2f(a_bits)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b
