#!/usr/bin/python3
"""Writes the seed corpora of tests/fuzz/corpus/<target>/ from the project's own fixtures.

    tests/fuzz/make_corpus.py [--flink-gen build/tests/tools/flink_gen] [--promql-tests DIR] [target...]

Seeds are small (libFuzzer derives its default -max_len from the largest seed) and cover each
surface's grammar: text bodies as the unit tests and Flink's reporter write them (flink_gen),
their protobuf equivalents, remote write/read requests built with tests/integration/promproto.py
(snappy compressed, as Prometheus sends them), PromQL from tests/promql and Prometheus' 2.42
test scripts, the rule files in deploy/rules/, control bodies from docs, Pushgateway paths, and
XOR chunks and integer chunks encoded here (bit for bit the formats at the top of
storage/chunk_xor.c and storage/chunk_int.c). The output is
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


# Push bodies for fuzz_push_group: neighbouring samples that repeat, reorder, override or lack
# labels (first byte: the grouping, bit 0 instance, bit 1 a third label).
PUSH_GROUP = [
    (0, "# TYPE m gauge\nm{a=\"1\",b=\"2\",c=\"3\"} 1\nm{a=\"1\",b=\"2\",c=\"4\"} 2\n"
        "m{c=\"3\",b=\"2\",a=\"1\",d=\"0\"} 3\nm{c=\"5\",b=\"2\",a=\"1\",d=\"0\"} 4\n"
        "m{job=\"x\",b=\"2\",c=\"6\"} 5\nm{a=\"1\",b=\"2\",c=\"7\"} 6\n"
        "m{instance=\"i1\",a=\"1\"} 7\nm{a=\"3\"} 8\n# TYPE n counter\nn{a=\"1\",b=\"2\",c=\"3\"} 9\n"),
    (1, "# TYPE rpc summary\nrpc{s=\"a\",quantile=\"0.5\"} 1\nrpc{s=\"a\",quantile=\"0.9\"} 2\n"
        "rpc_sum{s=\"a\"} 3\nrpc_count{s=\"a\"} 4\nrpc{s=\"b\",quantile=\"0.5\"} 5\nrpc_sum{s=\"b\"} 6\n"
        "rpc_count{s=\"b\"} 7\n# TYPE lat histogram\nlat_bucket{instance=\"x\",le=\"0.1\"} 1\n"
        "lat_bucket{instance=\"x\",le=\"+Inf\"} 2\nlat_sum{instance=\"x\"} 3\nlat_count{instance=\"x\"} 2\n"),
    (2, "x{zone=\"q\",a=\"\",b=\"v\"} 1\nx{zone=\"r\",b=\"v\",a=\"w\"} 2\ny{b=\"v\"} 3\ny{b=\"v\",e=\"\"} 4\n"),
    (3, TEXT[0].replace(" 1395066363000", "") + "metric_without_timestamp_and_labels 12.47\n"),
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

# ---- control API requests (fuzz_control_http: server byte, method byte, route byte, then
# "<path suffix>\n<headers>\n\n<body>"; a method byte >= 0xf0 sends the rest raw) ---------------
OPEN, REMOTE, LOCKED, TOKEN = 0, 1, 2, 3
GET, PUT, POST, HEAD, DELETE, OPTIONS, PATCH, BREW, RAW = 0, 1, 2, 3, 4, 5, 6, 7, 0xF0
R_JOBS_, R_JOB, R_JOB_, R_JOBS, R_STREAM, R_TIS, R_HISTORY, R_ROOT = range(8)
JSON = "Content-Type: application/json\n"
TOK = "Authorization: Bearer fuzz-token-0123456789\n"
CONTROL_HTTP = [
    (OPEN, PUT, R_JOBS_, "flink-etl\n" + JSON + '\n{"mode":"paused","reason":"db maintenance","for":"30m"}'),
    (OPEN, PUT, R_JOB, "\n" + JSON + '\n{"mode":"rate_limited","rate_limit_per_second":500,"version":1}'),
    (OPEN, PUT, R_JOB, "\n" + JSON + '\n{"mode":"draining","drain":[{"attribute":"table","regex":"^tmp_"}]}'),
    (OPEN, PUT, R_JOB, "\n" + JSON + '\n{"mode":"running","version":99}'),
    (OPEN, POST, R_JOB_, "pause\n" + JSON + '\n{"reason":"deploy","for":"1s"}'),
    (OPEN, POST, R_JOB_, "pause\n\n"),
    (OPEN, POST, R_JOB_, "resume\n" + JSON + "\n{}"),
    (OPEN, POST, R_JOB_, "rate-limit\n" + JSON + '\n{"per_second":1000}'),
    (OPEN, POST, R_JOB_, "drain\n" + JSON + '\n{"match":[{"attribute":"db","regex":"a|b"}]}'),
    (OPEN, GET, R_JOB_, "pause\n\n"),
    (OPEN, POST, R_JOB_, "explode\n\n"),
    (OPEN, GET, R_JOB, "?version=0&wait=5ms\n\n"),
    (OPEN, GET, R_JOB, "?wait=1m\nIf-None-Match: W/\"0\"\n\n"),
    (OPEN, GET, R_JOB, "?version=-1\n\n"),
    (OPEN, HEAD, R_JOB, "\nIf-None-Match: \"3\"\n\n"),
    (OPEN, GET, R_HISTORY, "?limit=5&before=3\n\n"),
    (OPEN, GET, R_JOBS, "\n\n"),
    (OPEN, GET, R_STREAM, "?job=flink-etl\n\n"),
    (OPEN, GET, R_STREAM, "\nLast-Event-ID: 1\n\n"),
    (OPEN, GET, R_STREAM, "?last_event_id=x\n\n"),
    (OPEN, POST, R_TIS, "\nContent-Type: application/x-www-form-urlencoded\n\naction=fullbuild_workflow_action&"
                        "event_submit_do_get_rate_controller=true&pipeline=flink-etl&lastModified=0"),
    (OPEN, POST, R_TIS, "?action=x\n\n"),
    (OPEN, PUT, R_JOB, "\nOrigin: http://evil.example\n" + JSON + '\n{"mode":"paused"}'),
    (OPEN, PUT, R_JOB, "\nOrigin: http://sluice.test:80\n" + JSON + '\n{"mode":"paused"}'),
    (OPEN, PUT, R_JOB, "\nSec-Fetch-Site: cross-site\n" + JSON + '\n{"mode":"paused"}'),
    (OPEN, PUT, R_JOB, "\nContent-Type: text/plain\n\n{\"mode\":\"paused\"}"),
    (OPEN, PUT, R_JOBS_, "a%2Fb%20c\n" + JSON + '\n{"mode":"paused"}'),
    (OPEN, PUT, R_JOBS_, "bad%00name\n" + JSON + '\n{"mode":"paused"}'),
    (OPEN, DELETE, R_JOB, "\n\n"),
    (OPEN, OPTIONS, R_JOBS, "\n\n"),
    (OPEN, BREW, R_ROOT, "\n\n"),
    (OPEN, PUT, R_JOB, "\nExpect: 100-continue\n" + JSON + '\n{"mode":"paused"}'),
    (REMOTE, PUT, R_JOB, "\n" + JSON + '\n{"mode":"paused"}'),
    (REMOTE, POST, R_JOB_, "pause\n\n"),
    (REMOTE, GET, R_JOB, "\n\n"),
    (LOCKED, GET, R_JOB, "\nAuthorization: Bearer wrong-token-123\n\n"),
    (LOCKED, PUT, R_JOB, "\nAuthorization: Basic Zm9vOmJhcg==\n" + JSON + '\n{"mode":"paused"}'),
    (LOCKED, POST, R_TIS, "?action=fullbuild_workflow_action&event_submit_do_get_rate_controller=true&pipeline=j\n\n"),
    (TOKEN, PUT, R_JOB, "\n" + TOK + JSON + '\n{"mode":"paused","for":"2s"}'),
    (TOKEN, POST, R_JOB_, "resume\n" + TOK + JSON + "\n{}"),
    (TOKEN, PUT, R_JOB, "\n" + JSON + '\n{"mode":"paused"}'),
    (TOKEN, GET, R_HISTORY, "\n\n"),
    (OPEN, RAW, 0, "PUT /api/v1/control/jobs/raw HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   "Transfer-Encoding: chunked\r\n\r\n11\r\n{\"mode\":\"paused\"}\r\n0\r\n\r\n"),
    (OPEN, RAW, 0, "GET /api/v1/control/jobs/a HTTP/1.1\r\nHost: x\r\n\r\n"
                   "POST /api/v1/control/jobs/a/pause HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"),
    (OPEN, RAW, 0, "GET /api/v1/control/jobs/%zz HTTP/1.0\r\n\r\n"),
    (REMOTE, RAW, 0, "PUT /api/v1/control/jobs/r HTTP/1.1\r\nContent-Type: application/json\r\n"
                     "Content-Length: 17\r\n\r\n{\"mode\":\"paused\"}"),
]


# ---- PromQL over fuzz_promql_eval's data set ------------------------------------------------------
PROMQL_EVAL = [
    "http_requests_total", 'rate(http_requests_total{job="api"}[1m])', "increase(http_requests_total[5m])",
    "resets(http_requests_total[10m])", "irate(http_requests_total[2m])", "delta(temp[3m])", "idelta(temp[1m])",
    "sum by (job) (rate(http_requests_total[1m]))", "sum without (instance) (http_requests_total)",
    'histogram_quantile(0.9, rate(lat_bucket[2m]))', "histogram_quantile(0.5, sum by (le) (lat_bucket))",
    "lat_sum / lat_count", "up == 0", "up offset 2m", "up @ 300", "up @ end()", "absent(up{job=\"none\"})",
    "absent_over_time(temp[1m])", "count_values(\"v\", up)", "topk(2, http_requests_total)",
    "bottomk(1, temp)", "quantile(0.5, temp)", "stddev(temp)", "stdvar by (room) (temp)", "group(up)",
    "avg_over_time(temp[5m])", "max_over_time(rate(http_requests_total[1m])[5m:30s])",
    "min_over_time(temp[10m:1m] offset 1m)", "quantile_over_time(0.9, temp[5m])", "last_over_time(up[3m])",
    "changes(up[10m])", "deriv(temp[5m])", "predict_linear(temp[5m], 60)", "holt_winters(temp[5m], 0.5, 0.5)",
    'label_replace(up, "host", "$1", "instance", "(.*)")', 'label_join(up, "x", "-", "job", "instance")',
    "sort_desc(flink_numRecordsIn)", "sum by (task) (rate(flink_numRecordsIn[1m]))",
    "flink_numRecordsIn / on(task) group_left sum by (task) (flink_numRecordsIn)",
    "http_requests_total and on(instance) up", "up unless up offset 1m", "temp or vector(1)",
    "scalar(sum(up)) * 2", "time() - timestamp(up)", "clamp(temp, -1, 1)", "round(temp, 0.5)", "-temp ^ 2",
    "temp > bool 20", "sgn(temp) % 3", "vector(time()) atan2 vector(1)", "days_in_month(vector(0))",
    "sum(rate(lat_bucket[5m])) by (le)", "count(count by (job) (up))", "exp(ln(abs(temp)))",
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


# ---- integer chunks (storage/chunk_int.c's format, written here independently) ---------------------
VB = [(0b0, 1, 0), (0b10, 2, 4), (0b110, 3, 8), (0b1110, 4, 12), (0b11110, 5, 20), (0b111110, 6, 32),
      (0b111111, 6, 64)]


def varbit(w, x):
    for pre, pbits, payload in VB:
        if payload == 0:
            fits = x == 0
        else:
            fits = payload == 64 or -(1 << (payload - 1)) <= x < (1 << (payload - 1))
        if fits:
            w.put(pre, pbits)
            w.put(x & ((1 << payload) - 1), payload)
            return


def zz(x):
    return ((x << 1) ^ (x >> 63)) & (2**64 - 1)


def int_chunk(samples, tmode, vmode):
    """samples: (t, integer v); the layout is the caller's (the encoder in C picks the smallest)."""
    out = struct.pack(">H", len(samples)) + uvarint(zz(samples[0][0])) + uvarint(zz(samples[0][1]))
    if len(samples) == 1:
        return out
    t = [s[0] for s in samples]
    v = [s[1] for s in samples]
    d = [v[i] - v[i - 1] for i in range(1, len(v))]
    out += uvarint(t[1] - t[0]) + bytes([tmode | vmode << 2])
    base = min(d)
    width = max(x - base for x in d).bit_length()
    if vmode == 0:
        out += uvarint(zz(base)) + bytes([width])
    elif vmode == 2:
        out += uvarint(zz(d[0]))
    w = Bits()
    for i in range(1, len(samples)):
        if tmode == 1 and i >= 2:
            varbit(w, (t[i] - t[i - 1]) - (t[i - 1] - t[i - 2]))
        if vmode == 0:
            w.put(d[i - 1] - base, width)
        elif vmode == 1:
            varbit(w, d[i - 1])
        elif i >= 2:
            varbit(w, d[i - 1] - d[i - 2])
    return out + w.bytes()


