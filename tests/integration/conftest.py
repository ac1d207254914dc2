"""Shared fixtures for integration tests: start the built sluice binary on a free port with a
temporary data directory, and stop it afterwards (checking it exits cleanly); start a real
Prometheus 2.42 beside one for differential tests."""
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest
import requests

SLUICE_BIN = os.environ.get("SLUICE_BIN", os.path.join(os.path.dirname(__file__), "../../build/sluice"))


def free_port():
    """A port nothing listens on, below the kernel's ephemeral range. A port the kernel hands out
    for port 0 is an ephemeral one, which it can give to any outgoing connection (another test's
    client) in the seconds before the server meant to bind it starts; test_forward lost a run to
    that. Below the range only explicit binds can take it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200) if low > 11000 else ():
        port = random.randint(10000, low - 1)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sluice:
    """A running sluice process. `url` is its base URL; `stop()` sends SIGTERM and waits."""

    def __init__(self, data_dir, extra_args=(), port=None, env=None):
        self.port = port or free_port()
        self.data_dir = data_dir
        self.url = f"http://127.0.0.1:{self.port}"
        os.makedirs(os.path.dirname(os.path.abspath(data_dir)), exist_ok=True)
        self.log_path = os.path.join(os.path.dirname(os.path.abspath(data_dir)), f"sluice-{self.port}.log")
        self.args = [SLUICE_BIN, f"--web.listen-address=127.0.0.1:{self.port}",
                     f"--storage.path={data_dir}", *extra_args]
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})

    def wait_ready(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sluice exited with {self.proc.returncode}: {self.read_log()}")
            try:
                if requests.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise RuntimeError("sluice did not become ready: " + self.read_log())

    def read_log(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    # 90 s, not 30: the shutdown snapshot waits for the roll-up writer's cycle (catalog rows of
    # every new series), and that thread runs at nice 10. Under ASan with both cores busy (two CPU
    # hogs), the snapshot of 40k new series took 13-28 s (2.5 s on a quiet machine).
    def stop(self, sig=signal.SIGTERM, timeout=90):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        self.log.close()
        return self.proc.returncode

    def kill9(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()


@pytest.fixture
def tmpdir_path():
    with tempfile.TemporaryDirectory(prefix="sluice-it-") as d:
        yield d


@pytest.fixture
def start_sluice(tmpdir_path):
    """Factory: start_sluice(*args) -> ready Sluice. Every instance is stopped at teardown and must
    exit 0 (a sanitizer report makes it exit non-zero)."""
    started = []

    def start(*args, data_dir=None, wait=True, env=None):
        d = data_dir or os.path.join(tmpdir_path, f"data{len(started)}")
        s = Sluice(d, args, env=env)
        started.append(s)
        return s.wait_ready() if wait else s

    yield start
    for s in started:
        if s.proc.poll() is None:
            rc = s.stop()
            assert rc == 0, f"sluice exited with {rc}:\n{s.read_log()}"
        else:
            s.log.close() if not s.log.closed else None


@pytest.fixture
def sluice(start_sluice):
    return start_sluice()


PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


@contextlib.contextmanager
def prometheus_beside_sluice(prefix, sluice_args=(), rules=None):
    """A real Prometheus (remote-write receiver on) and a sluice, both ready, in a temporary
    folder: yields (prometheus_url, sluice). rules: a rule file's text both load (Prometheus
    evaluating every 2 s). Both are stopped on exit; sluice must exit 0."""
    d = tempfile.mkdtemp(prefix=prefix)
    port = free_port()
    cfg = os.path.join(d, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write("global:\n  scrape_interval: 15s\n")
        if rules is not None:
            path = os.path.join(d, "rules.yml")
            with open(path, "w") as r:
                r.write(rules)
            f.write(f"  evaluation_interval: 2s\nrule_files:\n- {path}\n")
            sluice_args = [*sluice_args, f"--rules.file={path}"]
    plog = open(os.path.join(d, "prometheus.log"), "wb")
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={d}/prom",
                             f"--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver"],
                            stdout=plog, stderr=subprocess.STDOUT)
    prom_url = f"http://127.0.0.1:{port}"
    sl = Sluice(os.path.join(d, "sluice"), sluice_args)
    try:
        deadline = time.time() + 60
        while True:
            try:
                if requests.get(prom_url + "/-/ready", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.time() > deadline or prom.poll() is not None:
                raise RuntimeError("prometheus did not start")
            time.sleep(0.1)
        sl.wait_ready()
        yield prom_url, sl
    finally:
        prom.send_signal(signal.SIGTERM)
        prom.wait(timeout=30)
        plog.close()
        rc = sl.stop()
        log = sl.read_log() if rc != 0 else ""
        shutil.rmtree(d, ignore_errors=True)
        assert rc == 0, log
