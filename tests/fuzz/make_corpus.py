#!/usr/bin/python3
"""Writes the seed corpora of tests/fuzz/corpus/<target>/ from the project's own fixtures.

    tests/fuzz/make_corpus.py [--flink-gen build/tests/tools/flink_gen] [--promql-tests DIR]

Seeds are small (libFuzzer derives its default -max_len from the largest seed) and cover each
surface's grammar: text bodies as the unit tests and Flink's reporter write them (flink_gen),
their protobuf equivalents, remote write/read requests built with tests/integration/promproto.py
(snappy compressed, as Prometheus sends them), PromQL from tests/promql and Prometheus' 2.42
test scripts, the rule files in deploy/rules/, control bodies from docs, Pushgateway paths, and
XOR chunks encoded here (bit for bit the format at the top of storage/chunk_xor.c). The output is
checked in; rerun after adding fixtures. Files are named by the SHA-1 of their content.
"""
import argparse
import glob
import hashlib
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import promproto as pp  # noqa: E402

try:
    import snappy
except ImportError:  # python3-snappy (deploy/install-deps.sh)
    snappy = None


def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


# ---- text exposition ----------------------------------------------------------------------------
TEXT = [
    "# HELP http_requests_total The total.\n# TYPE http_requests_total counter\n"
    'http_requests_total{method="post",code="200"} 1027 1395066363000\n'
    'http_requests_total{method="post",code="400"}    3 1395066363000\n',
    'msdos_file_access_time_seconds{path="C:\\\\DIR\\\\FILE.TXT",error="Cannot find file:\\n\\"FILE.TXT\\""} 1.458255915e9\n',
    "metric_without_timestamp_and_labels 12.47\n",
    "something_weird{problem=\"division by zero\"} +Inf -3982045\n",
    "# TYPE rpc summary\nrpc{quantile=\"0.01\"} 3102\nrpc{quantile=\"0.5\"} 4773\nrpc_sum 1.7560473e+07\nrpc_count 2693\n",
    "# TYPE lat histogram\nlat_bucket{le=\"0.05\"} 24054\nlat_bucket{le=\"0.1\"} 33444\n"
    "lat_bucket{le=\"+Inf\"} 144320\nlat_sum 53423\nlat_count 144320\n",
    "# TYPE g gauge\ng NaN\ng2{a=\"\"} -0\ng3{a=\"x\",b=\"\\\\\"} 0x1p-3\n",
    "a{a=\"1\",} 1\nb{} 2\n# comment\n\n c 3\n",
    "# HELP x help with \\\\ and \\n escapes\n# TYPE x untyped\nx 1\n",
]
OPENMETRICS = [
    "# TYPE foo counter\n# HELP foo A counter.\nfoo_total 17.0 1520879607.789 # {id=\"c\"} 1\nfoo_created 1520872607.123\n# EOF\n",
    "# TYPE i info\ni_info{version=\"1.0\"} 1\n# TYPE s stateset\ns{s=\"a\"} 1\ns{s=\"b\"} 0\n# EOF\n",
    "# TYPE gh gaugehistogram\ngh_bucket{le=\"1\"} 2\ngh_bucket{le=\"+Inf\"} 3\ngh_gcount 3\ngh_gsum 4\n# EOF\n",
    "# TYPE u unknown\n# UNIT u seconds\nu_seconds 1\n# EOF\n",
]


def flink_bodies(flink_gen):
    if not flink_gen or not os.access(flink_gen, os.X_OK):
        return []
    out = subprocess.run([flink_gen, "2", "7", "0"], check=True, capture_output=True, text=True).stdout
    bodies = []
    for part in out.split("# flink_gen ")[1:]:
        body = part.split("\n", 1)[1]
        bodies.append(body[:3000].rsplit("\n", 1)[0] + "\n")  # small seeds, whole lines
    return bodies


# ---- protobuf MetricFamily (io.prometheus.client, delimited) ------------------------------------
def metric(labels, kind, payload, ts=None):
    m = b"".join(pp.bytes_field(1, pp.bytes_field(1, n) + pp.bytes_field(2, v)) for n, v in labels)
    m += pp.bytes_field(kind, payload)
    if ts is not None:
        m += pp.varint_field(6, ts)
    return m


