"""Rules: loading checked against Debian's promtool (the same files), refused reloads keeping the
old rules (POST /-/reload and SIGHUP), the API shapes, and the closed loop — Flink-shaped pushes
that backpressure make an alert fire and the job's flow-control state change, and resolve it back;
an operator's change made meanwhile wins; dry_run changes nothing."""
import os
import re
import shutil
import signal
import subprocess
import time

import pytest
import requests

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
SOURCE = os.environ.get("SLUICE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "../.."))
BP = "flink_taskmanager_job_task_backPressuredTimeMsPerSecond"

GOOD = """groups:
- name: flink
  interval: 1s
  rules:
  - record: job_name:bp:ratio
    expr: max by (job_name) (flink_taskmanager_job_task_backPressuredTimeMsPerSecond) / 1000
  - alert: FlinkJobBackpressured
    expr: job_name:bp:ratio{job_name!="dry"} > 0.5
    for: 2s
    labels:
      severity: page
    annotations:
      summary: '{{ $labels.job_name }} is backpressured {{ $value | humanizePercentage }}'
  - alert: DryRunAlert
    expr: job_name:bp:ratio{job_name="dry"} > 0.5
"""

BAD = {
    "yaml": "groups:\n- name: a\n  rules:\n  - record: x\n    expr: up\n   bad: indent\n",
    "promql": "groups:\n- name: a\n  rules:\n  - record: x\n    expr: rate(up)\n",
    "duplicate_groups": "groups:\n- name: a\n  rules: []\n- name: a\n  rules: []\n",
    "unknown_field": "groups:\n- name: a\n  rules:\n  - record: x\n    expr: up\n    foo: bar\n",
    "bad_duration": "groups:\n- name: a\n  rules:\n  - alert: x\n    expr: up\n    for: 5x\n",
    "bad_template": "groups:\n- name: a\n  rules:\n  - alert: X\n    expr: up\n"
                    "    annotations:\n      s: '{{ nope }}'\n",
    "record_annotations": "groups:\n- name: a\n  rules:\n  - record: x\n    expr: up\n    annotations: {a: b}\n",
}

ACTIONS = """actions:
- alert: FlinkJobBackpressured
  action: pause
- alert: DryRunAlert
  action: rate_limit
  rate_limit: 10
  dry_run: true
"""


def promtool(path):
    p = subprocess.run([PROMTOOL, "check", "rules", path], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def push(url, job, value, task="map"):
    body = f'{BP}{{task_name="{task}"}} {value}\n'
    r = requests.put(f"{url}/metrics/job/{job}/job_name/{job}", data=body)
    assert r.status_code == 200, r.text


def wait_for(fn, timeout=30, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def control(url, job):
    return requests.get(f"{url}/api/v1/control/jobs/{job}").json()


def metric(url, name):
    text = requests.get(url + "/metrics").text
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_rule_pack_and_promtool_agree(start_sluice, tmpdir_path):
    """The shipped Flink rule pack passes promtool and loads; promtool's verdict on each bad file
    is sluice's too, with the same message lines."""
    pack = os.path.join(SOURCE, "deploy/rules/flink.yml")
    rc, out = promtool(pack)
    assert rc == 0, out
    # the pack's own unit tests (what its alerts do on Flink-shaped series) pass in Prometheus
    p = subprocess.run([PROMTOOL, "test", "rules", "flink_test.yml"], capture_output=True, text=True,
                       cwd=os.path.dirname(pack))
    assert p.returncode == 0, p.stdout + p.stderr
    s = start_sluice(f"--rules.file={pack}")
    groups = requests.get(s.url + "/api/v1/rules").json()["data"]["groups"]
    assert [g["name"] for g in groups] == ["flink-recording", "flink-alerts"]
    assert sum(len(g["rules"]) for g in groups) == 22

    good = write(os.path.join(tmpdir_path, "good.yml"), GOOD)
    assert promtool(good)[0] == 0
    rules_path = write(os.path.join(tmpdir_path, "live.yml"), GOOD)
    s2 = start_sluice(f"--rules.file={rules_path}")
    for name, text in BAD.items():
        bad = write(os.path.join(tmpdir_path, f"{name}.yml"), text)
        rc, out = promtool(bad)
        assert rc != 0, f"promtool accepted {name}"
        write(rules_path, text)
        r = requests.post(s2.url + "/-/reload")
        assert r.status_code == 500, (name, r.text)
        assert r.text.startswith("failed to reload config: "), r.text
        # every line promtool printed for the file is in sluice's answer (paths differ)
        for line in out.splitlines():
            if line.startswith(bad + ": "):
                msg = line[len(bad) + 2:]
                if name == "yaml":  # libyaml and go-yaml name different lines; both say yaml:
                    assert "yaml: " in r.text, r.text
                    continue
                if name == "promql":
                    msg = msg.split("parse error:")[0]
                assert msg in r.text, f"{name}: promtool says {msg!r}, sluice says {r.text!r}"
        # the old rules keep running
        names = [x["name"] for g in requests.get(s2.url + "/api/v1/rules").json()["data"]["groups"]
                 for x in g["rules"]]
        assert "FlinkJobBackpressured" in names, name
    assert metric(s2.url, "sluice_rule_last_reload_successful") == 0
    # SIGHUP with a bad file: still refused, still running
    s2.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "rule reload failed" in s2.read_log(), what="SIGHUP reload attempt")
    # a good file again: accepted
    write(rules_path, GOOD.replace("DryRunAlert", "Renamed"))
    assert requests.post(s2.url + "/-/reload").status_code == 200
    names = [x["name"] for g in requests.get(s2.url + "/api/v1/rules").json()["data"]["groups"] for x in g["rules"]]
    assert "Renamed" in names and "DryRunAlert" not in names
    assert metric(s2.url, "sluice_rule_last_reload_successful") == 1


def test_startup_refuses_invalid_rules(tmpdir_path):
    from conftest import Sluice
    bad = write(os.path.join(tmpdir_path, "bad.yml"), BAD["promql"])
    s = Sluice(os.path.join(tmpdir_path, "d"), [f"--rules.file={bad}"])
    rc = s.proc.wait(timeout=30)
    log = s.read_log()
    s.log.close()
    assert rc != 0
    assert "could not parse expression" in log


def test_api_shapes(start_sluice, tmpdir_path):
    rules = write(os.path.join(tmpdir_path, "r.yml"), GOOD)
    s = start_sluice(f"--rules.file={rules}")
    push(s.url, "orders", 800)
    alerts = wait_for(lambda: requests.get(s.url + "/api/v1/alerts").json()["data"]["alerts"], what="an alert")
    a = alerts[0]
    assert set(a) == {"labels", "annotations", "state", "activeAt", "value"}
    assert a["labels"] == {"alertname": "FlinkJobBackpressured", "job_name": "orders", "severity": "page"}
    assert a["annotations"] == {"summary": "orders is backpressured 80%"}
    assert a["value"] == "8e-01"
    g = requests.get(s.url + "/api/v1/rules").json()["data"]["groups"][0]
    assert set(g) == {"name", "file", "rules", "interval", "limit", "evaluationTime", "lastEvaluation"}
    assert g["interval"] == 1 and g["file"] == rules
    rec, alert = g["rules"][0], g["rules"][1]
    assert rec["type"] == "recording" and rec["health"] == "ok"
    assert set(rec) == {"name", "query", "health", "evaluationTime", "lastEvaluation", "type"}
    assert set(alert) == {"state", "name", "query", "duration", "labels", "annotations", "alerts", "health",
                          "evaluationTime", "lastEvaluation", "type"}
    assert alert["duration"] == 2 and alert["query"] == 'job_name:bp:ratio{job_name!="dry"} > 0.5'
    only = requests.get(s.url + "/api/v1/rules?type=record").json()["data"]["groups"][0]["rules"]
    assert [r["type"] for r in only] == ["recording"]
    assert requests.get(s.url + "/api/v1/rules?type=nope").status_code == 400
    assert requests.get(s.url + "/-/reload").status_code == 405
    # the recording rule's output is queryable
    q = requests.get(s.url + "/api/v1/query", params={"query": "job_name:bp:ratio"}).json()
    assert q["data"]["result"][0]["value"][1] == "0.8"


def test_closed_loop(start_sluice, tmpdir_path):
    rules = write(os.path.join(tmpdir_path, "r.yml"), GOOD)
    cfg = write(os.path.join(tmpdir_path, "sluice.yml"), ACTIONS)
    s = start_sluice(f"--rules.file={rules}", f"--config.file={cfg}")
    job = "orders"
    push(s.url, job, 100)  # healthy
    push(s.url, "dry", 100)
    time.sleep(1.5)
    assert control(s.url, job)["mode"] == "running"

    # backpressure: the alert goes pending, fires after `for`, and the job is paused
    push(s.url, job, 800)
    push(s.url, "dry", 900)
    active = wait_for(lambda: [a for a in requests.get(s.url + "/api/v1/alerts").json()["data"]["alerts"]
                               if a["labels"]["alertname"] == "FlinkJobBackpressured"], what="pending alert")
    st = wait_for(lambda: (lambda c: c if c["mode"] == "paused" else None)(control(s.url, job)), what="paused")
    assert st["updated_by"] == "rule:FlinkJobBackpressured"
    assert st["reason"].startswith("alert FlinkJobBackpressured firing: orders is backpressured 80%")
    # it changed after `for` (2s) and within one evaluation interval (1s) of it, by sluice's own clocks
    act = active[0]["activeAt"]
    active_ms = int(time.mktime(time.strptime(act[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone) * 1000 + (
        int(round(float("0" + act[19:-1]) * 1000)) if act[19:-1] else 0)
    delay = st["updated_at_ms"] - active_ms
    assert 2000 <= delay <= 2000 + 1000 + 1000, delay  # for + interval + time to commit
    history = requests.get(f"{s.url}/api/v1/control/jobs/{job}/history").json()["entries"]
    assert history[0]["updated_by"] == "rule:FlinkJobBackpressured"
    # dry run: nothing changed for the other job
    wait_for(lambda: metric(s.url, 'sluice_rule_actions_total{result="dry_run"}'), what="dry run")
    assert control(s.url, "dry")["version"] == 0

    # pressure gone: resolved, and the job is running again (the rule's own revert)
    push(s.url, job, 50)
    st = wait_for(lambda: (lambda c: c if c["mode"] == "running" else None)(control(s.url, job)), what="running")
    assert st["updated_by"] == "rule:FlinkJobBackpressured" and st["version"] == 2
    assert st["reason"] == "alert FlinkJobBackpressured resolved"

    # again, but an operator changes the job while the alert fires: the operator wins
    push(s.url, job, 900)
    wait_for(lambda: control(s.url, job)["mode"] == "paused", what="paused again")
    r = requests.post(f"{s.url}/api/v1/control/jobs/{job}/rate-limit", json={"per_second": 123, "reason": "ops"})
    assert r.status_code == 200, r.text
    push(s.url, job, 10)
    wait_for(lambda: metric(s.url, 'sluice_rule_actions_total{result="revert_skipped_newer_change"}'),
             what="revert skipped")
    st = control(s.url, job)
    assert st["mode"] == "rate_limited" and st["rate_limit_per_second"] == 123
    assert st["updated_by"] != "rule:FlinkJobBackpressured"
    # and a new firing leaves a job that someone else limited alone
    push(s.url, job, 950)
    wait_for(lambda: metric(s.url, 'sluice_rule_actions_total{result="skipped_not_running"}'), what="skip")
    assert control(s.url, job)["mode"] == "rate_limited"
    assert metric(s.url, 'sluice_rule_actions_total{result="applied"}') == 2
