"""Remote-write sender (api/forward.c): sluice forwards every accepted sample to remote-write
receivers, reading its own WAL.

  * a real VictoriaMetrics (Debian's victoria-metrics, standing in for a cluster's insert node):
    pushes, remote writes, recording-rule outputs and staleness markers all arrive, with the
    external labels; the receiver is down at first, stopped in the middle and restarted; sluice is
    stopped and killed -9 in the middle, with snapshots (and WAL truncation) happening meanwhile:
    every sample arrives, and what arrives twice stays within one resent round;
  * a scripted receiver (Python): a 400 drops just its batch, counted and logged, and the queue
    goes on; 5xx is retried with backoff; 429 is dropped unless retry-on-429, which honours
    Retry-After; headers, basic auth and bearer tokens are sent.

Nothing is skipped: a missing victoria-metrics binary is a failure (deploy/install-deps.sh).
"""
# ctest-labels: peer slow
import http.server
import json
import math
import os
import re
import shutil
import signal
import struct
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest
import snappy

import promproto as pp
from conftest import free_port

VM = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
SHARDS = 2
PER_SEND = 50


# ---- helpers -----------------------------------------------------------------------------------


class PortTaken(AssertionError):
    pass


class VictoriaMetrics:
    def __init__(self, workdir, port=None):
        assert os.access(VM, os.X_OK), "victoria-metrics not installed"
        self.workdir = workdir
        self.proc = None
        # A port from free_port() can be taken by a test running in parallel before VictoriaMetrics
        # binds it (it then exits at once): pick another one, a few times. A given port is kept.
        for attempt in range(4):
            self.port = port or free_port()
            self.url = "http://127.0.0.1:%d" % self.port
            try:
                self.start()
                return
            except PortTaken:
                if port or attempt == 3:
                    raise

    def log_tail(self):
        with open(os.path.join(self.workdir, "vm.log"), "rb") as f:
            return f.read()[-2000:].decode(errors="replace")

    def start(self):
        self.log = open(os.path.join(self.workdir, "vm.log"), "ab")
        self.proc = subprocess.Popen(
            [VM, "-storageDataPath=" + os.path.join(self.workdir, "vmdata"), "-httpListenAddr=127.0.0.1:%d" % self.port,
             "-retentionPeriod=100y", "-search.disableCache", "-loggerLevel=WARN"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.close()
                tail = self.log_tail()
                if "address already in use" in tail:
                    raise PortTaken(tail)
                raise AssertionError("victoria-metrics exited with status %d:\n%s" % (self.proc.returncode, tail))
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("victoria-metrics not ready")

    def kill(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def export(self, match):
        """{frozenset(labels): [(t, v), ...]} of everything stored (duplicates kept)."""
        q = urllib.parse.urlencode({"match[]": match})
        with urllib.request.urlopen(self.url + "/api/v1/export?" + q, timeout=60) as r:
            out = {}
            for line in r.read().decode().splitlines():
                if line.strip():
                    d = json.loads(line)
                    key = frozenset(d["metric"].items())
                    out.setdefault(key, []).extend(zip(d["timestamps"], d["values"]))
            return out


@pytest.fixture
def vm_factory(tmpdir_path):
    started = []

    def make(port=None):
        d = os.path.join(tmpdir_path, "vm%d" % len(started))
        os.makedirs(d)
        v = VictoriaMetrics(d, port)
        started.append(v)
        return v

    yield make
    for v in started:
        if v.proc and v.proc.poll() is None:
            v.stop()


def metrics(sluice):
    with urllib.request.urlopen(sluice.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r'^(sluice_remote_storage_[a-z_]+)\{remote_name="([^"]*)"[^}]*\} (\S+)$', line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def metric(sluice, name, remote="t"):
    return metrics(sluice).get(("sluice_remote_storage_" + name, remote), 0.0)


def write_batch(sluice, tag, t0_ms, nseries, nsamples, step_ms=1000):
    """Remote-writes nseries x nsamples into sluice; returns {series name: [(t, v)]}."""
    series, expect = [], {}
    for s in range(nseries):
        labels = [("__name__", "fw_%s" % tag), ("series", str(s))]
        samples = [(t0_ms + i * step_ms, float(s * 1000 + i)) for i in range(nsamples)]
        series.append((labels, samples))
        expect[str(s)] = samples
    st, _, body = pp.remote_write(sluice.url, series)
    assert st == 204, body
    return expect


def wait_until(fn, timeout=90, what="condition"):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = fn()
        if last is True:
            return
        time.sleep(0.25)
    raise AssertionError("timed out waiting for %s (last: %r)" % (what, last))


def vm_has_all(vm, tag, expect, extra_labels=(("cluster", "eu1"),)):
    """True when VM holds every expected sample of fw_<tag>; else a short description."""
    got = vm.export('{__name__="fw_%s"}' % tag)
    by_series = {}
    for key, vals in got.items():
        d = dict(key)
        for k, v in extra_labels:
            if d.get(k) != v:
                return "series without %s=%s: %r" % (k, v, d)
        by_series.setdefault(d["series"], []).extend(vals)
    missing = 0
    for s, samples in expect.items():
        have = set((t, v) for t, v in by_series.get(s, []))
        missing += sum(1 for x in samples if x not in have)
    return True if missing == 0 else "%d samples missing" % missing


def duplicates(vm, tag):
    got = vm.export('{__name__="fw_%s"}' % tag)
    return sum(len(v) - len(set(t for t, _ in v)) for v in got.values())


def sluice_args(target, *extra):
    return ("--remote-write.url=" + target, "--external-label=cluster=eu1", "--remote-write.shards=%d" % SHARDS,
            "--remote-write.max-samples-per-send=%d" % PER_SEND, "--remote-write.min-backoff=20ms",
            "--remote-write.max-backoff=300ms", *extra)


def now_ms():
    return int(time.time()) * 1000


# ---- VictoriaMetrics ---------------------------------------------------------------------------


def test_all_kinds_of_samples_arrive_with_external_labels(start_sluice, vm_factory, tmpdir_path):
    vm = vm_factory()
    rules = os.path.join(tmpdir_path, "rules.yml")
    with open(rules, "w") as f:
        f.write("groups:\n- name: g\n  interval: 1s\n  rules:\n  - record: fw_rule:sum\n"
                "    expr: sum(fw_push)\n")
    s = start_sluice(*sluice_args(vm.url + "/api/v1/write name=t", "--rules.file=" + rules,
                                  "--external-label=region=x"))
    t0 = now_ms() - 600_000
    expect = write_batch(s, "rw", t0, 20, 30)
    # a push (stamped now) and a PUT that drops one series: that one gets a staleness marker
    r = urllib.request.Request(s.url + "/metrics/job/j1", method="PUT",
                               data=b"fw_push{k=\"a\"} 1\nfw_push{k=\"b\"} 2\n")
    assert urllib.request.urlopen(r, timeout=10).status == 200
    time.sleep(1.1)
    r = urllib.request.Request(s.url + "/metrics/job/j1", method="PUT", data=b"fw_push{k=\"a\"} 3\n")
    assert urllib.request.urlopen(r, timeout=10).status == 200

    wait_until(lambda: vm_has_all(vm, "rw", expect, (("cluster", "eu1"), ("region", "x"))), what="remote writes")

    def pushes():
        got = {dict(k)["k"]: sorted(v) for k, v in vm.export('{__name__="fw_push"}').items()}
        return True if len(got.get("a", [])) >= 2 and len(got.get("b", [])) >= 1 else got
    wait_until(pushes, what="pushes")
    got = {dict(k)["k"]: (dict(k), sorted(v)) for k, v in vm.export('{__name__="fw_push"}').items()}
    assert got["a"][0]["job"] == "j1" and got["a"][0]["cluster"] == "eu1"
    assert [v for _, v in got["a"][1]][:2] == [1, 3]
    # the staleness marker: VictoriaMetrics keeps Prometheus stale markers as NaN-valued samples
    # (its export shows them as null / NaN) — b ends with a sample that is not 2
    b_vals = [v for _, v in got["b"][1]]
    assert b_vals[0] == 2 and len(b_vals) == 2 and (b_vals[1] is None or (isinstance(b_vals[1], float) and math.isnan(b_vals[1])) or b_vals[1] == "NaN"), b_vals

    def rule():
        got = vm.export('{__name__="fw_rule:sum"}')
        return True if got else "no recording rule output yet"
    wait_until(rule, what="recording rule output")
    wait_until(lambda: metric(s, "samples_pending") == 0 or "pending", what="queue to drain")
    assert metric(s, "samples_sent_total") >= 20 * 30 + 3
    assert metric(s, "samples_failed_total") == 0
    assert metric(s, "highest_sent_timestamp_seconds") >= now_ms() / 1000 - 60
    assert metric(s, "shards") == SHARDS


def test_receiver_down_killed_and_restarted(start_sluice, vm_factory):
    port = free_port()
    s = start_sluice(*sluice_args("http://127.0.0.1:%d/api/v1/write name=t" % port,
                                  "--storage.snapshot-interval=1s"))
    t0 = now_ms() - 1_200_000
    # 1. receiver not there yet: retried, and the snapshots meanwhile must not drop the WAL
    a = write_batch(s, "down", t0, 10, 40)
    wait_until(lambda: metric(s, "samples_retried_total") > 0 or "no retries yet", what="retries")
    assert metric(s, "samples_pending") > 0
    assert metric(s, "lag_seconds") > 0
    time.sleep(2.5)  # a few snapshots
    vm = vm_factory(port)
    wait_until(lambda: vm_has_all(vm, "down", a), what="backlog after the receiver came up")
    # 2. killed in the middle of a stream of writes, restarted on the same data
    b = {}
    for k in range(6):
        part = write_batch(s, "kill", t0 + 100_000 + k * 20_000, 10, 20)
        for key, v in part.items():
            b.setdefault(key, []).extend(v)
        if k == 2:
            # SIGTERM: VictoriaMetrics acknowledges writes from memory buffers it flushes every
            # second, so a SIGKILL loses samples it had already answered 204 for (its loss, not
            # the sender's). test_forward_prometheus.py SIGKILLs Prometheus, whose WAL has them.
            vm.stop()
        time.sleep(0.3)
    time.sleep(1.5)
    vm.start()
    wait_until(lambda: vm_has_all(vm, "kill", b), what="samples written while the receiver was killed")
    wait_until(lambda: metric(s, "samples_pending") == 0 or "pending", what="queue to drain")
    # at least once, not more than a resent round or two: rounds are SHARDS * PER_SEND samples
    assert duplicates(vm, "down") + duplicates(vm, "kill") <= 2 * SHARDS * PER_SEND
    assert metric(s, "samples_failed_total") == 0
    assert metric(s, "wal_segments_skipped_total") == 0


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_sluice_restart_in_the_middle(start_sluice, vm_factory, tmpdir_path, how):
    port = free_port()
    data = os.path.join(tmpdir_path, "data-restart")
    args = sluice_args("http://127.0.0.1:%d/api/v1/write name=t" % port, "--storage.snapshot-interval=1s")
    s = start_sluice(*args, data_dir=data)
    t0 = now_ms() - 1_500_000
    a = write_batch(s, "rs", t0, 10, 30)
    time.sleep(2.5)  # snapshots while nothing can be sent
    if how == "sigterm":
        assert s.stop() == 0
    else:
        s.kill9()
    assert os.listdir(os.path.join(data, "forward")), "no saved position"
    s2 = start_sluice(*args, data_dir=data)
    b = write_batch(s2, "rs", t0 + 60_000, 10, 30)
    vm = vm_factory(port)
    want = {k: a[k] + b[k] for k in a}
    wait_until(lambda: vm_has_all(vm, "rs", want), what="samples from before and after the restart")
    assert duplicates(vm, "rs") <= 2 * SHARDS * PER_SEND
    # and once everything is through, a further restart sends nothing again
    wait_until(lambda: metric(s2, "samples_pending") == 0 or "pending", what="queue to drain")
    time.sleep(1.2)  # the position is saved at most once a second
    assert s2.stop() == 0
    before = sum(len(v) for v in vm.export('{__name__="fw_rs"}').values())
    s3 = start_sluice(*args, data_dir=data)
    time.sleep(2)
    assert metric(s3, "samples_sent_total") == 0
    assert sum(len(v) for v in vm.export('{__name__="fw_rs"}').values()) == before


# ---- scripted receiver ---------------------------------------------------------------------------


def decode_write(body):
    """[(labels dict, [(t, v_bits)])] of a snappy WriteRequest."""
    out = []
    for f, _, v in pp.parse(snappy.uncompress(body)):
        if f != 1:
            continue
        labels, samples = {}, []
        for sf, _, sv in pp.parse(v):
            if sf == 1:
                lf = {k: x for k, _, x in pp.parse(sv)}
                labels[lf.get(1, b"").decode()] = lf.get(2, b"").decode()
            elif sf == 2:
                d = {k: x for k, _, x in pp.parse(sv)}
                samples.append((pp.to_int64(d.get(2, 0)), d.get(1, 0)))
        out.append((labels, samples))
    return out


class Script(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        srv = self.server
        with srv.lock:
            series = decode_write(body)
            srv.requests.append((dict(self.headers), series))
            status, extra = srv.decide(self.headers, series)
            if 200 <= status < 300:
                srv.accepted.extend(series)
        reason = b"" if status == 204 else b"scripted refusal: bad sample"
        self.send_response(status)
        for k, v in extra.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(reason)))
        self.end_headers()
        self.wfile.write(reason)


@pytest.fixture
def script():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Script)
    srv.lock = threading.Lock()
    srv.requests, srv.accepted = [], []
    srv.decide = lambda headers, series: (204, {})
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    srv.url = "http://127.0.0.1:%d/write" % srv.server_address[1]
    yield srv
    srv.shutdown()
    srv.server_close()


def accepted_names(srv):
    with srv.lock:
        return [(ls["__name__"], ls.get("series")) for ls, _ in srv.accepted]


def test_4xx_drops_the_batch_counts_logs_and_goes_on(start_sluice, script):
    def decide(headers, series):
        if any(ls["__name__"] == "fw_bad" for ls, _ in series):
            return 400, {}
        return 204, {}
    script.decide = decide
    s = start_sluice(*sluice_args(script.url + " name=t"))
    t0 = now_ms() - 300_000
    write_batch(s, "before", t0, 3, 2)
    wait_until(lambda: len(accepted_names(script)) >= 3 or "waiting", what="first batch")
    # separate rounds, so the refused batch holds only fw_bad
    bad = write_batch(s, "bad", t0, 1, 5)
    wait_until(lambda: metric(s, "samples_failed_total") == 5 or "waiting", what="the refusal")
    after = write_batch(s, "after", t0, 3, 2)
    wait_until(lambda: sum(1 for n, _ in accepted_names(script) if n == "fw_after") >= 3 or "waiting",
               what="the batch after the refused one")
    assert metric(s, "samples_failed_total") == 5
    assert metric(s, "samples_retried_total") == 0
    assert not any(n == "fw_bad" for n, _ in accepted_names(script))
    with script.lock:
        assert sum(1 for _, ser in script.requests if any(ls["__name__"] == "fw_bad" for ls, _ in ser)) == 1
    log = s.read_log()
    assert "remote write batch refused" in log and "status=400" in log and "scripted refusal" in log
    assert bad and after


def test_5xx_and_network_errors_are_retried_with_backoff(start_sluice, script):
    state = {"n": 0}

    def decide(headers, series):
        state["n"] += 1
        return (503, {}) if state["n"] <= 3 else (204, {})
    script.decide = decide
    s = start_sluice(*sluice_args(script.url + " name=t", "--remote-write.shards=1"))
    write_batch(s, "r5", now_ms() - 60_000, 2, 3)
    wait_until(lambda: len(accepted_names(script)) >= 2 or "waiting", what="retried batch")
    assert metric(s, "samples_retried_total") == 3 * 6
    assert metric(s, "samples_sent_total") == 6
    assert metric(s, "samples_failed_total") == 0
    # the retries were spaced out (20, 40, 80 ms at least)
    with script.lock:
        assert len(script.requests) == 4


@pytest.mark.parametrize("retry", [False, True])
def test_429_dropped_unless_retry_on_429_which_honours_retry_after(start_sluice, script, retry):
    state = {"n": 0, "times": []}

    def decide(headers, series):
        state["n"] += 1
        state["times"].append(time.time())
        return (429, {"Retry-After": "1"}) if state["n"] == 1 else (204, {})
    script.decide = decide
    spec = script.url + " name=t" + (" retry-on-429=true" if retry else "")
    s = start_sluice(*sluice_args(spec, "--remote-write.shards=1"))
    write_batch(s, "r429", now_ms() - 60_000, 1, 3)
    if retry:
        wait_until(lambda: any(n == "fw_r429" for n, _ in accepted_names(script)) or "waiting", what="retried")
        assert state["times"][1] - state["times"][0] >= 0.9  # Retry-After: 1 (not the 20 ms backoff)
        assert metric(s, "samples_failed_total") == 0 and metric(s, "samples_retried_total") == 3
    else:
        wait_until(lambda: metric(s, "samples_failed_total") == 3 or "waiting", what="the drop")
        assert metric(s, "samples_retried_total") == 0
    write_batch(s, "r429b", now_ms() - 60_000, 1, 3)
    wait_until(lambda: any(n == "fw_r429b" for n, _ in accepted_names(script)) or "waiting", what="next batch")
    if not retry:
        assert not any(n == "fw_r429" for n, _ in accepted_names(script))
    assert "status=429" in s.read_log()


def test_headers_basic_auth_and_bearer_token(start_sluice, script, tmpdir_path):
    pw = os.path.join(tmpdir_path, "pw")
    tok = os.path.join(tmpdir_path, "tok")
    with open(pw, "w") as f:
        f.write("s3cret\n")
    with open(tok, "w") as f:
        f.write("tok-1\n")
    s = start_sluice("--remote-write.url=%s name=a header=X-Scope-OrgID:team-a basic-auth-username=u "
                     "basic-auth-password-file=%s" % (script.url, pw),
                     "--remote-write.url=%s?second name=b bearer-token-file=%s" % (script.url, tok))
    write_batch(s, "auth", now_ms() - 60_000, 1, 1)
    wait_until(lambda: len(script.requests) >= 2 or "waiting", what="both targets")
    with script.lock:
        hs = [h for h, _ in script.requests]
    basic = [h for h in hs if h.get("Authorization", "").startswith("Basic ")]
    bearer = [h for h in hs if h.get("Authorization", "").startswith("Bearer ")]
    assert basic and basic[0]["Authorization"] == "Basic dTpzM2NyZXQ=" and basic[0]["X-Scope-OrgID"] == "team-a"
    assert bearer and bearer[0]["Authorization"] == "Bearer tok-1" and "X-Scope-OrgID" not in bearer[0]
    for h in hs:
        assert h["Content-Encoding"] == "snappy"
        assert h["Content-Type"] == "application/x-protobuf"
        assert h["X-Prometheus-Remote-Write-Version"] == "0.1.0"


def test_bad_remote_write_settings_refuse_to_start(tmpdir_path):
    from conftest import Sluice
    for bad in ("ftp://example.com/api/v1/write", "http://x/api/v1/write nonsense",
                "http://x/api/v1/write colour=blue", "http://x/api/v1/write tls-ca-file=/etc/ssl/ca.crt",
                "https://x/api/v1/write tls-ca-file=/nonexistent/ca.crt"):
        s = Sluice(os.path.join(tmpdir_path, "bad"), ["--remote-write.url=" + bad])
        assert s.proc.wait(timeout=30) != 0
        s.log.close()
        log = s.read_log()
        assert "remote-write" in log or "remote write" in log or "http://" in log, log


def test_wal_max_hold_releases_old_unsent_segments(start_sluice, script, tmpdir_path):
    """A receiver down for longer than --remote-write.wal-max-hold: the snapshot deletes the unsent
    segments anyway (the disk must not fill); after a restart the reader counts and logs the
    skipped segments and forwards what came after."""
    state = {"up": False}
    script.decide = lambda headers, series: (204, {}) if state["up"] else (503, {})
    data = os.path.join(tmpdir_path, "data-hold")
    args = sluice_args(script.url + " name=t", "--storage.snapshot-interval=1s", "--remote-write.wal-max-hold=1s")
    s = start_sluice(*args, data_dir=data)
    write_batch(s, "old", now_ms() - 60_000, 2, 5)
    wait_until(lambda: metric(s, "samples_retried_total") > 0 or "waiting", what="retries")
    time.sleep(3)  # the segment holding fw_old is now older than the hold allows
    assert s.stop() == 0
    assert "older than --remote-write.wal-max-hold are released" in s.read_log()
    state["up"] = True
    s2 = start_sluice(*args, data_dir=data)
    write_batch(s2, "new", now_ms() - 30_000, 2, 5)
    wait_until(lambda: sum(1 for n, _ in accepted_names(script) if n == "fw_new") >= 2 or "waiting",
               what="new samples")
    assert metric(s2, "wal_segments_skipped_total") >= 1
    assert not any(n == "fw_old" for n, _ in accepted_names(script))
    assert "WAL segments skipped" in s2.read_log()
