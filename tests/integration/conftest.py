"""Shared fixtures for integration tests: start the built sluice binary on a free port with a
temporary data directory, and stop it afterwards (checking it exits cleanly)."""
import os
import signal
import socket
import subprocess
import tempfile
import time

import pytest
import requests

SLUICE_BIN = os.environ.get("SLUICE_BIN", os.path.join(os.path.dirname(__file__), "../../build/sluice"))


def free_port():
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

    def stop(self, sig=signal.SIGTERM, timeout=30):
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
