"""Regular expressions against a real Prometheus 2.42 (Debian's /usr/bin/prometheus, started here
with --web.enable-remote-write-receiver): the same series are remote-written into both, then
label matchers, label_replace and the series/remote-read endpoints are compared (issue #16 case
5).

- A regex that makes a backtracking engine give up, `(a+)+b|a*` on a 5,000-char value, must
  match (`=~` selects the series, `!~` does not), as Go's linear-time regexp does.
- What RE2/Go refuse (backreferences, recursion, look-arounds, `\\C`) is a 400 bad_data with
  Go's message, on /api/v1/query, /api/v1/query_range and /api/v1/series; in label_replace it is
  Prometheus' 422 execution error; in a remote-read matcher it is refused with Go's message (a
  400 in sluice, where Prometheus' read handler answers 500 for any error).
- A differential of tricky regexes (`(?i)`, `.` against "\\n", Unicode classes, empty
  alternatives, `\\d`, `[[:alpha:]]`, ...) over the same values, for `=~`, `!~` and
  label_replace."""
# ctest-labels: peer
import time

import pytest
import requests

import promproto
from conftest import prometheus_beside_sluice

LONG = "a" * 5000
VALUES = ["abc", "ABC", "a\nb", "a.b", "aXb", "\u00fcn\u00efc\u00f6d\u00e9", "\u03a9mega", "123", "x y", "k",
          "\u212a", "_", "tab\tx", "line\n", "\u0661\u0662", "ab", "b"]


@pytest.fixture(scope="module")
def systems():
    with prometheus_beside_sluice("sluice-re2-") as (prom_url, sl):
        t = (int(time.time()) - 30) * 1000
        series = [([("__name__", "rx_long"), ("v", LONG)], [(t, 1.0)]),
                  ([("__name__", "rx")], [(t, -1.0)])]  # no label v: matched as ""
        for i, v in enumerate(VALUES):
            series.append(([("__name__", "rx"), ("v", v)], [(t, float(i))]))
        for url in (prom_url, sl.url):
            st, _, body = promproto.remote_write(url, series)
            assert st in (200, 204), (url, st, body)
        yield prom_url, sl.url, t // 1000


def query(url, q, t):
    r = requests.get(url + "/api/v1/query", params={"query": q, "time": t}, timeout=30)
    return r.status_code, r.json()


def vector(url, q, t):
    st, body = query(url, q, t)
    assert st == 200, (url, q, body)
    return sorted((tuple(sorted(s["metric"].items())), s["value"][1]) for s in body["data"]["result"])


def test_pathological_regex_matches_long_value(systems):
    prom, sl, t = systems
    for url in (prom, sl):
        got = vector(url, 'rx_long{v=~"(a+)+b|a*"}', t)
        assert len(got) == 1 and dict(got[0][0])["v"] == LONG, ("sluice" if url == sl else "prometheus")
        assert vector(url, 'rx_long{v!~"(a+)+b|a*"}', t) == [], url
        assert len(vector(url, 'rx_long{v=~"(a|aa)*"}', t)) == 1, url
        assert vector(url, 'rx_long{v=~"(a|aa)*b"}', t) == [], url
    # and through label_replace (submatch extraction over the long value)
    q = 'label_replace(rx_long, "n", "$1", "v", "(a+)+(a)")'
    assert vector(sl, q, t) == vector(prom, q, t)


REFUSED = [r"(a)\1", r"(?R)", r"(?=x)", r"(?!x)", r"(?<=x)", r"(?<!x)", r"\C", r"(?P=n)", r"(?<n>a)", r"a++",
           r"(a", r"x)", r"[a", r"a{1001}", r"\Z", r"[[:foo:]]", r"\pX"]


