"""Remote-write sender against a real Prometheus 2.42 receiver (--web.enable-remote-write-receiver):

  * samples and staleness markers arrive bit for bit (read back through Prometheus' own remote
    read), with the external labels;
  * Prometheus SIGKILLed in the middle of a stream of writes and restarted on its data (its WAL
    holds what it acknowledged), and sluice stopped and restarted while Prometheus is down:
    every sample arrives, no batch is refused (so nothing reached it out of order).

Nothing is skipped: a missing prometheus binary is a failure (deploy/install-deps.sh installs it).
"""
# ctest-labels: peer
import os
import shutil
import subprocess
import time
import urllib.request

import pytest

import promproto as pp
from conftest import free_port
from test_forward import metric, wait_until

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


class PromReceiver:
    def __init__(self, workdir, port):
        assert os.access(PROMETHEUS, os.X_OK), "prometheus not installed"
        self.port, self.dir = port, workdir
        self.url = "http://127.0.0.1:%d" % port
        with open(os.path.join(workdir, "prometheus.yml"), "w") as f:
            f.write("global:\n  scrape_interval: 1h\n")
        self.proc = None

    def start(self):
        log = open(os.path.join(self.dir, "prometheus.log"), "ab")
        self.proc = subprocess.Popen(
            [PROMETHEUS, "--config.file=" + os.path.join(self.dir, "prometheus.yml"),
             "--storage.tsdb.path=" + os.path.join(self.dir, "tsdb"), "--web.listen-address=127.0.0.1:%d" % self.port,
             "--web.enable-remote-write-receiver"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.time() + 120
        while time.time() < deadline:
            assert self.proc.poll() is None, "prometheus exited"
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError("prometheus not ready")

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def read(self, name, start, end):
        """{series label: [(t, bits)]} through Prometheus' remote read."""
        st, _, res = pp.remote_read(self.url, [(start, end, [(pp.EQ, "__name__", name)], None)])
        assert st == 200, res
        out = {}
        for labels, samples in res[0]:
            d = dict(labels)
            assert d.get("cluster") == "eu1", d
            out.setdefault(d["series"], []).extend(samples)
        return out


@pytest.fixture
def prom(tmpdir_path):
    d = os.path.join(tmpdir_path, "prom")
    os.makedirs(d)
    p = PromReceiver(d, free_port())
    yield p
    p.stop()


STALE = pp.bits2f(pp.STALE_NAN_BITS)


def write(sluice, tag, t0, nseries, nsamples, stale_at_end=False):
    series, expect = [], {}
    for s in range(nseries):
        samples = [(t0 + i * 1000, float(s * 100 + i)) for i in range(nsamples)]
        if stale_at_end:
            samples.append((t0 + nsamples * 1000, STALE))
        series.append(([("__name__", "fw_" + tag), ("series", str(s))], samples))
        expect[str(s)] = samples
    st, _, body = pp.remote_write(sluice.url, series)
    assert st == 204, body
    return expect


def all_there(prom, tag, expect, start, end):
    got = prom.read("fw_" + tag, start, end)
    missing = 0
    for s, samples in expect.items():
        have = dict(got.get(s, []))
        for t, v in samples:
            if t not in have or not pp.same_value(have[t], v):
                missing += 1
    return True if missing == 0 else "%d samples missing" % missing


def args(prom, *extra):
    return ("--remote-write.url=%s/api/v1/write name=t" % prom.url, "--external-label=cluster=eu1",
            "--remote-write.shards=3", "--remote-write.max-samples-per-send=40", "--remote-write.min-backoff=20ms",
            "--remote-write.max-backoff=300ms", *extra)


def test_samples_and_stale_markers_arrive_bit_for_bit(start_sluice, prom):
    prom.start()
    s = start_sluice(*args(prom))
    t0 = int(time.time()) * 1000 - 300_000
    expect = write(s, "p", t0, 8, 50, stale_at_end=True)
    wait_until(lambda: all_there(prom, "p", expect, t0, t0 + 100_000), what="samples in Prometheus")
    got = prom.read("fw_p", t0, t0 + 100_000)
    for k, samples in expect.items():
        assert got[k][-1][1] == pp.STALE_NAN_BITS  # the marker itself, not just any NaN
        assert len(got[k]) == len(samples)
    assert metric(s, "samples_failed_total") == 0


def test_prometheus_killed_and_sluice_restarted(start_sluice, prom, tmpdir_path):
    prom.start()
    data = os.path.join(tmpdir_path, "data-p")
    s = start_sluice(*args(prom, "--storage.snapshot-interval=1s"), data_dir=data)
    t0 = int(time.time()) * 1000 - 600_000
    expect = {}

    def add(part):
        for k, v in part.items():
            expect.setdefault(k, []).extend(v)
    for k in range(6):
        add(write(s, "k", t0 + k * 30_000, 6, 30))
        if k == 2:
            prom.kill()  # SIGKILL, in the middle of the stream
        time.sleep(0.3)
    # sluice restarts while Prometheus is still down
    assert s.stop() == 0
    s = start_sluice(*args(prom, "--storage.snapshot-interval=1s"), data_dir=data)
    add(write(s, "k", t0 + 200_000, 6, 30))
    time.sleep(1.5)
    prom.start()
    wait_until(lambda: all_there(prom, "k", expect, t0, t0 + 400_000), what="every sample in Prometheus")
    wait_until(lambda: metric(s, "samples_pending") == 0 or "pending", what="queue to drain")
    assert metric(s, "samples_failed_total") == 0, s.read_log()
