"""Prometheus HTTP query API of sluice (api/query.c): parameters, error messages and status codes
(each one checked against Prometheus 2.42's own answer, copied here), JSON bytes of every result
type, GET and POST form, gzip, timeouts, max samples, refusal of absurd queries, and that a slow
query does not hold up other requests."""
# ctest-labels: slow
import gzip
import json
import threading
import time

import pytest
import requests

import promproto

API = "/api/v1"


def now_s():
    return int(time.time())


@pytest.fixture
def loaded(start_sluice):
    """sluice with a few series remote-written over the last 10 minutes (10 s apart)."""
    s = start_sluice()
    t0 = (now_s() - 600) * 1000
    series = []
    for inst in ("a", "b", "c"):
        labels = [("__name__", "http_requests_total"), ("instance", inst), ("job", "api")]
        series.append((labels, [(t0 + i * 10000, float(i * (1 + ord(inst) - ord("a")))) for i in range(61)]))
    series.append(([("__name__", "tiny"), ("weird", "<&>\u2028")], [(t0 + i * 10000, 1e-7) for i in range(61)]))
    st, _, body = promproto.remote_write(s.url, series)
    assert st in (200, 204), body
    s.t0 = t0
    return s


def get(s, path, **params):
    return requests.get(s.url + API + path, params=params, timeout=60)


def post(s, path, data):
    return requests.post(s.url + API + path, data=data, timeout=60)


def err(r):
    body = r.json()
    assert body["status"] == "error"
    return r.status_code, body["errorType"], body["error"]


# --- error messages, as Prometheus 2.42 words them -----------------------------------------------

