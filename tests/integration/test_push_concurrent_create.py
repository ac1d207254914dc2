"""First pushes of many groups at once (every one creating its storage series) all land, in
storage and in the groups, and survive kill -9; a refused push creates no series at all."""
import concurrent.futures
import time

import requests

GROUPS = 16
SERIES_PER_GROUP = 140  # 100 gauges + 5 histograms of 6 buckets, _sum and _count


def body(tm, tick):
    lines = ["# TYPE tm_gauge gauge"]
    for i in range(100):
        lines.append(f'tm_gauge{{task="t{i}",tm_id="{tm}"}} {tick * 1000 + i}')
    lines.append("# TYPE tm_latency histogram")
    for h in range(5):
        cum = 0
        for le in ("0.1", "1", "10", "100", "1000", "+Inf")[:5]:
            cum += tick
            lines.append(f'tm_latency_bucket{{op="o{h}",le="{le}"}} {cum}')
        lines.append(f'tm_latency_bucket{{op="o{h}",le="+Inf"}} {cum + 1}')
        lines.append(f'tm_latency_sum{{op="o{h}"}} {tick * 3.5}')
        lines.append(f'tm_latency_count{{op="o{h}"}} {cum + 1}')
    return "\n".join(lines) + "\n"


def next_second():
    # storage keeps one sample per series and second: the next round goes into a later second
    start = int(time.time())
    while int(time.time()) == start:
        time.sleep(0.01)


def push_all(url, tick):
    def one(tm):
        return requests.put(f"{url}/metrics/job/flink/tm/tm{tm}", data=body(tm, tick),
                            headers={"Content-Type": "text/plain; version=0.0.4"}, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as ex:
        return list(ex.map(one, range(GROUPS)))


def query(url, q):
    r = requests.get(url + "/api/v1/query", params={"query": q}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["data"]["result"]


def scalar(url, q):
    res = query(url, q)
    return float(res[0]["value"][1]) if res else 0.0


def pushed_series(url):
    # the series of pushed metrics (sluice adds its own sluice_push_* availability series)
    return scalar(url, 'count({__name__=~".+",__name__!~"sluice_.*"})')


def check_landed(url, samples_per_series):
    # every group's every series, each with the expected number of samples
    per_tm = query(url, 'count by (tm) ({job="flink",__name__=~"tm_.*"})')
    assert sorted(r["metric"]["tm"] for r in per_tm) == sorted(f"tm{i}" for i in range(GROUPS))
    assert all(int(r["value"][1]) == SERIES_PER_GROUP for r in per_tm), per_tm
    full = sum(scalar(url, f'count(count_over_time({name}{{job="flink"}}[10m]) == {samples_per_series})')
               for name in ("tm_gauge", "tm_latency_bucket", "tm_latency_sum", "tm_latency_count"))
    assert full == GROUPS * SERIES_PER_GROUP
    groups = requests.get(url + "/api/v1/metrics", timeout=30).json()["data"]
    assert len([g for g in groups if g["labels"].get("job") == "flink"]) == GROUPS


def test_concurrent_first_pushes_all_land(start_sluice):
    s = start_sluice()
    for tick in (1, 2):
        replies = push_all(s.url, tick)
        assert [r.status_code for r in replies] == [200] * GROUPS, [r.text for r in replies]
        next_second()
    assert pushed_series(s.url) == GROUPS * SERIES_PER_GROUP
    check_landed(s.url, 2)
    # the values of each group are its own (series were not mixed up between groups)
    assert scalar(s.url, 'tm_gauge{tm="tm7",task="t42"}') == 2042
    assert scalar(s.url, 'tm_latency_sum{tm="tm3",op="o4"}') == 7.0

    # kill -9: the WAL (series records before their samples) brings it all back
    data = s.data_dir
    s.kill9()
    s2 = start_sluice(data_dir=data)
    check_landed(s2.url, 2)
    # and the groups take their next pushes as before
    next_second()
    assert [r.status_code for r in push_all(s2.url, 3)] == [200] * GROUPS
    check_landed(s2.url, 3)
    assert pushed_series(s2.url) == GROUPS * SERIES_PER_GROUP


def test_refused_push_creates_nothing(sluice):
    url = sluice.url
    r = requests.put(url + "/metrics/job/a", data="# TYPE shared gauge\nshared 1\n")
    assert r.status_code == 200, r.text
    before = pushed_series(url)
    assert before == 1

    # another group's type for `shared`: refused, and none of its series is made
    r = requests.put(url + "/metrics/job/b",
                     data='# TYPE shared counter\nshared 2\n# TYPE only_b gauge\nonly_b{x="1"} 3\nonly_b{x="2"} 4\n')
    assert r.status_code == 400
    assert 'collected metric "shared" of type COUNTER is not a GAUGE' in r.text
    # an invalid body (a duplicate series) and a body with timestamps: refused too
    r = requests.put(url + "/metrics/job/c", data='only_c{x="1"} 1\nonly_c{x="1"} 2\n')
    assert r.status_code == 400
    r = requests.post(url + "/metrics/job/d", data="only_d 1 1700000000000\n")
    assert r.status_code == 400

    assert pushed_series(url) == before
    # label listings come from the index itself: a series made and left empty would show here
    names = requests.get(url + "/api/v1/label/__name__/values").json()["data"]
    assert [n for n in names if not n.startswith("sluice_")] == ["shared"]
    jobs = requests.get(url + "/api/v1/label/job/values").json()["data"]
    assert not {"b", "c", "d"} & set(jobs)
    for m in ("only_b", "only_c", "only_d"):
        series = requests.get(url + "/api/v1/series", params={"match[]": m}).json()["data"]
        assert series == []
    assert query(url, '{job=~"b|c|d"}') == []
    # the refused groups are known only by their failure time, as on the Pushgateway
    text = requests.get(url + "/metrics").text
    assert 'push_failure_time_seconds{instance="",job="b"}' in text
    assert "only_b{" not in text

    # the same group pushing a body that agrees is accepted, and only then its series exist
    r = requests.put(url + "/metrics/job/b", data='# TYPE shared gauge\nshared 2\nonly_b{x="1"} 3\n')
    assert r.status_code == 200, r.text
    assert pushed_series(url) == before + 2
