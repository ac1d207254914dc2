"""The issue's scenario unscaled: a group pushing every 10 s stops for 60 s (six heartbeats
missing). The gap is 60 s to the second through the API and PromQL (about 85 s of wall time,
hence slow; test_availability.py runs the same at one tenth of the time in `make check`).
"""
# ctest-labels: slow
import time

from test_availability import availability, poll, push, query, sleep_until


def test_pushes_stop_for_60s(start_sluice):
    s = start_sluice("--push.expected-interval=10s", "--push.heartbeat-series-interval=1s")
    start = time.time()
    times = []
    for k in (0, 10):
        sleep_until(start + k)
        times.append(push(s.url, "tm-b", "flinkB"))
    # the heartbeats due at 20, 30, 40, 50, 60 and 70 s do not come
    sleep_until(start + 80)
    times.append(push(s.url, "tm-b", "flinkB"))
    want = times[2] - times[1] - 10.0
    assert abs(want - 60) < 1
    d = poll(lambda: (lambda a: a if a["gaps"]["count"] == 1 and not a["in_gap"] else None)(availability(s, "flinkB")))
    assert abs(d["gaps"]["total_seconds"] - want) < 0.5, d
    assert abs(d["recent_gaps"][0]["seconds"] - want) < 0.5
    assert abs(d["availability"] - 100 * (1 - d["gaps"]["total_seconds"] / d["observed_seconds"])) < 1e-3

    def caught_up():
        r = query(s, 'sluice_push_received_total{job="tm-b"}')
        return r and float(r[0]["value"][1]) == 3
    poll(caught_up)
    missed = query(s, 'sluice_push_expected_total{job="tm-b"} - sluice_push_received_total{job="tm-b"}')
    assert float(missed[0]["value"][1]) == 6
    jm = query(s, 'sluice_job_push_expected_total{job="flinkB"} - sluice_job_push_received_total{job="flinkB"}')
    assert abs(float(jm[0]["value"][1]) * 10 - want) < 0.5