BAD = "bad_data"
ERRORS = [
    ("/query", {}, 400, BAD, 'invalid parameter "query": 1:1: parse error: no expression found in input'),
    ("/query", {"query": "1", "time": "x"}, 400, BAD,
     'invalid parameter "time": Invalid time value for \'time\': cannot parse "x" to a valid timestamp'),
    ("/query", {"query": "1", "time": "0x10"}, 400, BAD,
     'invalid parameter "time": Invalid time value for \'time\': cannot parse "0x10" to a valid timestamp'),
    ("/query", {"query": "1", "timeout": "x"}, 400, BAD,
     'invalid parameter "timeout": cannot parse "x" to a valid duration'),
    ("/query", {"query": "1+", "time": "1"}, 400, BAD,
     'invalid parameter "query": 1:3: parse error: unexpected end of input'),
    ("/query", {"query": "1+", "time": "x", "timeout": "x"}, 400, BAD,
     'invalid parameter "time": Invalid time value for \'time\': cannot parse "x" to a valid timestamp'),
    ("/query", {"query": "1+", "timeout": "x"}, 400, BAD,
     'invalid parameter "timeout": cannot parse "x" to a valid duration'),
    ("/query", {"query": "x{"}, 400, BAD, 'invalid parameter "query": 1:3: parse error: unexpected end of input inside braces'),
    ("/query", {"query": '{a=""}'}, 400, BAD,
     'invalid parameter "query": 1:1: parse error: vector selector must contain at least one non-empty matcher'),
    ("/query", {"query": "1", "timeout": "0"}, 503, "timeout", "query timed out in query queue"),
    ("/query", {"query": "1", "timeout": "-1"}, 503, "timeout", "query timed out in query execution"),
    ("/query_range", {"query": "1"}, 400, BAD, 'invalid parameter "start": cannot parse "" to a valid timestamp'),
    ("/query_range", {"query": "1", "start": "1"}, 400, BAD, 'invalid parameter "end": cannot parse "" to a valid timestamp'),
    ("/query_range", {"query": "1", "start": "1", "end": "2"}, 400, BAD,
     'invalid parameter "step": cannot parse "" to a valid duration'),
    ("/query_range", {"query": "1", "start": "x", "end": "2", "step": "1"}, 400, BAD,
     'invalid parameter "start": cannot parse "x" to a valid timestamp'),
    ("/query_range", {"query": "1", "start": "1", "end": "x", "step": "1"}, 400, BAD,
     'invalid parameter "end": cannot parse "x" to a valid timestamp'),
    ("/query_range", {"query": "1", "start": "2", "end": "1", "step": "1"}, 400, BAD,
     'invalid parameter "end": end timestamp must not be before start time'),
    ("/query_range", {"query": "1", "start": "1", "end": "2", "step": "0"}, 400, BAD,
     'invalid parameter "step": zero or negative query resolution step widths are not accepted. Try a positive integer'),
    ("/query_range", {"query": "1", "start": "0", "end": "2", "step": "-1"}, 400, BAD,
     'invalid parameter "step": zero or negative query resolution step widths are not accepted. Try a positive integer'),
    ("/query_range", {"query": "1", "start": "1", "end": "2", "step": "x"}, 400, BAD,
     'invalid parameter "step": cannot parse "x" to a valid duration'),
    ("/query_range", {"query": "1", "start": "1", "end": "20000", "step": "1"}, 400, BAD,
     "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query resolution (?step=XX)"),
    ("/query_range", {"query": "1", "start": "0", "end": "11001", "step": "1"}, 400, BAD,
     "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query resolution (?step=XX)"),
    ("/query_range", {"query": '"a"', "start": "1", "end": "3", "step": "1"}, 400, BAD,
     'invalid expression type "string" for range query, must be Scalar or instant Vector'),
    ("/query_range", {"query": "1", "start": "1", "end": "3", "step": "1", "timeout": "x"}, 400, BAD,
     'invalid parameter "timeout": cannot parse "x" to a valid duration'),
    ("/query_range", {"query": "1+", "start": "1", "end": "3", "step": "1", "timeout": "x"}, 400, BAD,
     'invalid parameter "timeout": cannot parse "x" to a valid duration'),
    ("/query_range", {"start": "1", "end": "3", "step": "1"}, 400, BAD, "1:1: parse error: no expression found in input"),
    ("/series", {}, 400, BAD, "no match[] parameter provided"),
    ("/series", {"match[]": "x{"}, 400, BAD,
     'invalid parameter "match[]": 1:3: parse error: unexpected end of input inside braces'),
    ("/series", {"match[]": "rate(x[5m])"}, 400, BAD, 'invalid parameter "match[]": 1:5: parse error: unexpected "("'),
    ("/series", {"match[]": "x[5m]"}, 400, BAD, 'invalid parameter "match[]": 1:2: parse error: unexpected "["'),
    ("/series", {"match[]": "x offset 5m"}, 400, BAD, 'invalid parameter "match[]": 1:3: parse error: unexpected <offset>'),
    ("/series", {"match[]": "1"}, 400, BAD, 'invalid parameter "match[]": 1:1: parse error: unexpected number "1"'),
    ("/series", {"match[]": "x + y"}, 400, BAD, 'invalid parameter "match[]": 1:3: parse error: unexpected <op:+>'),
    ("/series", {"match[]": "(x)"}, 400, BAD, 'invalid parameter "match[]": 1:1: parse error: unexpected "("'),
    ("/series", {"match[]": '{a=""}'}, 400, BAD,
     'invalid parameter "match[]": match[] must contain at least one non-empty matcher'),
    ("/series", {"match[]": "up", "start": "x"}, 400, BAD,
     'invalid parameter "start": Invalid time value for \'start\': cannot parse "x" to a valid timestamp'),
    ("/series", {"match[]": "up", "end": "x"}, 400, BAD,
     'invalid parameter "end": Invalid time value for \'end\': cannot parse "x" to a valid timestamp'),
    ("/labels", {"match[]": "x{"}, 400, BAD, "1:3: parse error: unexpected end of input inside braces"),
    ("/labels", {"match[]": "x[5m]"}, 400, BAD, '1:2: parse error: unexpected "["'),
    ("/labels", {"match[]": '{a=""}'}, 400, BAD, "match[] must contain at least one non-empty matcher"),
    ("/labels", {"start": "x"}, 400, BAD,
     'invalid parameter "start": Invalid time value for \'start\': cannot parse "x" to a valid timestamp'),
    ("/labels", {"end": "x"}, 400, BAD,
     'invalid parameter "end": Invalid time value for \'end\': cannot parse "x" to a valid timestamp'),
    ("/label/a-b/values", {}, 400, BAD, 'invalid label name: "a-b"'),
    ("/label/1a/values", {}, 400, BAD, 'invalid label name: "1a"'),
    ("/label/job/values", {"match[]": "x{"}, 400, BAD, "1:3: parse error: unexpected end of input inside braces"),
    ("/label/job/values", {"match[]": '{a=""}'}, 400, BAD, "match[] must contain at least one non-empty matcher"),
    ("/label/job/values", {"start": "x"}, 400, BAD,
     'invalid parameter "start": Invalid time value for \'start\': cannot parse "x" to a valid timestamp'),
    ("/query_exemplars", {}, 400, BAD, "1:1: parse error: no expression found in input"),
    ("/query_exemplars", {"query": "up", "start": "x"}, 400, BAD,
     'invalid parameter "start": Invalid time value for \'start\': cannot parse "x" to a valid timestamp'),
    ("/query_exemplars", {"query": "up", "start": "2", "end": "1"}, 400, BAD,
     "end timestamp must not be before start timestamp"),
    ("/query_exemplars", {"query": "x{"}, 400, BAD, "1:3: parse error: unexpected end of input inside braces"),
    ("/format_query", {}, 400, BAD, 'invalid parameter "query": 1:1: parse error: no expression found in input'),
    ("/format_query", {"query": "1+"}, 400, BAD, 'invalid parameter "query": 1:3: parse error: unexpected end of input'),
    ("/rules", {"type": "x"}, 400, BAD, 'invalid parameter "type": not supported value "x"'),
]


