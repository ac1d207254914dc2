"""Differential PromQL test against a real Prometheus 2.42 (Debian's /usr/bin/prometheus, started
here with --web.enable-remote-write-receiver): the same samples are remote-written into both,
then a few hundred range queries (10 s step over 10 minutes, as the PromQL compliance tester
does) and instant queries across every PromQL feature are run on both and compared within 1e-5
relative. Every difference is listed by query.

Data: counters (with resets), gauges, classic histograms, a series with gaps and one that goes
stale, scraped every 15 s on whole seconds (sluice's raw tier keeps one sample per second)."""
# ctest-labels: peer
import math
import random
import time

import pytest
import requests

import promproto
from conftest import prometheus_beside_sluice

STALE = promproto.bits2f(promproto.STALE_NAN_BITS)
REL = 1e-5


@pytest.fixture(scope="module")
def systems():
    with prometheus_beside_sluice("sluice-diff-") as (prom_url, sl):
        end = load_data(prom_url, sl.url)
        yield prom_url, sl.url, end


def load_data(prom_url, sluice_url):
    """Writes the same series into both, in time order, in a few requests. Returns the last
    sample time (seconds)."""
    rnd = random.Random(42)
    end = int(time.time()) - 5
    start = end - 20 * 60
    series = []

    def add(labels, gen, interval=15, gaps=()):
        samples = []
        t = start + rnd.randrange(interval)
        i = 0
        while t <= end:
            if not any(a <= t - start < b for a, b in gaps):
                v = gen(i, t)
                if v is not None:
                    samples.append((t * 1000, v))
            t += interval
            i += 1
        series.append((sorted(labels.items()), samples))

    for inst in ("a", "b", "c"):
        for code in ("200", "500"):
            k = rnd.uniform(0.5, 5)
            reset = rnd.randrange(20, 70)
            add({"__name__": "http_requests_total", "job": "api", "instance": inst, "code": code},
                lambda i, t, k=k, r=reset: float(int((i % r) * k * 10)))
        add({"__name__": "memory_bytes", "job": "api", "instance": inst},
            lambda i, t, b=rnd.uniform(1e6, 1e9): b + 1e5 * math.sin(i / 7) + rnd.uniform(-5e4, 5e4))
        add({"__name__": "temperature_celsius", "job": "node", "instance": inst},
            lambda i, t: round(rnd.uniform(-20, 40), 2))
        counts = [0.0] * 6
        bounds = ["0.1", "0.25", "0.5", "1", "2.5", "+Inf"]
        hist_series = {b: [] for b in bounds}
        t = start + rnd.randrange(15)
        while t <= end:
            x = rnd.expovariate(2.0)
            for n in range(rnd.randrange(1, 6)):
                for j, b in enumerate(bounds):
                    if b == "+Inf" or x <= float(b):
                        counts[j] += 1
            for j, b in enumerate(bounds):
                hist_series[b].append((t * 1000, counts[j]))
            t += 15
        for b in bounds:
            series.append((sorted({"__name__": "request_duration_seconds_bucket", "job": "api", "instance": inst,
                                   "le": b}.items()), hist_series[b]))
    add({"__name__": "gappy", "job": "x"}, lambda i, t: float(i), gaps=((300, 700),))
    stale_at = end - 6 * 60
    add({"__name__": "goes_stale", "job": "x"}, lambda i, t: float(i) if t < stale_at else None)
    series[-1][1].append(((series[-1][1][-1][0] // 1000 + 1) * 1000, STALE))
    add({"__name__": "weird_values", "job": "x"},
        lambda i, t: [0.0, -1.5, 1e-9, 3e21, float("inf"), -0.0, 42.0][i % 7])
    add({"__name__": "info_metric", "job": "api", "instance": "a", "version": "1.2.3", "dc": "eu-1"}, lambda i, t: 1.0)

    # time order matters for Prometheus' head: send in time slices
    for lo in range(start, end + 1, 120):
        chunk = []
        for labels, samples in series:
            s = [x for x in samples if lo * 1000 <= x[0] < (lo + 120) * 1000]
            if s:
                chunk.append((labels, s))
        for url in (prom_url, sluice_url):
            st, _, body = promproto.remote_write(url, chunk)
            assert st in (200, 204), (url, st, body)
    return end


# --- the queries -----------------------------------------------------------------------------

C = "http_requests_total"
G = "memory_bytes"
T = "temperature_celsius"
H = "request_duration_seconds_bucket"

QUERIES = []
for r in ("1m", "5m"):
    for f in ("rate", "irate", "increase", "resets", "changes"):
        QUERIES.append(f"{f}({C}[{r}])")
    for f in ("delta", "idelta", "deriv"):
        QUERIES.append(f"{f}({G}[{r}])")
    for f in ("avg", "min", "max", "sum", "count", "last", "stddev", "stdvar", "present"):
        QUERIES.append(f"{f}_over_time({T}[{r}])")
    QUERIES += [f"quantile_over_time(0.9, {T}[{r}])", f"quantile_over_time(0.5, {G}[{r}])",
                f"predict_linear({G}[{r}], 600)", f"holt_winters({G}[{r}], 0.5, 0.3)",
                f"absent_over_time(nonexistent[{r}])", f"absent_over_time({C}[{r}])",
                f"rate(gappy[{r}])", f"count_over_time(goes_stale[{r}])", f"max_over_time(weird_values[{r}])"]
for agg in ("sum", "avg", "min", "max", "count", "group", "stddev", "stdvar"):
    QUERIES += [f"{agg}({C})", f"{agg} by (instance) ({G})", f"{agg} without (code) (rate({C}[2m]))",
                f"{agg}(rate({C}[1m])) by (code)"]
QUERIES += [
    f"topk(2, {G})", f"bottomk(1, rate({C}[2m]))", f"topk by (instance) (1, rate({C}[5m]))",
    f"quantile(0.75, {T})", f"quantile by (job) (0.1, {G})", f'count_values("v", round({T} / 10))',
    f'count_values without (instance) ("c", {C} > 100)',
    # histograms
    f"histogram_quantile(0.9, rate({H}[5m]))", f"histogram_quantile(0.5, sum by (le) (rate({H}[5m])))",
    f"histogram_quantile(0.99, sum by (le, instance) (rate({H}[1m])))", f"histogram_quantile(1, {H})",
    f"histogram_quantile(0, {H})",
    # arithmetic and matching
    f"{G} / 1024 / 1024", f"-{G}", f"{G} % 7", f"{G} ^ 0.5", f"2 ^ 3 ^ 2", f"{T} * 1.8 + 32",
    f"rate({C}[5m]) / ignoring(code) group_left sum without (code) (rate({C}[5m]))",
    f"sum by (instance) (rate({C}[5m])) / on (instance) {G}",
    f"{G} * on (instance) group_left (version, dc) info_metric",
    f'{C}{{code="500"}} / ignoring (code) {C}{{code="200"}}',
    f"{G} > 5e8", f"{G} > bool 5e8", f"{T} <= 0", f"{T} != bool 0", f"{T} == {T}", f"1 < bool 2",
    f"{T} > 10 < 30", f"atan2({T}, 10)", f"{T} atan2 {T}",
    f"{C} and {C} > 50", f"{C} or {G}", f"{C} unless {C} > 100", f"{G} and on (instance) {T} > 10",
    f"{C} unless on (instance, code) {C} > 200",
    # functions
    f"abs({T})", f"ceil({T})", f"floor({T})", f"round({T})", f"round({T}, 5)", f"sqrt({G})", f"exp({T} / 10)",
    f"ln({G})", f"log2({G})", f"log10({G})", f"sgn({T})", f"clamp({T}, -5, 5)", f"clamp_min({T}, 0)",
    f"clamp_max({T}, 0)", f"sin({T})", f"cos({T})", f"tan({T})", f"asin({T} / 100)", f"acos({T} / 100)",
    f"atan({T})", f"sinh({T} / 10)", f"cosh({T} / 10)", f"tanh({T})", f"asinh({T})", f"acosh({T} + 100)",
    f"atanh({T} / 100)", f"deg({T})", f"rad({T})", "pi()", "time()", f"timestamp({G})", f"vector(time())",
    f"scalar(sum({G}))", f"scalar({G})", f"sort({T})", f"sort_desc({G})",
    f'label_replace({G}, "host", "$1-x", "instance", "(.*)")', f'label_replace({G}, "instance", "", "", "")',
    f'label_join({G}, "both", ",", "job", "instance")', f"absent(nonexistent)", f'absent({C}{{code="404"}})',
    f"absent({C})", f"year()", f"month({G} * 0 + 1e9)", f"day_of_month()", f"day_of_week()", f"day_of_year()",
    f"days_in_month()", f"hour()", f"minute()", f"minute(timestamp({G}))", f"hour({T} * 0 + 1.7e9)",
    f"weird_values", f"weird_values * 2", f"sum(weird_values)", f"gappy", f"goes_stale", f"goes_stale + 1",
    # selectors, offset, @, subqueries
    f'{C}{{code=~"5.."}}', f'{C}{{code!~"2.*",instance!="a"}}', f'{{__name__=~"memory.*|temp.*"}}',
    f'{{job="api",__name__!="{H}"}}', f"{G} offset 2m", f"{G} offset -1m", f"rate({C}[5m] offset 3m)",
    f"{G} @ end()", f"{G} @ start()", f"rate({C}[1m] @ end())", f"sum({G} offset 1m) - sum({G})",
    f"max_over_time(rate({C}[1m])[5m:30s])", f"avg_over_time({G}[3m:])", f"min_over_time(sum({T})[4m:1m])",
    f"rate({C}[5m:15s])", f"deriv(sum({G})[10m:1m])", f"max_over_time(({T} > 0)[2m:10s] offset 1m)",
    f"quantile_over_time(0.5, (rate({C}[1m]))[3m:20s])",
    # literals
    "1", "-1.5e3", "0x1f", "Inf", "-Inf", "NaN", "1 + 2 * 3 - 4 / 5", "(1 + 2) * 3", "5 % 3", "-2 ^ 2",
]

INSTANT_EXTRA = [f"{C}[1m]", f"{G}[2m] offset 1m", '"a string"', f"rate({C}[5m])[5m:1m]"]


def fetch(url, path, params):
    r = requests.get(url + path, params=params, timeout=60)
    body = r.json()
    return r.status_code, body


def canon(body):
    """data -> {(resultType, metric items): [(t, v)]} or ('scalar'/'string', value)."""
    d = body["data"]
    rt = d["resultType"]
    if rt in ("scalar", "string"):
        return rt, (d["result"][0], d["result"][1])
    out = {}
    for x in d["result"]:
        key = tuple(sorted(x["metric"].items()))
        pts = x["values"] if rt == "matrix" else [x["value"]]
        out[key] = [(round(t * 1000), v) for t, v in pts]
    return rt, out


def close(a, b):
    fa, fb = float(a), float(b)
    if math.isnan(fa) or math.isnan(fb):
        return math.isnan(fa) and math.isnan(fb)
    if math.isinf(fa) or math.isinf(fb):
        return fa == fb
    return abs(fa - fb) <= REL * max(abs(fa), abs(fb)) or abs(fa - fb) < 1e-12


def diff(ra, rb):
    """None when equal, else a short description."""
    (ta, a), (tb, b) = ra, rb
    if ta != tb:
        return f"result types {ta} vs {tb}"
    if ta in ("scalar", "string"):
        if a[0] != b[0] or (not close(a[1], b[1]) if ta == "scalar" else a[1] != b[1]):
            return f"{a} vs {b}"
        return None
    if set(a) != set(b):
        only_p = [dict(k) for k in set(a) - set(b)][:3]
        only_s = [dict(k) for k in set(b) - set(a)][:3]
        return f"series only in prometheus {only_p}, only in sluice {only_s}"
    for k in a:
        pa, pb = a[k], b[k]
        if [t for t, _ in pa] != [t for t, _ in pb]:
            return f"{dict(k)}: timestamps differ ({len(pa)} vs {len(pb)} points)"
        for (t, va), (_, vb) in zip(pa, pb):
            if not close(va, vb):
                return f"{dict(k)} @{t / 1000}: {va} vs {vb}"
    return None


def compare(prom, sluice, path, params, diffs):
    q = params["query"]
    sp, bp = fetch(prom, path, params)
    ss, bs = fetch(sluice, path, params)
    if bp["status"] != bs["status"] or sp != ss:
        diffs.append(f"{path} {q}: prometheus {sp} {bp.get('error', '')!r} vs sluice {ss} {bs.get('error', '')!r}")
        return
    if bp["status"] == "error":
        if (bp["errorType"], bp["error"]) != (bs["errorType"], bs["error"]):
            diffs.append(f"{path} {q}: errors {bp['errorType']} {bp['error']!r} vs {bs['errorType']} {bs['error']!r}")
        return
    d = diff(canon(bp), canon(bs))
    if d:
        diffs.append(f"{path} {q}: {d}")


def test_range_queries_match_prometheus(systems):
    prom, sluice, end = systems
    diffs = []
    for q in QUERIES:
        compare(prom, sluice, "/api/v1/query_range",
                {"query": q, "start": str(end - 600), "end": str(end), "step": "10"}, diffs)
    assert not diffs, f"{len(diffs)} of {len(QUERIES)} range queries differ:\n" + "\n".join(diffs)


def test_instant_queries_match_prometheus(systems):
    prom, sluice, end = systems
    diffs = []
    times = (end, end - 123.456, end - 600)
    n = 0
    for q in QUERIES + INSTANT_EXTRA:
        for t in times:
            n += 1
            compare(prom, sluice, "/api/v1/query", {"query": q, "time": str(t)}, diffs)
    assert not diffs, f"{len(diffs)} of {n} instant queries differ:\n" + "\n".join(diffs)


def test_series_and_labels_match_prometheus(systems):
    prom, sluice, end = systems
    for path, params in (("/api/v1/labels", {}), ("/api/v1/label/__name__/values", {}),
                         ("/api/v1/label/instance/values", {"match[]": G}),
                         ("/api/v1/series", {"match[]": [f'{C}{{code="500"}}', "info_metric"]}),
                         ("/api/v1/labels", {"match[]": H})):
        a = requests.get(prom + path, params=params, timeout=30).json()
        b = requests.get(sluice + path, params=params, timeout=30).json()
        if path == "/api/v1/series":
            a["data"].sort(key=lambda x: sorted(x.items()))
            b["data"].sort(key=lambda x: sorted(x.items()))
        assert a == b, path
