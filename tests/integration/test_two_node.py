"""The two-sluice setup of docs/deploy.md ("Two nodes, one central store"), with a real
Prometheus 2.42 (Debian's, started here) as the central store:

  * sluice-0 and sluice-1 both forward everything (--remote-write.url, with a shared
    --external-label site=eu1) to Prometheus' remote-write receiver, and both fall through to its
    remote read with --remote-read.read-recent;
  * Flink-style push groups of job "alpha" go to sluice-0 and of job "beta" to sluice-1 (what the
    job-hash routing in front does; the routing rule itself is checked in test_deploy.py);
  * once Prometheus holds every pushed sample, PromQL through EITHER node answers for both jobs:
    instant, range (every push exactly once: a node's own samples and their forwarded copies are
    one series, the external label stripped on the way back), sum by, label values and series --
    and equals Prometheus' own answer (minus the external label) and the other node's answer.

Nothing is skipped: a missing prometheus binary is a failure (deploy/install-deps.sh installs it).
"""
# ctest-labels: peer
import os
import shutil
import subprocess
import time

import pytest
import requests

from conftest import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PUSHES = 4


class Central:
    def __init__(self, workdir):
        assert os.access(PROMETHEUS, os.X_OK), "prometheus not installed"
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        cfg = os.path.join(workdir, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
        self.log_path = os.path.join(workdir, "prometheus.log")
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS, "--config.file=" + cfg, "--storage.tsdb.path=" + os.path.join(workdir, "tsdb"),
             "--web.listen-address=127.0.0.1:%d" % self.port, "--web.enable-remote-write-receiver"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        wait_until(lambda: self.ready(), 120, "prometheus not ready")

    def ready(self):
        assert self.proc.poll() is None, self.log()
        try:
            return requests.get(self.url + "/-/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-5000:]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_until(cond, timeout, what):
    """what: the failure message, or a function giving it (called only on failure, so it can
    describe the state at the time out)."""
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, what() if callable(what) else what
        time.sleep(0.1)


@pytest.fixture
def central(tmpdir_path):
    d = os.path.join(tmpdir_path, "central")
    os.makedirs(d)
    c = Central(d)
    yield c
    c.stop()


def node_args(central):
    return ("--remote-write.url=%s/api/v1/write name=central" % central.url, "--external-label=site=eu1",
            "--remote-write.min-backoff=20ms", "--remote-write.max-backoff=200ms",
            "--remote-read.url=%s/api/v1/read name=central" % central.url, "--remote-read.read-recent",
            "--remote-read.on-error=fail")


def push(node, job, tm, k):
    body = ('# TYPE two_records_total counter\ntwo_records_total{task="src"} %d\n'
            'two_records_total{task="sink"} %d\n# TYPE two_busy_ratio gauge\ntwo_busy_ratio %s\n'
            % (100 * k + len(job), 90 * k, 0.125 * k))
    r = requests.put("%s/metrics/job/%s/instance/%s" % (node.url, job, tm), data=body, timeout=30)
    assert r.status_code in (200, 202), r.text


def api(base, path, **params):
    r = requests.get(base + path, params=params, timeout=60)
    assert r.status_code == 200, (path, params, r.text)
    d = r.json()
    assert d["status"] == "success", d
    assert not d.get("warnings"), d
    return d["data"]


def canon(data, drop=()):
    """Sorted [(labels, points)] of a vector/matrix result, labels in `drop` removed."""
    out = []
    for s in data["result"]:
        m = tuple(sorted((k, v) for k, v in s["metric"].items() if k not in drop))
        pts = s["values"] if "values" in s else [s["value"]]
        out.append((m, [(float(t), v) for t, v in pts]))
    return sorted(out)


def test_two_nodes_each_answer_for_all_jobs(start_sluice, central):
    n0 = start_sluice(*node_args(central))
    n1 = start_sluice(*node_args(central))
    first = time.time()
    last_sec = None
    for k in range(1, PUSHES + 1):
        # one push per second and group (sluice keeps one sample per series and second): the
        # next round starts in a second after the one this round's last push ended in (under a
        # loaded make test the four pushes once ran into the next second, where the next round's
        # push of the same group replaced that sample)
        wait_until(lambda: int(time.time()) != last_sec, 5, "clock")
        for tm in ("tm-1", "tm-2"):
            push(n0, "alpha", tm, k)
            push(n1, "beta", tm, k)
        last_sec = int(time.time())

    # Every push forwarded: Prometheus has PUSHES samples of each of the 12 series.
    def central_complete():
        d = requests.get(central.url + "/api/v1/query",
                         params={"query": "count_over_time({__name__=~\"two_.*\"}[5m])"}, timeout=10).json()
        res = d.get("data", {}).get("result", [])
        return len(res) == 12 and all(r["value"][1] == str(PUSHES) for r in res)
    def central_missing():
        """What Prometheus holds per series, what each node's sender counted, and every log."""
        d = requests.get(central.url + "/api/v1/query",
                         params={"query": "count_over_time({__name__=~\"two_.*\"}[5m])"}, timeout=10).json()
        counts = sorted((str(sorted(r["metric"].items())), r["value"][1]) for r in d.get("data", {}).get("result", []))
        out = ["prometheus did not receive every sample (%d pushes each); it holds:" % PUSHES]
        out += ["  %s: %s" % c for c in counts]
        for name, node in (("node 0", n0), ("node 1", n1)):
            m = requests.get(node.url + "/metrics", timeout=10).text
            out.append("%s sender: %s" % (name, "; ".join(
                line for line in m.splitlines() if line.startswith("sluice_remote_storage_"))))
            out.append("%s log:\n%s" % (name, node.read_log()))
        out.append("prometheus log:\n" + central.log())
        return "\n".join(out)
    wait_until(central_complete, 60, central_missing)
    end = time.time() + 1

    # Each node holds only its own job's groups (the rest comes through the fall-through).
    for node, mine, other in ((n0, "alpha", "beta"), (n1, "beta", "alpha")):
        groups = requests.get(node.url + "/metrics", timeout=10).text
        assert 'job="%s"' % mine in groups and 'job="%s"' % other not in groups

    queries = [("two_records_total", {}), ("sum by (job) (two_records_total)", {}),
               ("two_busy_ratio", {}), ("max_over_time(two_busy_ratio[2m])", {})]
    for q, _ in queries:
        a = api(n0.url, "/api/v1/query", query=q, time=end)
        b = api(n1.url, "/api/v1/query", query=q, time=end)
        p = api(central.url, "/api/v1/query", query=q, time=end)
        assert canon(a) == canon(b) == canon(p, drop=("site",)), q
        assert {dict(m).get("job") for m, _ in canon(a)} == {"alpha", "beta"}, q
    # Range, at the push resolution: every push exactly once through either node.
    start = int(first) - 1
    for q in ("two_records_total", "two_busy_ratio"):
        a = api(n0.url, "/api/v1/query_range", query=q, start=start, end=end, step=1)
        b = api(n1.url, "/api/v1/query_range", query=q, start=start, end=end, step=1)
        p = api(central.url, "/api/v1/query_range", query=q, start=start, end=end, step=1)
        assert canon(a) == canon(b) == canon(p, drop=("site",)), q
    raw = api(n0.url, "/api/v1/query", query="two_records_total[5m]", time=end)
    assert len(raw["result"]) == 8
    for s in raw["result"]:
        assert len(s["values"]) == PUSHES, s  # local + forwarded copy = one sample each
        assert "site" not in s["metric"]
    for node in (n0, n1):
        assert api(node.url, "/api/v1/label/job/values", start=start, end=end) == ["alpha", "beta"]
        series = api(node.url, "/api/v1/series", **{"match[]": "two_busy_ratio", "start": start, "end": end})
        assert sorted(s["job"] + "/" + s["instance"] for s in series) == [
            "alpha/tm-1", "alpha/tm-2", "beta/tm-1", "beta/tm-2"]