def family(name, ftype, metrics, help_=None):
    f = pp.bytes_field(1, name)
    if help_:
        f += pp.bytes_field(2, help_)
    f += pp.varint_field(3, ftype)
    f += b"".join(pp.bytes_field(4, m) for m in metrics)
    return pp.uvarint(len(f)) + f


def proto_seeds():
    counter = family("http_requests_total", 0, [metric([("code", "200")], 3, pp.double_field(1, 1027))], "The total.")
    gauge = family("temp", 1, [metric([("room", "a")], 2, pp.double_field(1, 21.5)),
                               metric([("room", "b")], 2, pp.double_field(1, float("nan")))])
    summary = family("rpc", 2, [metric([], 4, pp.varint_field(1, 2693) + pp.double_field(2, 1.75e7)
                                       + pp.bytes_field(3, pp.double_field(1, 0.5) + pp.double_field(2, 4773)))])
    untyped = family("u", 3, [metric([("a", "x")], 5, pp.double_field(1, -1), ts=1395066363000)])
    hist = family("lat", 4, [metric([], 7, pp.varint_field(1, 144320) + pp.double_field(2, 53423)
                                    + pp.bytes_field(3, pp.varint_field(1, 24054) + pp.double_field(2, 0.05))
                                    + pp.bytes_field(3, pp.varint_field(1, 144320) + pp.double_field(2, float("inf"))))])
    return [counter, gauge, summary, untyped, hist, counter + gauge + summary + untyped + hist]


# ---- remote write / read --------------------------------------------------------------------------
def snappy_block(b):
    return snappy.compress(b) if snappy else b


def remote_write_seeds():
    s1 = ([("__name__", "up"), ("job", "prometheus"), ("instance", "localhost:9090")], [(1700000000000, 1.0)])
    s2 = ([("__name__", "flink_numRecordsIn"), ("job", "flink"), ("task", "map")],
          [(1700000000000 + i * 1000, float(i * 10)) for i in range(5)])
    s3 = ([("instance", "b"), ("__name__", "unsorted")], [(1, float("nan")), (2, float("-inf"))])
    meta = [(1, "up", "1 if up", ""), (2, "temp", "Temperature", "celsius")]
    reqs = [pp.write_request([s1]), pp.write_request([s1, s2], meta), pp.write_request([s3]),
            pp.write_request([], meta)]
    return [snappy_block(r) for r in reqs]


def remote_read_seeds():
    q1 = (1700000000000, 1700000600000, [(0, "__name__", "up")], None)
    q2 = (0, 1 << 40, [(2, "job", "flink|prom.*"), (1, "instance", "x"), (3, "task", "^tmp_.*")],
          {"step_ms": 15000, "start_ms": 1, "end_ms": 2, "range_ms": 300000, "func": "rate"})
    q3 = (5, 4, [(2, "__name__", "a(b"), (0, "", "")], None)
    reqs = [pp.read_request([q1]), pp.read_request([q1, q2], accepted=(1,)), pp.read_request([q3], accepted=(0, 1)),
            pp.read_request([], accepted=(7,))]
    return [snappy_block(r) for r in reqs]


# ---- PromQL ---------------------------------------------------------------------------------------
def promql_seeds(dirs):
    qs = ['sum by (job) (rate(http_requests_total{job=~"api|web",code!="500"}[5m] offset 1m))',
          'histogram_quantile(0.99, sum without (instance) (rate(lat_bucket[1m])))',
          'max_over_time(rate(x[1m])[5m:30s] @ end())', 'a + on(b) group_left(c) d * -1 ^ 2 ^ 3',
          'topk(3, x) or bool vector(1)', '{__name__=~"flink_.*",job="j"}[1h:]',
          'label_replace(up, "dst", "$1", "src", "(.*)")', '1 > bool 2 unless count_values("v", x)',
          '"string"', "-Inf", "0x1F", "1e-3", "time() - timestamp(up @ 100)", "absent_over_time(x[1d])",
          "sum(x) by (a) limit 3", "x{a='b\\n\\u00e9'}"]
    seen = set()
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "*.test"))):
            with open(path) as f:
                for line in f:
                    line = line.strip()
                    w = line.split()
                    q = None
                    if w[:1] in (["eval"], ["eval_fail"], ["eval_ordered"]) and len(w) > 4 and w[1] == "instant":
                        q = line.split(None, 4)[4]  # eval instant at 5m <q>
                    elif w[:1] in (["eval"], ["eval_fail"]) and len(w) > 8 and w[1] == "range":
                        q = line.split(None, 8)[8]  # eval range from 0 to 1m step 10s <q>
                    if q and q not in seen and len(seen) < 400:
                        seen.add(q)
    return qs + sorted(seen)


