#!/usr/bin/python3
"""/federate of N Flink-like series: sluice against a real Prometheus 2.42 holding the same
samples (remote-written into both). Prints answer size, time (median of R runs, gzip as a scraping
Prometheus asks for it) and sluice's RSS before/after.

usage: bench/federate_bench.py [BUILD_DIR] [SERIES] [RUNS]"""
import os
import statistics
import sys
import time

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../tests/integration"))
build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "../build")
os.environ["SLUICE_BIN"] = os.path.join(build, "sluice")
import promproto as pp  # noqa: E402
from conftest import prometheus_beside_sluice  # noqa: E402

N = int(sys.argv[2]) if len(sys.argv) > 2 else 100000
RUNS = int(sys.argv[3]) if len(sys.argv) > 3 else 5


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])


def timed(url, match):
    times, size = [], 0
    for _ in range(RUNS):
        t0 = time.perf_counter()
        r = requests.get(url + "/federate", params={"match[]": match}, headers={"Accept-Encoding": "gzip"},
                         stream=True, timeout=600)
        raw = b"".join(r.raw.stream(1 << 16, decode_content=False))
        times.append(time.perf_counter() - t0)
        assert r.status_code == 200
        size = len(raw)
    return statistics.median(times), size


with prometheus_beside_sluice("fed-bench-", ("--storage.max-series=5000000",)) as (prom, sl):
    now = int(time.time() * 1000)
    names = ["flink_taskmanager_job_task_operator_numRecordsIn", "flink_taskmanager_job_task_numBytesOut",
             "flink_taskmanager_Status_JVM_Memory_Heap_Used", "flink_taskmanager_job_task_buffers_outPoolUsage"]
    batch = []
    for i in range(N):
        batch.append(([("__name__", names[i % 4]), ("job", "flink"), ("instance", "tm-%d:9249" % (i % 50)),
                       ("job_name", "orders-%d" % (i % 20)), ("task_name", "Source: kafka -> map %d" % (i % 97)),
                       ("subtask_index", str(i % 16)), ("tm_id", "container_%06d" % (i // 16))],
                      [(now - 10000, i * 1.5), (now - 2000, i * 1.5 + 1)]))
        if len(batch) == 5000:
            for u in (prom, sl.url):
                st, _, body = pp.remote_write(u, batch)
                assert st in (200, 204), body
            batch = []
    if batch:
        for u in (prom, sl.url):
            pp.remote_write(u, batch)
    before = rss_kib(sl.proc.pid)
    print(f"{N} series; sluice RSS before {before // 1024} MiB")
    for label, match in (("all flink", '{job="flink"}'), ("one name", names[0])):
        ts, ss = timed(sl.url, match)
        tp, sp = timed(prom, match)
        print(f"{label:10s} sluice {ts * 1000:8.0f} ms {ss / 1e6:7.2f} MB gz | prometheus {tp * 1000:8.0f} ms "
              f"{sp / 1e6:7.2f} MB gz")
    print(f"sluice RSS after {rss_kib(sl.proc.pid) // 1024} MiB")
