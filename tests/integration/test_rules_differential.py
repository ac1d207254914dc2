"""Differential test of rule evaluation against a real Prometheus 2.42 (Debian's
/usr/bin/prometheus): the same rule file (same absolute path, so the same group evaluation
offsets) and the same remote-written data go into both; afterwards the series each wrote —
recording rule outputs, ALERTS and ALERTS_FOR_STATE — must be identical: same timestamps (the
evaluation instants), same values, same labels. That covers the evaluation schedule, the alert
state machine with `for` and `keep_firing_for`, the start-up restore delay, and staleness.

The data is written once, up front, for the whole run (timestamps in the near future), so what
an evaluation sees does not depend on when a write arrives.
"""
# ctest-labels: peer slow
import math
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest
import requests

import promproto
from conftest import Sluice, free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
BP = "flink_taskmanager_job_task_backPressuredTimeMsPerSecond"

RULES = """groups:
- name: flink-diff
  interval: 2s
  rules:
  - record: job_name:bp:ratio
    expr: max by (job_name) (flink_taskmanager_job_task_backPressuredTimeMsPerSecond) / 1000
  - record: bp:count
    expr: count(flink_taskmanager_job_task_backPressuredTimeMsPerSecond > 500)
    labels:
      source: diff
  - alert: Backpressured
    expr: job_name:bp:ratio > 0.5
    for: 6s
    labels:
      severity: page
      job: '{{ $labels.job_name }}'
    annotations:
      summary: '{{ $labels.job_name }} {{ $value | humanizePercentage }}'
  - alert: BackpressuredNow
    expr: job_name:bp:ratio > 0.5
  - alert: BackpressuredSticky
    expr: job_name:bp:ratio > 0.5
    keep_firing_for: 5s
"""

START_DELAY = 12  # seconds before any alert condition: both systems are running and restored
RUN = 56


def value_at(job, off):
    """Backpressured ms/s of a job `off` seconds into the run."""
    if job == "steady":  # backpressured from START_DELAY+2 to +24, then fine
        return 800.0 if START_DELAY + 2 <= off < START_DELAY + 24 else 100.0
    if job == "flappy":  # 5 s on, 5 s off: pending that never fires for 6s, fires for 0s
        return 900.0 if off >= START_DELAY and ((off - START_DELAY) // 5) % 2 == 0 else 50.0
    return 100.0  # "calm"


def wait_ready(url, proc, what):
    deadline = time.time() + 60
    while True:
        try:
            if requests.get(url + "/-/ready", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        if time.time() > deadline or proc.poll() is not None:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.1)


def raw_samples(url, expr, at, window_s):
    r = requests.get(url + "/api/v1/query", params={"query": f"{expr}[{window_s}s]", "time": at}).json()
    assert r["status"] == "success", r
    out = {}
    for s in r["data"]["result"]:
        key = tuple(sorted(s["metric"].items()))
        out[key] = [(round(float(t) * 1000), v) for t, v in s["values"]]
    return out


def test_rules_match_prometheus():
    d = tempfile.mkdtemp(prefix="sluice-rules-diff-")
    rules = os.path.join(d, "rules.yml")
    with open(rules, "w") as f:
        f.write(RULES)
    pport = free_port()
    cfg = os.path.join(d, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write(f"global:\n  evaluation_interval: 2s\n  scrape_interval: 15s\nrule_files:\n- {rules}\n")
    plog = open(os.path.join(d, "prometheus.log"), "wb")
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={d}/prom",
                             f"--web.listen-address=127.0.0.1:{pport}", "--web.enable-remote-write-receiver"],
                            stdout=plog, stderr=subprocess.STDOUT)
    prom_url = f"http://127.0.0.1:{pport}"
    sl = Sluice(os.path.join(d, "sluice"), [f"--rules.file={rules}"])
    rc = None
    try:
        wait_ready(prom_url, prom, "prometheus")
        sl.wait_ready()
        t0 = int(time.time())
        series = []
        for job in ("steady", "flappy", "calm"):
            labels = [("__name__", BP), ("job_name", job), ("task_name", "map")]
            samples = [((t0 + off) * 1000, value_at(job, off)) for off in range(RUN + 4)]
            series.append((labels, samples))
        for url in (prom_url, sl.url):
            st, _, body = promproto.remote_write(url, series)
            assert st in (200, 204), (url, st, body)
        time.sleep(max(0.0, t0 + RUN - time.time()))

        lo, hi = t0 + START_DELAY - 2, t0 + RUN - 2  # both evaluated throughout, both restored
        diffs = []
        for expr in ("job_name:bp:ratio", "bp:count", "ALERTS", "ALERTS_FOR_STATE"):
            p = raw_samples(prom_url, expr, hi, hi - lo)
            s = raw_samples(sl.url, expr, hi, hi - lo)
            if set(p) != set(s):
                diffs.append(f"{expr}: series only in prometheus {set(p) - set(s)}, only in sluice {set(s) - set(p)}")
                continue
            for k in p:
                if p[k] != s[k]:
                    diffs.append(f"{expr} {dict(k)}:\n  prometheus {p[k]}\n  sluice     {s[k]}")
        assert not diffs, "\n".join(diffs)
        # something actually happened in the window
        alerts = raw_samples(sl.url, 'ALERTS{alertstate="firing"}', hi, hi - lo)
        names = {dict(k)["alertname"] for k in alerts}
        assert names == {"Backpressured", "BackpressuredNow", "BackpressuredSticky"}, names
        pending = raw_samples(sl.url, 'ALERTS{alertstate="pending",job_name="flappy"}', hi, hi - lo)
        assert pending, "the flapping job should have been pending"
    finally:
        prom.send_signal(signal.SIGTERM)
        prom.wait(timeout=30)
        plog.close()
        rc = sl.stop()
        log = sl.read_log() if rc != 0 else ""
        shutil.rmtree(d, ignore_errors=True)
    assert rc == 0, log