def rice(w, k, u):
    """vmode 3's rice(u) at parameter k; returns the next k."""
    q = u >> k
    if q < 16:
        w.put((1 << (q + 1)) - 2, q + 1)
        w.put(u & ((1 << k) - 1), k)
    else:
        w.put(0xffff, 16)
        w.put(u.bit_length(), 7)
        w.put(u, u.bit_length())
    m = u.bit_length() - 1 if u > 1 else 0
    return k + (m - k + 1) // 2 if m > k else (k - 1 if m < k else k)


def int_open_chunk(samples):
    """The appendable layout (vmode 3), as the samples decide it."""
    n = len(samples)
    t = [s[0] for s in samples]
    v = [s[1] for s in samples]
    out = struct.pack(">H", n) + uvarint(zz(t[0])) + uvarint(zz(v[0]))
    if n == 1:
        return out
    d = [v[i] - v[i - 1] for i in range(1, n)]
    tmode = int(any(t[i] - t[i - 1] != t[1] - t[0] for i in range(2, n)))
    pred = int(n >= 4 and d[0] != 0 and d[1] != 0 and d[2] != 0 and -2**31 <= d[0] < 2**31)
    out += uvarint(t[1] - t[0]) + bytes([tmode | 3 << 2 | pred << 4])
    if pred:
        out += struct.pack("<i", d[0])
    w, k = Bits(), 0
    for i in range(1, n):
        if tmode == 1 and i >= 2:
            varbit(w, (t[i] - t[i - 1]) - (t[i - 1] - t[i - 2]))
        if pred:
            if i >= 2:
                k = rice(w, k, zz(d[i - 1] - d[0]))
        else:
            w.put(int(d[i - 1] != 0), 1)
            if d[i - 1]:
                k = rice(w, k, zz(d[i - 1]) - 1)
    return out + w.bytes()