# ---- rule files -----------------------------------------------------------------------------------
RULES_SMALL = [
    "groups:\n- name: g\n  interval: 30s\n  rules:\n  - record: job:up:sum\n    expr: sum by (job) (up)\n"
    "  - alert: Down\n    expr: up == 0\n    for: 5m\n    labels: {severity: page}\n"
    "    annotations:\n      summary: '{{ $labels.instance }} down ({{ $value | humanize }})'\n",
    "groups: []\n",
    "groups:\n- name: a\n  limit: 10\n  rules:\n  - alert: X\n    expr: vector(1)\n    keep_firing_for: 1m\n"
    "    annotations: {d: '{{ range $i, $v := query \"up\" }}{{ $v.Labels.job }}{{ end }}{{ if gt 1.0 $value }}x{{ else }}y{{ end }}'}\n",
]


# ---- control bodies (first byte: 0 PUT, 1 pause, 2 resume, 3 rate-limit, 4 drain) ---------------
CONTROL = [
    (0, '{"mode":"paused","reason":"db maintenance","for":"30m"}'),
    (0, '{"mode":"rate_limited","rate_limit_per_second":500,"version":3}'),
    (0, '{"mode":"draining","drain":[{"attribute":"table","regex":"^tmp_"}]}'),
    (0, '{"mode":"running"}'),
    (1, '{}'), (1, ''), (1, '{"reason":"deploy","for":"10m"}'),
    (2, '{}'),
    (3, '{"per_second":1000}'), (3, '{"per_second":1.5}'),
    (4, '{"match":[{"attribute":"table","regex":"^tmp_"},{"attribute":"db","regex":"a|b"}]}'), (4, '{}'),
    # stored state form (control_state_from_json)
    (0, '{"job":"j","mode":"paused","rate_limit_per_second":null,"drain":[],"version":3,'
        '"updated_at":"2024-05-01T03:00:00.000Z","updated_at_ms":1714532400000,"updated_by":"alice",'
        '"reason":"db maintenance","expires_at":null,"expires_at_ms":null,"revert_to":null}'),
    (0, '{"job":"j","mode":"rate_limited","rate_limit_per_second":10,"drain":[],"version":4,'
        '"updated_at":"2024-05-01T03:00:00.000Z","updated_at_ms":1714532400000,"updated_by":"b","reason":"",'
        '"expires_at":"2024-05-01T04:00:00.000Z","expires_at_ms":1714536000000,'
        '"revert_to":{"mode":"paused","rate_limit_per_second":null,"drain":[]}}'),
]

# ---- Pushgateway paths (after /metrics/) ----------------------------------------------------------
PATHS = ["job/flink", "job/flink/instance/tm-1", "job@base64/Zmxpbms=/a/b/c@base64/", "job/j/a@base64/YWJj",
         "job/j/le/0.5/quantile/x", "job/", "job/j/odd", "job/j/__x/1", "job/j/job/other", "job@base64/=",
         "job/j/a/1/a/2", "job@base64/_-8/b@base64/e-_x"]


# ---- XOR chunks (storage/chunk_xor.c's format, written here independently) -----------------------
class Bits:
    def __init__(self):
        self.bits = []

    def put(self, v, n):
        for i in range(n - 1, -1, -1):
            self.bits.append((v >> i) & 1)

    def bytes(self):
        b = self.bits + [0] * (-len(self.bits) % 8)
        return bytes(int("".join(map(str, b[i:i + 8])), 2) for i in range(0, len(b), 8))


def uvarint(n):
    return pp.uvarint(n)


