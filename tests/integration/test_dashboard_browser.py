"""The dashboard in a real browser: Debian's headless Chromium, driven over the DevTools protocol.

Start sluice, push a synthetic Flink job (two TaskManagers, Flink's metric names, one task
backpressured HIGH and one OK) every second, open http://.../, click the job, wait for non-zero
bars and the backpressure strips, press Pause, confirm in the dialog, and see the new state both
in the page and in GET /api/v1/control/jobs/J. The page must log no console error (that includes
a Content-Security-Policy violation or a failed request) and a screenshot is written to the build
folder (dashboard.png beside the sluice binary) and to the test's tmp dir.

Chromium is driven through --remote-debugging-pipe (fd 3 commands in, fd 4 replies out, JSON
messages ending in NUL): the protocol Playwright itself speaks, without node or a websocket
client; docs/dashboard.md says why.
"""
import base64
import json
import os
import re
import select
import shutil
import threading
import time

import pytest
import requests

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
JOB = "orders_etl"



@pytest.fixture(autouse=True)
def need_chromium():
    # A failure, not a skip: deploy/install-deps.sh installs it, and a skipped browser test would
    # hide a missing install step on a fresh machine.
    assert os.path.exists(CHROMIUM), "chromium is not installed: run deploy/install-deps.sh"


class Browser:
    """A headless Chromium with one page, driven over the DevTools pipe."""

    def __init__(self, workdir):
        self.next_id = 0
        self.events = []
        self.buf = b""
        cmd_r, self.cmd_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.log = open(os.path.join(workdir, "chromium.log"), "wb")
        args = [CHROMIUM, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--no-first-run", "--no-default-browser-check", f"--user-data-dir={workdir}/profile",
                "--disable-extensions", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-default-apps", "--no-pings", "--disable-domain-reliability",
                "--mute-audio", "--hide-scrollbars", "--window-size=1400,900", "about:blank"]
        fa = [(os.POSIX_SPAWN_DUP2, cmd_r, 3), (os.POSIX_SPAWN_DUP2, out_w, 4),
              (os.POSIX_SPAWN_DUP2, self.log.fileno(), 1), (os.POSIX_SPAWN_DUP2, self.log.fileno(), 2)]
        self.pid = os.posix_spawn(CHROMIUM, args, os.environ, file_actions=fa)
        os.close(cmd_r)
        os.close(out_w)
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(domain + ".enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": 1400, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=True)

    def _read(self, deadline):
        while b"\0" not in self.buf:
            left = deadline - time.time()
            if left <= 0 or not select.select([self.out_r], [], [], left)[0]:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self.out_r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, params=None, session=False, timeout=30):
        self.next_id += 1
        mid = self.next_id
        m = {"id": mid, "method": method, "params": params or {}}
        if session:
            m["sessionId"] = self.session
        os.write(self.cmd_w, json.dumps(m).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            r = self._read(deadline)
            if r.get("id") == mid:
                if "error" in r:
                    raise RuntimeError(f"{method}: {r['error']}")
                return r.get("result", {})
            self.events.append(r)

    def pump(self):
        """Collects the events that arrived meanwhile."""
        while select.select([self.out_r], [], [], 0)[0] or b"\0" in self.buf:
            self.events.append(self._read(time.time() + 5))

    def js(self, expr):
        r = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True},
                      session=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expr, what, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = self.js(expr)
            if v:
                return v
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what} ({expr})")

    def click(self, selector):
        """A real mouse click at the element's centre (as a person would, not element.click())."""
        box = self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
                      " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
                      " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        assert box, f"no element {selector}"
        for t in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": t, "x": box[0], "y": box[1], "button": "left",
                                                   "clickCount": 1}, session=True)

    def screenshot(self, path):
        """The whole page, top to bottom."""
        self.js("window.scrollTo(0, 0)")
        size = self.call("Page.getLayoutMetrics", session=True)["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        data = self.call("Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True},
                         session=True)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def console_errors(self):
        self.pump()
        errs = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                errs.append(p["exceptionDetails"].get("exception", {}).get("description") or p["exceptionDetails"]["text"])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errs.append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
                errs.append(p["entry"]["text"] + " " + p["entry"].get("url", ""))
        return errs

    def close(self):
        try:
            self.call("Browser.close", timeout=5)
        except Exception:
            pass
        for _ in range(50):
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                break
            time.sleep(0.1)
        else:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        os.close(self.cmd_w)
        os.close(self.out_r)
        self.log.close()


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


