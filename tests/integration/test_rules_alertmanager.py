"""Notifications to a real Alertmanager (Debian's prometheus-alertmanager, started here): alerts
arrive through API v2 with labels (external labels added), annotations and generatorURL; a
resolved alert is sent with its endsAt and leaves Alertmanager's active list; an Alertmanager that
comes up late still gets the alert (retries with backoff); a full queue drops and counts."""
# ctest-labels: peer
import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest
import requests

from conftest import free_port

ALERTMANAGER = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"
BP = "flink_taskmanager_job_task_backPressuredTimeMsPerSecond"

RULES = """groups:
- name: flink
  interval: 1s
  rules:
  - alert: FlinkJobBackpressured
    expr: max by (job_name) (flink_taskmanager_job_task_backPressuredTimeMsPerSecond) > 500
    labels:
      severity: page
    annotations:
      summary: '{{ $labels.job_name }} at {{ $value }} ms/s'
"""


class Alertmanager:
    def __init__(self, d, port):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        cfg = os.path.join(d, "am.yml")
        with open(cfg, "w") as f:
            f.write("route:\n  receiver: blackhole\n  group_wait: 1s\nreceivers:\n- name: blackhole\n")
        self.log = open(os.path.join(d, f"am-{port}.log"), "wb")
        self.proc = subprocess.Popen([ALERTMANAGER, f"--config.file={cfg}", f"--storage.path={d}/am-{port}",
                                      f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while True:
            try:
                if requests.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("alertmanager did not start")
            time.sleep(0.1)

    def alerts(self):
        return requests.get(self.url + "/api/v2/alerts").json()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        self.log.close()


def push(url, job, value):
    r = requests.put(f"{url}/metrics/job/{job}/job_name/{job}", data=f'{BP}{{task_name="map"}} {value}\n')
    assert r.status_code == 200, r.text


def wait_for(fn, timeout=30, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def metric(url, pattern):
    text = requests.get(url + "/metrics").text
    return sum(float(m.group(1)) for m in re.finditer(r"^" + pattern + r" (\S+)$", text, re.M))


@pytest.fixture
def rules_file(tmpdir_path):
    p = os.path.join(tmpdir_path, "rules.yml")
    with open(p, "w") as f:
        f.write(RULES)
    return p


def test_alertmanager_receives_and_resolves(start_sluice, tmpdir_path, rules_file):
    am = Alertmanager(tmpdir_path, free_port())
    try:
        s = start_sluice(f"--rules.file={rules_file}", f"--alertmanager.url={am.url}",
                         "--rules.external-labels=cluster=eu1,env=test", "--web.external-url=http://sluice.example:9091/")
        push(s.url, "orders", 800)
        got = wait_for(lambda: am.alerts(), what="alert in Alertmanager")
        a = got[0]
        assert a["labels"] == {"alertname": "FlinkJobBackpressured", "job_name": "orders", "severity": "page",
                               "cluster": "eu1", "env": "test"}
        assert a["annotations"] == {"summary": "orders at 800 ms/s"}
        assert a["status"]["state"] == "active"
        assert a["generatorURL"].startswith("http://sluice.example:9091/graph?g0.expr=max+by+%28job_name%29")
        assert a["generatorURL"].endswith("&g0.tab=1")
        # endsAt is ValidUntil while firing: about 4 resend delays (1m) ahead
        assert a["endsAt"] > a["startsAt"]
        push(s.url, "orders", 10)
        wait_for(lambda: not am.alerts(), what="resolved alert leaving the active list")
        assert metric(s.url, r'sluice_notifications_sent_total\{alertmanager="[^"]*"\}') >= 2
        assert metric(s.url, "sluice_notifications_dropped_total") == 0
    finally:
        am.stop()


def test_late_alertmanager_gets_alert_by_retry(start_sluice, tmpdir_path, rules_file):
    port = free_port()
    s = start_sluice(f"--rules.file={rules_file}", f"--alertmanager.url=http://127.0.0.1:{port}")
    push(s.url, "orders", 900)
    wait_for(lambda: metric(s.url, r'sluice_notifications_errors_total\{alertmanager="[^"]*"\}') >= 1,
             what="a failed post")
    am = Alertmanager(tmpdir_path, port)  # comes up while sluice backs off and retries
    try:
        # backoff plus Alertmanager start-up: generous on a loaded machine
        wait_for(lambda: am.alerts(), timeout=90, what="alert delivered by a retry")
        assert metric(s.url, r'sluice_notifications_sent_total\{alertmanager="[^"]*"\}') >= 1
    finally:
        am.stop()


def test_full_queue_drops_and_counts(start_sluice, tmpdir_path, rules_file):
    port = free_port()  # nothing listens: every post fails
    s = start_sluice(f"--rules.file={rules_file}", f"--alertmanager.url=http://127.0.0.1:{port}",
                     "--alertmanager.notification-queue-capacity=2")
    for i in range(6):
        push(s.url, f"job{i}", 900)
    # six alerts fire in one evaluation and are queued at once into room for two
    wait_for(lambda: metric(s.url, "sluice_notifications_dropped_total") >= 4, what="drops")
    assert metric(s.url, "sluice_notifications_queue_capacity") == 2