def xor_chunk(samples):
    w = Bits()
    lead, trail = 0xFF, 0
    pt = pv = pd = 0
    for i, (t, v) in enumerate(samples):
        vb = struct.unpack(">Q", struct.pack(">d", v))[0]
        if i == 0:
            for byte in uvarint(((t << 1) ^ (t >> 63)) & (2**64 - 1)):
                w.put(byte, 8)
            w.put(vb, 64)
        else:
            d = t - pt
            if i == 1:
                for byte in uvarint(d):
                    w.put(byte, 8)
            else:
                dod = d - pd
                if dod == 0:
                    w.put(0, 1)
                elif -8191 <= dod <= 8192:
                    w.put(0b10, 2), w.put(dod & 0x3FFF, 14)
                elif -65535 <= dod <= 65536:
                    w.put(0b110, 3), w.put(dod & 0x1FFFF, 17)
                elif -524287 <= dod <= 524288:
                    w.put(0b1110, 4), w.put(dod & 0xFFFFF, 20)
                else:
                    w.put(0b1111, 4), w.put(dod & (2**64 - 1), 64)
            x = vb ^ pv
            if x == 0:
                w.put(0, 1)
            else:
                lz = min(64 - x.bit_length(), 31)
                tz = (x & -x).bit_length() - 1
                if lead != 0xFF and lz >= lead and tz >= trail:
                    w.put(0b10, 2), w.put(x >> trail, 64 - lead - trail)
                else:
                    lead, trail = lz, tz
                    sig = 64 - lz - tz
                    w.put(0b11, 2), w.put(lz, 5), w.put(sig & 63, 6), w.put(x >> tz, sig)
            pd = d
        pt, pv = t, vb
    return struct.pack(">H", len(samples)) + w.bytes()


def xor_seeds():
    base = 1700000000000
    return [xor_chunk([]), xor_chunk([(1000, 1.0), (2000, 1.0), (3500, 3.0)]),
            xor_chunk([(base + i * 1000, float(i)) for i in range(120)]),
            xor_chunk([(base + i * 15000 + (i % 3) * 7, 0.1 * i) for i in range(60)]),
            xor_chunk([(-5, float("nan")), (0, float("inf")), (10**12, -0.0), (2 * 10**12, 1e308)]),
            xor_chunk([(base + i * 1000 + (i * i * 997) % 600000, (i * 7919) % 13 * 1.5) for i in range(40)])]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flink-gen", default=os.path.join(ROOT, "build", "tests", "tools", "flink_gen"))
    ap.add_argument("--promql-tests", action="append",
                    default=[os.path.join(ROOT, "tests", "promql"), os.path.join(ROOT, "..", "shared", "conformance", "promql-2.42")])
    a = ap.parse_args()
    if snappy is None:
        sys.exit("make_corpus: python3-snappy is needed (deploy/install-deps.sh)")
    for body in TEXT + flink_bodies(a.flink_gen):
        put("fuzz_text_parse", b"\0" + body.encode())
    for body in OPENMETRICS:
        put("fuzz_text_parse", b"\1" + body.encode())
    for s in proto_seeds():
        put("fuzz_proto_parse", s)
    for s in remote_write_seeds():
        put("fuzz_remote_write", s)
    for s in remote_read_seeds():
        put("fuzz_remote_read", s)
    for q in promql_seeds(a.promql_tests):
        put("fuzz_promql_parse", q)
    for path in sorted(glob.glob(os.path.join(ROOT, "deploy", "rules", "flink.yml"))):
        with open(path, "rb") as f:
            put("fuzz_rulefile", f.read())
    for r in RULES_SMALL:
        put("fuzz_rulefile", r)
    for kind, body in CONTROL:
        put("fuzz_control_json", bytes([kind]) + body.encode())
    for p in PATHS:
        put("fuzz_push_path", p)
    for c in xor_seeds():
        put("fuzz_chunk_xor", c)
    for t in sorted(os.listdir(os.path.join(HERE, "corpus"))):
        print(f"{t}: {len(os.listdir(os.path.join(HERE, 'corpus', t)))} seeds")


if __name__ == "__main__":
    main()