@pytest.mark.parametrize("path,params,code,etype,msg", ERRORS, ids=[f"{e[0]}-{i}" for i, e in enumerate(ERRORS)])
def test_error_messages_match_prometheus(sluice, path, params, code, etype, msg):
    r = get(sluice, path, **params)
    assert err(r) == (code, etype, msg)
    assert r.headers["Content-Type"] == "application/json"
    if path in ("/query", "/query_range", "/series", "/labels", "/format_query", "/query_exemplars"):
        assert err(post(sluice, path, params)) == (code, etype, msg)  # POST form says the same


def test_error_json_escapes_like_go(sluice):
    # Go's encoder writes < and > as \u003c \u003e, in errors too
    r = get(sluice, "/series", **{"match[]": "x offset 5m"})
    assert b"\\u003coffset\\u003e" in r.content


def test_methods(sluice):
    assert requests.put(sluice.url + API + "/query", timeout=10).status_code == 405
    assert requests.post(sluice.url + API + "/rules", timeout=10).status_code == 405
    assert requests.post(sluice.url + API + "/label/job/values", timeout=10).status_code == 405


# --- result shapes and bytes ---------------------------------------------------------------------

def test_scalar_string_and_time_formats(sluice):
    assert get(sluice, "/query", query="1+1", time="4").content == \
        b'{"status":"success","data":{"resultType":"scalar","result":[4,"2"]}}'
    assert get(sluice, "/query", query='"a"', time="4.5").content == \
        b'{"status":"success","data":{"resultType":"string","result":[4.5,"a"]}}'
    # scalars use 'f' formatting, vectors the API's exponent rule
    assert get(sluice, "/query", query="1e-7", time="1").json()["data"]["result"] == [1, "0.0000001"]
    assert get(sluice, "/query", query="1e22", time="1").json()["data"]["result"] == [1, "10000000000000000000000"]
    assert get(sluice, "/query", query="vector(1e-7)", time="1").json()["data"]["result"] == \
        [{"metric": {}, "value": [1, "1e-07"]}]
    for q, v in (("NaN", "NaN"), ("Inf", "+Inf"), ("-Inf", "-Inf")):
        assert get(sluice, "/query", query=f"vector({q})", time="1").json()["data"]["result"][0]["value"][1] == v
    # times: RFC3339 (with offsets), fractional seconds rounded to ms
    r = get(sluice, "/query", query="time()", time="2015-07-01T20:10:51.781Z").content
    assert r == b'{"status":"success","data":{"resultType":"scalar","result":[1435781451.781,"1435781451.781"]}}'
    r = get(sluice, "/query", query="time()", time="2015-07-01T20:10:51.781+02:00").json()
    assert r["data"]["result"] == [1435774251.781, "1435774251.781"]
    assert get(sluice, "/query", query="time()", time="1435781451.7815").json()["data"]["result"] == \
        [1435781451.782, "1435781451.782"]
    assert get(sluice, "/query", query="time()", time="-1.5").json()["data"]["result"] == [-1.5, "-1.5"]
    assert get(sluice, "/query", query="time()", time="1e3").json()["data"]["result"] == [1000, "1000"]
    # range points: three decimals whenever not whole, as Prometheus' jsoniter codec writes them
    assert get(sluice, "/query_range", query="time()", start="0", end="2", step="0.5").content == \
        b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":' \
        b'[[0,"0"],[0.500,"0.5"],[1,"1"],[1.500,"1.5"],[2,"2"]]}]}}'
    assert get(sluice, "/query_range", query="time()", start="-1.5", end="-1", step="0.25").content == \
        b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":' \
        b'[[-1.500,"-1.5"],[-1.250,"-1.25"],[-1,"-1"]]}]}}'
    # durations as steps, and exactly 11,000 points allowed
    r = get(sluice, "/query_range", query="time()", start="0", end="2", step="1h30m").json()
    assert r["data"]["result"][0]["values"] == [[0, "0"]]
    r = get(sluice, "/query_range", query="time()", start="0", end="11000", step="1").json()
    assert len(r["data"]["result"][0]["values"]) == 11001