def promql_string(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


@pytest.mark.parametrize("regex", REFUSED)
def test_refused_regex_is_bad_data_like_prometheus(systems, regex):
    prom, sl, t = systems
    sel = "up{job=~%s}" % promql_string(regex)
    for path, params in (("/api/v1/query", {"query": sel, "time": t}),
                         ("/api/v1/query_range", {"query": sel, "start": t - 60, "end": t, "step": 15}),
                         ("/api/v1/series", {"match[]": sel, "start": t - 60, "end": t})):
        answers = []
        for url in (prom, sl):
            r = requests.get(url + path, params=params, timeout=30)
            answers.append((r.status_code, r.json()))
        (pst, pbody), (sst, sbody) = answers
        assert pst == 400 and pbody["errorType"] == "bad_data", (path, pbody)
        assert (sst, sbody.get("status"), sbody.get("errorType")) == (400, "error", "bad_data"), (path, sbody)
        assert sbody["error"] == pbody["error"], path


@pytest.mark.parametrize("regex", [r"(a)\1", r"(?=x)", r"\C", r"(a"])
def test_refused_regex_in_label_replace(systems, regex):
    prom, sl, t = systems
    q = 'label_replace(rx, "x", "$1", "v", %s)' % promql_string(regex)
    pst, pbody = query(prom, q, t)
    sst, sbody = query(sl, q, t)
    assert (pst, pbody["errorType"]) == (422, "execution"), pbody
    assert (sst, sbody["errorType"], sbody["error"]) == (pst, pbody["errorType"], pbody["error"])


@pytest.mark.parametrize("regex", [r"(a)\1", r"(?<=x)", r"\C"])
def test_refused_regex_in_remote_read(systems, regex):
    prom, sl, t = systems
    q = [((t - 60) * 1000, (t + 1) * 1000, [(0, "__name__", "rx"), (2, "v", regex)], None)]
    pst, _, pbody = promproto.remote_read(prom, q)
    sst, _, sbody = promproto.remote_read(sl, q)
    # Prometheus 2.42's read handler turns every error into a 500 (text: Go's regexp error);
    # sluice answers 400 for the client's mistake (docs/remote.md). Both refuse before any data.
    assert pst == 500 and b"error parsing regexp" in pbody, (pst, pbody)
    assert sst == 400, sbody
    assert pbody.decode().strip() in sbody.decode(), (pbody, sbody)
    # and a good regex still reads (as a control)
    ok = [((t - 60) * 1000, (t + 1) * 1000, [(0, "__name__", "rx_long"), (2, "v", "(a+)+b|a*")], None)]
    for url in (prom, sl):
        st, _, body = promproto.remote_read(url, ok)
        assert st == 200, (url, body)


DIFFERENTIAL = [
    "(?i)abc", "(?i)K", "(?i:a)b.", "a.b", ".*", ".+", "a.*", ".*b", "(?s)a.b", "(?s).*", "(?m)^b$", "a$", "^a.*",
    r"\pL+", r"\p{Greek}.*", r"\PL*", r"\p{Nd}+", r"[\p{L}\d]+", r"\d+", r"\D*", r"\w+", r"\W", r"\s.*", r".*\S",
    "[[:alpha:]]+", "[[:^alpha:]]+", "[[:digit:]]+", "[[:space:]]?.*", "abc|", "|abc", "a|b|", "()", "(|a)b",
    "", "x?", "(?U)a+", r"a\.b", r"\Qa.b\E", r"\x{3a9}mega", r"[^a]*", r"[a-c]+", r"\b.*", r"a\B.*", "a{1,3}b?c?",
    "(?i)ÜN.*", "\u00fcn.*", ".{5}", ".{5,}", r"[\n]", ".*\\n", r"(a|ab)(c|bcd)?", "_|k", "line.",
]


@pytest.mark.parametrize("regex", DIFFERENTIAL)
def test_differential_matchers(systems, regex):
    prom, sl, t = systems
    for op in ("=~", "!~"):
        q = "rx{v%s%s}" % (op, promql_string(regex))
        assert vector(sl, q, t) == vector(prom, q, t), q


@pytest.mark.parametrize("regex,repl", [
    ("(.)(.*)", "$2-$1"), ("(?P<first>.)(?P<rest>.*)", "${rest}_$first"), ("(a)?(.*)", "[$1][$2]"),
    ("(?i)(A)(.*)", "$1$$${2}x$3"), (r"(\p{L}+)", "L:$1"), ("(.*)", "$10|${1}0|$1x|${1}x|$"),
    ("(?s)(.*)", "<$1>"), ("x*", "empty"), ("(?P<n>a)|(?P<n>b)", "$n"),
])
def test_differential_label_replace(systems, regex, repl):
    prom, sl, t = systems
    q = 'label_replace(rx, "out", %s, "v", %s)' % (promql_string(repl), promql_string(regex))
    assert vector(sl, q, t) == vector(prom, q, t), q