def test_dashboard_end_to_end(sluice, tmpdir_path):
    pusher = Pusher(sluice.url)
    pusher.start()
    browser = Browser(tmpdir_path)
    try:
        # Let a few pushes land so there are complete seconds to draw.
        deadline = time.time() + 20
        while time.time() < deadline and pusher.tick < 4:
            time.sleep(0.2)
        browser.call("Page.navigate", {"url": sluice.url + "/"}, session=True)
        browser.wait_for(f"[...document.querySelectorAll('#jobs button')].some(b => b.dataset.job === {json.dumps(JOB)})",
                         "the job in the jobs list")
        browser.click(f"#jobs button[data-job={json.dumps(JOB)}]")
        assert browser.js("document.getElementById('job-name').textContent") == JOB

        # Live bars: the uPlot canvas is there and the text alternative reports non-zero records/s.
        summary = browser.wait_for(
            "(() => { const t = document.getElementById('chart-summary').textContent;"
            " return /records in\\/s/.test(t) && !/ 0 records in/.test(t) ? t : null; })()", "non-zero bars")
        assert browser.js("!!document.querySelector('#chart canvas')")
        rows = browser.js("[...document.querySelectorAll('#chart-table tbody tr')].map(r => [...r.cells].map(c => c.textContent))")
        assert rows and all(float(r[1].replace(",", "")) > 0 for r in rows), rows
        # 2 TaskManagers x 2 tasks x 2 subtasks x 2 operators, each +1000 per push: 16,000 per
        # second when pushes are one second apart, less when one slips into the next second.
        n = float(re.search(r"([\d,.]+) records in/s", summary).group(1).replace(",", ""))
        assert 0 < n <= 16000, summary

        # Backpressure strips: the sink task HIGH, the source OK, with coloured cells.
        browser.wait_for("document.querySelectorAll('#bp .bp-row').length === 2", "two backpressure rows")
        levels = browser.js("Object.fromEntries([...document.querySelectorAll('#bp .bp-row')].map(r =>"
                            " [r.querySelector('.bp-name').textContent, r.querySelector('.bp-level').textContent]))")
        assert levels == {"Source: Orders -> Map": "OK", "Window -> Sink: Warehouse": "HIGH"}, levels
        assert browser.js("document.querySelectorAll('#bp .cell.high').length") > 0
        assert browser.js("document.querySelectorAll('#bp .cell.ok').length") > 0

        # Pause: a confirmation first, nothing changes until it is confirmed.
        browser.js("document.getElementById('reason').value = 'browser test'")
        browser.click("#btn-pause")
        browser.wait_for("document.getElementById('confirm').open", "the confirmation dialog")
        assert requests.get(f"{sluice.url}/api/v1/control/jobs/{JOB}").json()["mode"] == "running"
        browser.click("#confirm-ok")
        browser.wait_for("document.getElementById('job-mode').textContent === 'paused'", "the paused badge")
        state = requests.get(f"{sluice.url}/api/v1/control/jobs/{JOB}").json()
        assert state["mode"] == "paused" and state["reason"] == "browser test", state
        browser.wait_for("document.querySelectorAll('#history tbody tr').length === 1", "the history row")
        browser.wait_for(f"document.querySelector('#jobs button[data-job={json.dumps(JOB)}] .badge').textContent === 'paused'",
                         "the paused badge in the jobs list")
        time.sleep(1.5)  # one more flow event, so the screenshot shows the live state

        shot = os.path.join(tmpdir_path, "dashboard.png")
        browser.screenshot(shot)
        assert os.path.getsize(shot) > 10000
        build_dir = os.path.dirname(os.path.abspath(os.environ.get("SLUICE_BIN", "build/sluice")))
        if os.path.isdir(build_dir):
            shutil.copy(shot, os.path.join(build_dir, "dashboard.png"))
        if os.environ.get("SLUICE_KEEP_SCREENSHOT"):
            shutil.copy(shot, os.environ["SLUICE_KEEP_SCREENSHOT"])

        errors = browser.console_errors()
        assert errors == [], errors
        assert pusher.error is None, pusher.error
    finally:
        pusher.stop_ev.set()
        pusher.join(10)
        browser.close()


def test_dashboard_page_has_no_inline_script(sluice):
    html = requests.get(sluice.url + "/").text
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", html, re.S)
    assert scripts and all('src="' in attrs and body.strip() == "" for attrs, body in scripts), scripts
    assert "<style" not in html and not re.search(r"<[^>]*\sstyle\s*=", html)
    assert not re.search(r"<[^>]*\son[a-z]+\s*=", html), "inline event handler"