def test_vector_matrix_series_labels(loaded):
    s = loaded
    t = s.t0 / 1000 + 600
    r = get(s, "/query", query="http_requests_total", time=str(t)).json()
    assert r["status"] == "success" and "warnings" not in r
    res = sorted(r["data"]["result"], key=lambda x: x["metric"]["instance"])
    assert [x["metric"] for x in res] == [
        {"__name__": "http_requests_total", "instance": i, "job": "api"} for i in "abc"]
    assert [x["value"] for x in res] == [[t, "60"], [t, "120"], [t, "180"]]

    r = get(s, "/query", query="rate(http_requests_total[1m])", time=str(t)).json()
    vals = {x["metric"]["instance"]: float(x["value"][1]) for x in r["data"]["result"]}
    assert vals == pytest.approx({"a": 0.1, "b": 0.2, "c": 0.3})
    assert all("__name__" not in x["metric"] for x in r["data"]["result"])

    r = get(s, "/query", query='http_requests_total{instance="a"}[30s]', time=str(t)).json()
    assert r["data"]["resultType"] == "matrix"
    # 2.42's ranges are closed at both ends
    assert r["data"]["result"][0]["values"] == [[t - 30, "57"], [t - 20, "58"], [t - 10, "59"], [t, "60"]]

    r = get(s, "/query_range", query='sum(http_requests_total)', start=str(t - 60), end=str(t), step="30").json()
    assert r["data"]["result"] == [{"metric": {}, "values": [[t - 60, str(6 * 54)], [t - 30, str(6 * 57)],
                                                              [t, str(6 * 60)]]}]

    # label values with characters Go's encoder escapes
    r = get(s, "/query", query="tiny", time=str(t))
    assert b'"weird":"\\u003c\\u0026\\u003e\\u2028"' in r.content
    assert r.json()["data"]["result"][0]["value"] == [t, "1e-07"]

    r = get(s, "/series", **{"match[]": ['http_requests_total{instance=~"a|b"}', 'tiny']}).json()
    assert r["data"] == [{"__name__": "http_requests_total", "instance": "a", "job": "api"},
                         {"__name__": "http_requests_total", "instance": "b", "job": "api"},
                         {"__name__": "tiny", "weird": "<&>\u2028"}]
    # start/end bound series; no data before t0
    r = get(s, "/series", **{"match[]": "tiny", "start": "1", "end": "100"}).json()
    assert r["data"] == []
    assert get(s, "/labels").json()["data"] == ["__name__", "instance", "job", "weird"]
    assert get(s, "/labels", **{"match[]": "tiny"}).json()["data"] == ["__name__", "weird"]
    assert get(s, "/label/__name__/values").json()["data"] == ["http_requests_total", "tiny"]
    assert get(s, "/label/instance/values", **{"match[]": ['{instance="b"}', '{instance="c"}']}).json()["data"] == \
        ["b", "c"]
    assert get(s, "/label/nope/values").json() == {"status": "success", "data": []}
    # percent-encoded label name in the path
    assert requests.get(s.url + API + "/label/%5F%5Fname%5F%5F/values", timeout=10).json()["data"] == \
        ["http_requests_total", "tiny"]
    # POST form, match[] repeated
    r = requests.post(s.url + API + "/series", data=[("match[]", "tiny"), ("match[]", "tiny")], timeout=10).json()
    assert r["data"] == [{"__name__": "tiny", "weird": "<&>\u2028"}]
    r = requests.post(s.url + API + "/labels", data={"match[]": "tiny"}, timeout=10).json()
    assert r["data"] == ["__name__", "weird"]
    # `limit` (newer Prometheus) is ignored as 2.42 does
    assert len(get(s, "/series", **{"match[]": "http_requests_total", "limit": "1"}).json()["data"]) == 3


