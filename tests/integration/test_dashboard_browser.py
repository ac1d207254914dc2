"""The dashboard in a real browser: Debian's headless Chromium driven by Playwright.

This file starts sluice and pushes a synthetic Flink job (two TaskManagers, Flink's metric names,
one task backpressured HIGH and one OK) every second; tests/browser/dashboard.spec.mjs, a node
script using playwright-core with executablePath /usr/bin/chromium (no browser download), then
opens http://.../, clicks the job, waits for non-zero bars and the backpressure strips, presses
Pause, checks nothing changed before confirming, confirms, and sees the new state both in the page
and in GET /api/v1/control/jobs/J. The page must log no console error, failed request or
Content-Security-Policy violation. The script prints "ok: ..." per step and a final
"RESULT {json}" line, which is checked here again; its screenshot goes to the test's tmp dir and
is copied to dashboard.png beside the sluice binary (and to $SLUICE_KEEP_SCREENSHOT if set).

playwright-core is pinned by tests/browser/package-lock.json and installed with `npm ci` when
tests/browser/node_modules is missing or does not match the lockfile. Missing chromium, node or
npm is a failure, not a skip: deploy/install-deps.sh installs them, and a skipped browser test
would hide a missing install step on a fresh machine.
"""
# ctest-labels: peer
import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time