def int_seeds():
    base = 1700000000000
    counter = [(base + i * 10000, 123456 + i * 1000 + (i * 7919) % 200) for i in range(90)]
    gauge = [(base + i * 10000 + (i * 13) % 29, (i // 10) * 7) for i in range(90)]
    wild = [(-5 + i * 2147483647, (-1) ** i * 2**53) for i in range(12)]
    return [int_chunk([(1000, 5), (2000, 7), (3000, 9)], 0, 0), int_chunk([(1000, -3)], 0, 0),
            int_chunk(counter, 0, 0), int_chunk(counter, 0, 2), int_chunk(gauge, 1, 1),
            int_chunk(gauge, 1, 2), int_chunk(wild, 0, 1), int_chunk(wild, 0, 0),
            int_open_chunk([(1000, 5), (2000, 7), (3000, 9), (4000, 12), (5000, 14)]),
            int_open_chunk(counter), int_open_chunk(gauge), int_open_chunk(wild),
            int_open_chunk([(base + i * 10000, (i // 30) * 10**15 - i) for i in range(90)])]


# ---- WAL series records (first byte: 0 SERIES, 1 SERIES_SHARED) ---------------------------------
def wal_series_payload(series, shared):
    out = bytearray(len(series).to_bytes(4, "little"))
    prev = None
    for sid, labels in series:
        out += uvarint(sid) + uvarint(len(labels))
        for k, (name, value) in enumerate(labels):
            for part, s in ((0, name), (1, value)):
                b = s.encode()
                if shared and prev is not None and k < len(prev) and prev[k][part] == s:
                    out += b"\0"
                else:
                    out += uvarint(len(b) + shared) + b
        prev = labels
    return bytes(out)


def wal_series_seeds():
    tm = [("host", "tm-1"), ("job_name", "orders"), ("task_name", "Source: kafka")]
    flink = [(100 + i, [("__name__", f"flink_taskmanager_job_task_{m}")] + tm + [("subtask_index", str(i % 4))])
             for i, m in enumerate(["numRecordsIn", "numRecordsOut", "numBytesIn", "isBackPressured"] * 3)]
    small = [(7, [("__name__", "up"), ("job", "flink")]), (2**64 - 1, [("__name__", "")])]
    mixed = [(1, [("a", "1")]), (2, [("a", "1"), ("b", "2"), ("c", "3")]), (3, [("a", "2")]), (4, [])]
    for series in (flink, small, mixed):
        for shared in (0, 1):
            yield bytes([shared]) + wal_series_payload(series, shared)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flink-gen", default=os.path.join(ROOT, "build", "tests", "tools", "flink_gen"))
    ap.add_argument("--promql-tests", action="append",
                    default=[os.path.join(ROOT, "tests", "promql"), os.path.join(ROOT, "..", "shared", "conformance", "promql-2.42")])
    ap.add_argument("targets", nargs="*", help="write only these targets' seeds")
    a = ap.parse_args()
    want = set(a.targets)
    if snappy is None and (not want or want & {"fuzz_remote_write", "fuzz_remote_read"}):
        sys.exit("make_corpus: python3-snappy is needed (deploy/install-deps.sh)")
    if want:
        global put
        put_all = put
        put = lambda target, data: put_all(target, data) if target in want else None  # noqa: E731
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
    for srv, method, route, rest in CONTROL_HTTP:
        put("fuzz_control_http", bytes([srv, method, route]) + rest.encode())
    for q in PROMQL_EVAL:
        put("fuzz_promql_eval", q)
    for p in PATHS:
        put("fuzz_push_path", p)
    for g, body in PUSH_GROUP + [(0, b) for b in flink_bodies(a.flink_gen)]:
        put("fuzz_push_group", bytes([g]) + body.encode())
    for c in xor_seeds():
        put("fuzz_chunk_xor", c)
    for c in int_seeds():
        put("fuzz_chunk_int", c)
    for c in wal_series_seeds():
        put("fuzz_wal_series", c)
    for t in sorted(os.listdir(os.path.join(HERE, "corpus"))):
        print(f"{t}: {len(os.listdir(os.path.join(HERE, 'corpus', t)))} seeds")


if __name__ == "__main__":
    main()