def test_small_endpoints(sluice):
    assert get(sluice, "/rules").json() == {"status": "success", "data": {"groups": []}}
    assert get(sluice, "/rules", type="alert").json() == {"status": "success", "data": {"groups": []}}
    assert get(sluice, "/alerts").json() == {"status": "success", "data": {"alerts": []}}
    assert get(sluice, "/query_exemplars", query="up", start="1", end="2").json() == {"status": "success", "data": []}
    assert get(sluice, "/format_query", query="sum(rate(x[5m]))by(a)").json() == \
        {"status": "success", "data": "sum by (a) (rate(x[5m]))"}
    r = post(sluice, "/format_query", {"query": "a"}).json()
    assert r == {"status": "success", "data": "a"}
    y = get(sluice, "/status/config").json()["data"]["yaml"]
    assert 'query.lookback-delta: "5m"' in y and 'query.timeout: "2m"' in y


def test_gzip(loaded):
    t = str(loaded.t0 / 1000 + 600)
    for path, params in (("/query", {"query": "http_requests_total", "time": t}), ("/labels", {}),
                         ("/query", {"query": "1+"}), ("/format_query", {"query": "a"})):
        r = requests.get(loaded.url + API + path, params=params, headers={"Accept-Encoding": "gzip"}, stream=True,
                         timeout=10)
        assert r.headers.get("Content-Encoding") == "gzip"
        raw = r.raw.read()
        plain = requests.get(loaded.url + API + path, params=params, headers={"Accept-Encoding": "identity"},
                             timeout=10)
        assert "Content-Encoding" not in plain.headers
        assert gzip.decompress(raw) == plain.content


# --- limits --------------------------------------------------------------------------------------

def test_max_samples_and_absurd_queries(start_sluice):
    s = start_sluice("--query.max-samples=100")
    r = get(s, "/query_range", query="vector(1)", start="0", end="1000", step="1")
    assert err(r) == (422, "execution", "query processing would load too many samples into memory in query execution")
    assert get(s, "/query_range", query="vector(1)", start="0", end="50", step="1").status_code == 200
    # deeply nested and huge queries are refused cleanly, and the daemon stays up
    deep = "(" * 100000 + "1" + ")" * 100000
    r = post(s, "/query", {"query": deep})
    assert r.status_code == 400 and r.json()["errorType"] == "bad_data"
    huge = "+".join(["1"] * 200000)
    r = post(s, "/query", {"query": huge})
    assert err(r)[:2] == (400, "bad_data") and "nested too deeply" in err(r)[2]
    assert get(s, "/query", query="1+1", time="4").json()["data"]["result"] == [4, "2"]


def test_long_chain_evaluates(sluice):
    # a long but sane chain still evaluates (deep recursion on a query thread)
    r = post(sluice, "/query", {"query": "+".join(["vector(1)"] * 1000), "time": "1"})
    assert r.json()["data"]["result"] == [{"metric": {}, "value": [1, "1000"]}]


def test_slow_query_blocks_nothing_and_times_out(start_sluice):
    s = start_sluice("--web.workers=1", "--query.max-concurrency=2")
    # A subquery at 1 ms resolution: millions of inner steps per outer step.
    slow = {"query": "count_over_time(vector(1)[1h:1ms])", "start": "0", "end": "3600", "step": "60",
            "timeout": "3s"}
    result = {}

    def run():
        result["r"] = post(s, "/query_range", slow)

    th = threading.Thread(target=run)
    th.start()
    time.sleep(0.3)  # let it reach the pool
    fast = get(s, "/query", query="1+1", time="4")
    health = requests.get(s.url + "/-/healthy", timeout=10)
    still_running = th.is_alive()
    th.join(60)
    assert fast.json()["data"]["result"] == [4, "2"] and health.status_code == 200
    assert still_running, "the slow query finished before the fast request was answered"
    assert err(result["r"]) == (503, "timeout", "query timed out in expression evaluation")


def test_query_timeout_flag(start_sluice):
    s = start_sluice("--query.timeout=1s")
    r = get(s, "/query_range", query="count_over_time(vector(1)[1h:1ms])", start="0", end="3600", step="60")
    assert err(r) == (503, "timeout", "query timed out in expression evaluation")