import pytest
import requests

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
JOB = "orders_etl"
SOURCE_DIR = os.environ.get("SLUICE_SOURCE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "../..")
BROWSER_DIR = os.path.join(os.path.abspath(SOURCE_DIR), "tests", "browser")
SPEC = os.path.join(BROWSER_DIR, "dashboard.spec.mjs")


def node_modules_stale():
    """Why tests/browser/node_modules must be (re)installed, or None when it matches the lockfile:
    every locked package present at its locked version, and the lockfile not newer than npm's
    record of the last install (node_modules/.package-lock.json)."""
    lock_path = os.path.join(BROWSER_DIR, "package-lock.json")
    installed = os.path.join(BROWSER_DIR, "node_modules", ".package-lock.json")
    if not os.path.exists(installed):
        return "node_modules missing"
    if os.path.getmtime(lock_path) > os.path.getmtime(installed):
        return "package-lock.json is newer than node_modules"
    with open(lock_path) as f:
        lock = json.load(f)
    for key, meta in lock.get("packages", {}).items():
        if not key.startswith("node_modules/"):
            continue
        try:
            with open(os.path.join(BROWSER_DIR, key, "package.json")) as f:
                have = json.load(f).get("version")
        except (OSError, ValueError):
            have = None
        if have != meta.get("version"):
            return f"{key} is {have}, lockfile wants {meta.get('version')}"
    return None


def npm_ci():
    """`npm ci` in tests/browser when needed; serialised with a lock so two runs don't race."""
    npm = shutil.which("npm")
    assert npm, "npm is not installed: run deploy/install-deps.sh"
    with open(os.path.join(tempfile.gettempdir(), "sluice-browser-npm-ci.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        why = node_modules_stale()
        if why is None:
            return
        env = {**os.environ, "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1", "npm_config_update_notifier": "false"}
        cmd = [npm, "ci", "--prefix", BROWSER_DIR, "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"]
        for attempt in range(2):  # one retry for a registry hiccup
            r = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
            if r.returncode == 0:
                break
            time.sleep(2)
        assert r.returncode == 0, f"npm ci ({why}) failed:\n{r.stdout}\n{r.stderr}"
        assert node_modules_stale() is None, f"node_modules still stale after npm ci: {node_modules_stale()}"


@pytest.fixture(scope="module")
def playwright():
    assert os.path.exists(CHROMIUM), "chromium is not installed: run deploy/install-deps.sh"
    node = shutil.which("node")
    assert node, "node is not installed: run deploy/install-deps.sh"
    npm_ci()
    return node


def flink_body(tm, tick):
    """One TaskManager's push, with Flink's names and labels: two tasks of two subtasks each, two
    operators per task. Counters grow by 1000 per tick per operator; the source task is hardly
    backpressured (OK), the sink task is backpressured 70% of the time (HIGH)."""
    tasks = [("Source: Orders -> Map", ["Source: Orders", "Map"], 40.0),
             ("Window -> Sink: Warehouse", ["Window", "Sink: Warehouse"], 700.0)]
    out = []
    for metric in ("numRecordsIn", "numRecordsOut"):
        fam = f"flink_taskmanager_job_task_operator_{metric}"
        out += [f"# HELP {fam} {metric} (scope: taskmanager_job_task_operator)", f"# TYPE {fam} gauge"]
        for ti, (task, ops, _) in enumerate(tasks):
            for sub in range(2):
                for oi, op in enumerate(ops):
                    out.append(f'{fam}{{host="tm{tm}",tm_id="tm{tm}",job_id="0f",job_name="{JOB}",task_id="t{ti}",'
                               f'task_name="{task}",task_attempt_id="a",task_attempt_num="0",subtask_index="{tm * 2 + sub}",'
                               f'operator_id="o{ti}{oi}",operator_name="{op}",}} {float(1000 * tick + 7 * oi)}')
    for metric, pick in (("backPressuredTimeMsPerSecond", lambda t: t[2]), ("busyTimeMsPerSecond", lambda t: 300.0)):
        fam = f"flink_taskmanager_job_task_{metric}"
        out += [f"# HELP {fam} {metric} (scope: taskmanager_job_task)", f"# TYPE {fam} gauge"]
        for ti, t in enumerate(tasks):
            for sub in range(2):
                out.append(f'{fam}{{host="tm{tm}",tm_id="tm{tm}",job_id="0f",job_name="{JOB}",task_id="t{ti}",'
                           f'task_name="{t[0]}",task_attempt_id="a",task_attempt_num="0",subtask_index="{tm * 2 + sub}",}} '
                           f'{pick(t) + sub}')
    return "\n".join(out) + "\n"


class Pusher(threading.Thread):
    """Two TaskManagers pushing every second, as Flink does every 10 s."""

    def __init__(self, url):
        super().__init__(daemon=True)
        self.url, self.stop_ev, self.tick, self.error = url, threading.Event(), 0, None

    def run(self):
        try:
            while not self.stop_ev.is_set():
                self.tick += 1
                for tm in range(2):
                    r = requests.put(f"{self.url}/metrics/job/flink_tm{tm}", data=flink_body(tm, self.tick).encode(),
                                     headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}, timeout=10)
                    assert r.status_code == 200, r.text
                self.stop_ev.wait(1.0)
        except Exception as e:  # surfaced by the test
            self.error = e


def test_dashboard_end_to_end(sluice, tmpdir_path, playwright):
    pusher = Pusher(sluice.url)
    pusher.start()
    shot = os.path.join(tmpdir_path, "dashboard.png")
    try:
        # Let a few pushes land so there are complete seconds to draw.
        deadline = time.time() + 20
        while time.time() < deadline and pusher.tick < 4 and pusher.error is None:
            time.sleep(0.2)
        assert pusher.error is None, pusher.error
        proc = subprocess.Popen([playwright, SPEC, "--url", sluice.url, "--screenshot", shot, "--job", JOB,
                                 "--chromium", CHROMIUM],
                                cwd=BROWSER_DIR, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.terminate()  # playwright closes its chromium on SIGTERM
            try:
                out, err = proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            pytest.fail(f"dashboard.spec.mjs timed out\n{out}\n{err}")
        assert proc.returncode == 0, f"dashboard.spec.mjs exited with {proc.returncode}\n{out}\n{err}"
        assert pusher.error is None, pusher.error
    finally:
        pusher.stop_ev.set()
        pusher.join(10)

    results = [line[len("RESULT "):] for line in out.splitlines() if line.startswith("RESULT ")]
    assert len(results) == 1, out
    result = json.loads(results[0])
    assert result["passed"] is True, result
    assert result["levels"] == {"Source: Orders -> Map": "OK", "Window -> Sink: Warehouse": "HIGH"}, result
    assert 0 < result["recordsInPerSec"] <= 16000, result
    assert result["state"]["mode"] == "paused" and result["state"]["reason"] == "browser test", result
    for step in ("listed and selected", "bars:", "backpressure:", "pause asks for confirmation",
                 "paused: badge", "screenshot", "no console errors"):
        assert any(line.startswith("ok: ") and step in line for line in out.splitlines()), (step, out)
    # The script saw the pause through the API; the daemon still says so after the browser left.
    state = requests.get(f"{sluice.url}/api/v1/control/jobs/{JOB}").json()
    assert state["mode"] == "paused" and state["reason"] == "browser test", state

    with open(shot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(shot) > 10000
    build_dir = os.path.dirname(os.path.abspath(os.environ.get("SLUICE_BIN", "build/sluice")))
    if os.path.isdir(build_dir):
        shutil.copy(shot, os.path.join(build_dir, "dashboard.png"))
    if os.environ.get("SLUICE_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["SLUICE_KEEP_SCREENSHOT"])


def test_dashboard_page_has_no_inline_script(sluice):
    html = requests.get(sluice.url + "/").text
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", html, re.S)
    assert scripts and all('src="' in attrs and body.strip() == "" for attrs, body in scripts), scripts
    assert "<style" not in html and not re.search(r"<[^>]*\sstyle\s*=", html)
    assert not re.search(r"<[^>]*\son[a-z]+\s*=", html), "inline event handler"
