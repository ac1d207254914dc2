"""TLS, mTLS and basic auth, against real peers, with a test PKI the test makes (openssl CLI):

  * a real Prometheus 2.42 remote-writes to and remote-reads from sluice over TLS with a client
    certificate and basic auth (sluice --web.config.file: RequireAndVerifyClientCert + bcrypt
    users); the data comes back both ways;
  * mTLS: a client without a certificate, or with one from another CA, is refused; with one, served;
  * basic auth: 401 + WWW-Authenticate: Basic without or with wrong credentials, 200 with, on a
    push, a query, the dashboard and flow control; bcrypt hashes made by python3-bcrypt ($2b$,
    $2a$) and in htpasswd's $2y$ spelling; SIGHUP reloads the users, a broken file is refused;
  * plain HTTP (and garbage) to the TLS port fails cleanly and sluice keeps serving;
  * sluice forwards (remote-write sender) over TLS with a client certificate and basic auth to a
    real Prometheus receiver started with --web.config.file (the same file format, and the same
    bcrypt hash, accepted by both); targets with an untrusted CA, a wrong server name or no client
    certificate are refused with a clear log line, and nothing of theirs arrives.

Nothing is skipped: a missing prometheus binary or python3-bcrypt is a failure
(deploy/install-deps.sh installs them).
"""
# ctest-labels: peer
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse

import bcrypt
import pytest
import requests

from conftest import Sluice, free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def wait_until(fn, timeout=90, what="condition"):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = fn()
        except requests.RequestException as e:
            last = repr(e)
        if last is True:
            return
        time.sleep(0.2)
    raise AssertionError("timed out waiting for %s (last: %r)" % (what, last))


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_cert(d, name, ca, cn, sans, usage):
    """<name>.key/.crt signed by <ca>.crt/.key with the given SANs and extended key usage."""
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", name + ".key",
            "-out", name + ".csr", "-subj", "/CN=" + cn, cwd=d)
    with open(os.path.join(d, name + ".ext"), "w") as f:
        if sans:
            f.write("subjectAltName=" + ",".join(sans) + "\n")
        f.write("extendedKeyUsage=" + usage + "\n")
    openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt", "-CAkey", ca + ".key", "-CAcreateserial",
            "-out", name + ".crt", "-days", "2", "-extfile", name + ".ext", cwd=d)


@pytest.fixture(scope="module")
def pki():
    d = tempfile.mkdtemp(prefix="sluice-tls-")
    for ca in ("ca", "evil-ca"):
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
                ca + ".key", "-out", ca + ".crt", "-days", "2", "-subj", "/CN=sluice test " + ca, cwd=d)
    make_cert(d, "server", "ca", "localhost", ["DNS:localhost", "IP:127.0.0.1"], "serverAuth")
    make_cert(d, "client", "ca", "sluice-test-client", [], "clientAuth")
    make_cert(d, "evil-client", "evil-ca", "someone", [], "clientAuth")
    yield {n: os.path.join(d, n) for n in
           ("ca.crt", "evil-ca.crt", "server.crt", "server.key", "client.crt", "client.key", "evil-client.crt",
            "evil-client.key")} | {"dir": d}
    shutil.rmtree(d, ignore_errors=True)


def bcrypt_hash(pw, prefix=b"2b"):
    return bcrypt.hashpw(pw.encode(), bcrypt.gensalt(rounds=10, prefix=prefix)).decode()


def write_web_config(path, tls=None, users=None):
    lines = []
    if tls:
        lines.append("tls_server_config:")
        lines += ["  %s: %s" % kv for kv in tls.items()]
    if users:
        lines.append("basic_auth_users:")
        lines += ["  %s: '%s'" % kv for kv in users.items()]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


class TlsSluice(Sluice):
    """A sluice whose URL is https://localhost:<port>; requests go with the given cert and auth."""

    def __init__(self, data_dir, args, ca, cert=None, auth=None):
        super().__init__(data_dir, args)
        self.url = "https://localhost:%d" % self.port
        self.ca, self.cert, self.auth = ca, cert, auth

    def get(self, path, **kw):
        kw.setdefault("verify", self.ca)
        kw.setdefault("cert", self.cert)
        kw.setdefault("auth", self.auth)
        kw.setdefault("timeout", 10)
        return requests.get(self.url + path, **kw)

    def wait_ready(self, timeout=60):
        def ready():
            assert self.proc.poll() is None, "sluice exited: " + self.read_log()
            return self.get("/-/ready", timeout=1).status_code == 200

        wait_until(ready, timeout, "sluice ready over TLS")
        return self


@pytest.fixture
def stop_list():
    procs = []
    yield procs
    for p in reversed(procs):
        if isinstance(p, Sluice):
            rc = p.stop()
            assert rc == 0, "sluice exited with %s:\n%s" % (rc, p.read_log())
        elif p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def start_prometheus(d, config, stop_list, web_config=None):
    port = free_port()
    with open(os.path.join(d, "prometheus.yml"), "w") as f:
        f.write(config.replace("PROMPORT", str(port)))
    args = [PROMETHEUS, "--config.file=" + os.path.join(d, "prometheus.yml"),
            "--storage.tsdb.path=" + os.path.join(d, "tsdb"), "--web.listen-address=127.0.0.1:%d" % port,
            "--web.enable-remote-write-receiver"]
    if web_config:
        args.append("--web.config.file=" + web_config)
    log = open(os.path.join(d, "prometheus.log"), "wb")
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    stop_list.append(p)
    return p, port


def prom_log(d):
    with open(os.path.join(d, "prometheus.log"), errors="replace") as f:
        return f.read()


def query_value(get, q):
    """The single value of an instant query through a GET callable, or a description."""
    r = get("/api/v1/query?query=" + urllib.parse.quote(q))
    if r.status_code != 200:
        return "status %d: %s" % (r.status_code, r.text[:200])
    j = r.json()
    return j["data"]["result"] if j["data"]["result"] or not j.get("warnings") else j["warnings"]


# ---- Prometheus <-> sluice over TLS, mTLS, basic auth; plain HTTP to the TLS port ----------------


def test_prometheus_writes_and_reads_over_mtls_with_basic_auth(pki, tmp_path, stop_list):
    web = str(tmp_path / "web.yml")
    users = {"alice": bcrypt_hash("alice-pw"), "carol": bcrypt_hash("carol-pw", b"2a")}
    users["bob"] = "$2y$" + bcrypt_hash("bob-pw")[4:]  # htpasswd -B writes $2y$: the same algorithm
    write_web_config(web, tls={"cert_file": pki["server.crt"], "key_file": pki["server.key"],
                               "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": pki["ca.crt"]},
                     users=users)
    # Groups never expire here: on a loaded machine the bcrypt checks below can outlast the
    # 10 push intervals (of at least 1 s) after which the probe's group would go stale.
    sl = TlsSluice(str(tmp_path / "data"), ["--web.config.file=" + web, "--push.group-missed-intervals=0"],
                   pki["ca.crt"], cert=(pki["client.crt"], pki["client.key"]), auth=("alice", "alice-pw"))
    stop_list.append(sl)
    sl.wait_ready()
    assert "tls=true" in sl.read_log()

    # --- mTLS: no certificate / a certificate from another CA are refused during the handshake
    for cert in (None, (pki["evil-client.crt"], pki["evil-client.key"])):
        with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
            sl.get("/-/ready", cert=cert)
    # an untrusted server (the client checks sluice's certificate against another CA)
    with pytest.raises(requests.exceptions.SSLError):
        sl.get("/-/ready", verify=pki["evil-ca.crt"])

    # --- basic auth, on every kind of endpoint: push, query, dashboard, flow control, metrics
    push = "/metrics/job/tlsjob/instance/i1"
    body = "tls_rr_probe{kind=\"pushed\"} 42\n"
    endpoints = [("PUT", push, body), ("GET", "/api/v1/query?query=1", None), ("GET", "/", None),
                 ("GET", "/api/v1/control/jobs", None), ("GET", "/metrics", None), ("GET", "/-/healthy", None)]
    for method, path, data in endpoints:
        for auth in (None, ("alice", "wrong"), ("mallory", "alice-pw"), ("alice", "")):
            r = requests.request(method, sl.url + path, data=data, auth=auth, verify=sl.ca, cert=sl.cert, timeout=10)
            assert r.status_code == 401, (method, path, auth, r.status_code)
            assert r.headers.get("WWW-Authenticate") == "Basic", r.headers
        for auth in (("alice", "alice-pw"), ("bob", "bob-pw"), ("carol", "carol-pw")):
            r = requests.request(method, sl.url + path, data=data, auth=auth, verify=sl.ca, cert=sl.cert, timeout=10)
            assert r.status_code in (200, 202), (method, path, auth, r.status_code, r.text[:200])
    # the refused push changed nothing: only the accepted ones are there
    assert [s["value"][1] for s in query_value(sl.get, "tls_rr_probe")] == ["42"]
    m = sl.get("/metrics").text
    assert re.search(r"^sluice_http_unauthorized_total (\d+)$", m, re.M).group(1) == str(4 * len(endpoints))

    # --- plain HTTP and garbage to the TLS port: refused cleanly, sluice keeps serving
    for payload in (b"GET /-/ready HTTP/1.1\r\nHost: localhost\r\n\r\n", b"\x16\x03\x01\xff\xff" + b"x" * 64):
        with socket.create_connection(("127.0.0.1", sl.port), timeout=10) as s:
            s.sendall(payload)
            got = b""
            try:
                while True:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    got += chunk
            except ConnectionResetError:
                pass
            assert b"200 OK" not in got and b"Ready" not in got, got
    # a client that starts a handshake and goes away
    with socket.create_connection(("127.0.0.1", sl.port), timeout=10) as raw:
        raw.sendall(b"\x16\x03\x01\x00")
    assert sl.get("/-/ready").status_code == 200

    # --- a real Prometheus: scrapes itself, remote-writes to sluice, remote-reads from it, all over
    # TLS with the client certificate and basic auth
    pd = tmp_path / "prom"
    pd.mkdir()
    pwfile = str(tmp_path / "pw")
    with open(pwfile, "w") as f:
        f.write("bob-pw")
    tls_block = ("    tls_config:\n      ca_file: %s\n      cert_file: %s\n      key_file: %s\n"
                 "    basic_auth:\n      username: bob\n      password_file: %s\n"
                 % (pki["ca.crt"], pki["client.crt"], pki["client.key"], pwfile))
    config = ("global:\n  scrape_interval: 1s\n"
              "scrape_configs:\n  - job_name: prom\n    static_configs:\n      - targets: ['127.0.0.1:PROMPORT']\n"
              "remote_write:\n  - url: https://localhost:%d/api/v1/write\n%s"
              "    queue_config:\n      batch_send_deadline: 1s\n"
              "remote_read:\n  - url: https://localhost:%d/api/v1/read\n    read_recent: true\n%s"
              % (sl.port, tls_block, sl.port, tls_block))
    prom, pport = start_prometheus(str(pd), config, stop_list)
    purl = "http://127.0.0.1:%d" % pport

    def pget(path):
        return requests.get(purl + path, timeout=10)

    # remote write: Prometheus' own build info arrives in sluice
    def written():
        assert prom.poll() is None, prom_log(str(pd))
        res = query_value(sl.get, 'prometheus_build_info{job="prom"}')
        return (isinstance(res, list) and len(res) == 1 and res[0]["metric"]["version"].startswith("2.42")) or res

    wait_until(written, 120, "Prometheus' samples in sluice (remote write over mTLS)")
    # remote read: a probe pushed now exists only in sluice; Prometheus answers it through remote read
    r = requests.put(sl.url + "/metrics/job/rrjob", data="tls_rr_probe2 43\n", verify=sl.ca, cert=sl.cert,
                     auth=sl.auth, timeout=10)
    assert r.status_code == 200, r.text

    def read_back():
        res = query_value(pget, 'tls_rr_probe2{job="rrjob"}')
        return (isinstance(res, list) and [s["value"][1] for s in res] == ["43"]) or res

    wait_until(read_back, 60, "sluice's data through Prometheus' remote read over mTLS")
    m = sl.get("/metrics").text
    assert re.search(r'^sluice_http_requests_total\{code="200",handler="remote_read"\} [1-9]', m, re.M), m
    assert "TLS handshake" not in prom_log(str(pd))


def test_web_config_reload_and_errors(pki, tmp_path, stop_list):
    web = str(tmp_path / "web.yml")
    tls = {"cert_file": "server.crt", "key_file": "server.key"}  # relative to the file's folder
    for n in ("server.crt", "server.key"):
        shutil.copy(pki[n], str(tmp_path / n))
    write_web_config(web, tls=tls, users={"alice": bcrypt_hash("one")})
    sl = TlsSluice(str(tmp_path / "data"), ["--web.config.file=" + web], pki["ca.crt"], auth=("alice", "one"))
    stop_list.append(sl)
    sl.wait_ready()
    # no client certificate needed (NoClientCert); the password works, another does not
    assert sl.get("/api/v1/query?query=1").status_code == 200
    assert sl.get("/api/v1/query?query=1", auth=("alice", "two")).status_code == 401

    # SIGHUP: new users take effect
    write_web_config(web, tls=tls, users={"alice": bcrypt_hash("two"), "dave": bcrypt_hash("three")})
    sl.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: sl.get("/-/ready", auth=("alice", "two")).status_code == 200, 30, "new password")
    assert sl.get("/-/ready", auth=("alice", "one")).status_code == 401
    assert sl.get("/-/ready", auth=("dave", "three")).status_code == 200
    # a broken file (and turning TLS off) is refused at reload: the running config stays
    for text in ("basic_auth_users:\n  alice: not-a-hash\n", "tls_server_config:\n  cipher_suites: [x]\n",
                 "basic_auth_users:\n  alice: '%s'\n" % bcrypt_hash("four")):
        with open(web, "w") as f:
            f.write(text)
        before = sl.read_log().count("web config reload failed")
        sl.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: sl.read_log().count("web config reload failed") == before + 1, 30, "reload refused")
        assert sl.get("/-/ready", auth=("alice", "two")).status_code == 200
    log = sl.read_log()
    assert "is not a bcrypt hash" in log and "cipher_suites is not supported" in log, log
    assert "turning TLS off needs a restart" in log, log

    # startup errors name the problem, and sluice does not start
    bad = str(tmp_path / "bad.yml")
    cases = [
        ("tls_server_config:\n  cert_file: %s\n" % pki["server.crt"], "missing key_file"),
        ("tls_server_config:\n  cert_file: %s\n  key_file: %s\n" % (pki["server.crt"], pki["client.key"]),
         "does not match"),
        ("tls_server_config:\n  cert_file: %s\n  key_file: %s\n  client_auth_type: RequireAndVerifyClientCert\n"
         % (pki["server.crt"], pki["server.key"]), "needs client_ca_file"),
        ("tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: x\n", "cannot load server certificate"),
        ("basic_auth_users:\n  alice: '$2b$10$short'\n", "not a bcrypt hash"),
        ("bogus: 1\n", "unknown or repeated key bogus"),
    ]
    for text, msg in cases:
        with open(bad, "w") as f:
            f.write(text)
        p = subprocess.run([sl.args[0], "--web.listen-address=127.0.0.1:0", "--storage.path=" + str(tmp_path / "x"),
                            "--web.config.file=" + bad], capture_output=True, timeout=60)
        assert p.returncode != 0 and msg in p.stdout.decode() + p.stderr.decode(), (text, p.stdout, p.stderr)


# ---- sluice's remote-write sender over TLS to a Prometheus receiver with --web.config.file --------


def test_forward_to_prometheus_over_mtls(pki, tmp_path, stop_list):
    pd = tmp_path / "prom"
    pd.mkdir()
    hashed = bcrypt_hash("fwd-pw")
    pweb = str(pd / "web.yml")
    write_web_config(pweb, tls={"cert_file": pki["server.crt"], "key_file": pki["server.key"],
                                "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": pki["ca.crt"]},
                     users={"fwd": hashed})
    prom, pport = start_prometheus(str(pd), "global:\n  scrape_interval: 1h\n", stop_list, web_config=pweb)
    purl = "https://localhost:%d" % pport
    cert = (pki["client.crt"], pki["client.key"])

    def pget(path):
        return requests.get(purl + path, verify=pki["ca.crt"], cert=cert, auth=("fwd", "fwd-pw"), timeout=10)

    def prom_ready():
        assert prom.poll() is None, prom_log(str(pd))
        return pget("/-/ready").status_code == 200

    wait_until(prom_ready, 120, "Prometheus ready over TLS")

    # sluice accepts the same web config format (and the same hash) Prometheus does
    sweb = str(tmp_path / "sluice-web.yml")
    shutil.copy(pweb, sweb)
    pwfile = str(tmp_path / "pw")
    with open(pwfile, "w") as f:
        f.write("fwd-pw\n")
    base = "https://localhost:%d/api/v1/write" % pport
    auth = " basic-auth-username=fwd basic-auth-password-file=" + pwfile
    args = ["--web.config.file=" + sweb, "--remote-write.tls-ca-file=" + pki["ca.crt"],
            "--remote-write.tls-cert-file=" + pki["client.crt"], "--remote-write.tls-key-file=" + pki["client.key"],
            "--remote-write.min-backoff=50ms", "--remote-write.max-backoff=500ms",
            "--remote-write.url=" + base + " name=good" + auth,
            "--remote-write.url=" + base + "?untrusted name=untrusted tls-ca-file=" + pki["evil-ca.crt"] + auth,
            "--remote-write.url=" + base + "?wronghost name=wronghost tls-server-name=elsewhere.example" + auth,
            "--remote-write.url=" + base + "?nocert name=nocert tls-cert-file= tls-key-file=" + auth,
            "--remote-write.url=https://127.0.0.1:%d/api/v1/write?ip name=byip%s" % (pport, auth)]
    sl = TlsSluice(str(tmp_path / "data"), args, pki["ca.crt"], cert=cert, auth=("fwd", "fwd-pw"))
    stop_list.append(sl)
    sl.wait_ready()
    r = requests.put(sl.url + "/metrics/job/fwdjob", data="tls_fw_probe 7\n", verify=pki["ca.crt"], cert=cert,
                     auth=("fwd", "fwd-pw"), timeout=10)
    assert r.status_code == 200, r.text

    def arrived():
        res = query_value(pget, 'tls_fw_probe{job="fwdjob"}')
        return (isinstance(res, list) and [s["value"][1] for s in res] == ["7"]) or res

    wait_until(arrived, 90, "forwarded sample in Prometheus (remote write over mTLS + basic auth)")

    def sent(name):
        m = re.search(r'^sluice_remote_storage_samples_sent_total\{remote_name="%s"[^}]*\} (\S+)$' % name,
                      sl.get("/metrics").text, re.M)
        return float(m.group(1)) if m else 0.0

    # the URL by IP address is verified against the certificate's IP SAN
    wait_until(lambda: sent("byip") >= 1 or sent("byip"), 60, "byip target sent")
    expected = {
        "untrusted": "TLS handshake failed: certificate verify failed (unable to get local issuer certificate)",
        "wronghost": "TLS handshake failed: certificate verify failed (hostname mismatch)",
        "nocert": "(the server asked for a client certificate and none is configured)",
    }

    def refused_logged():
        log = sl.read_log()
        missing = [n for n, msg in expected.items()
                   if not re.search(r'msg="remote write failed; retrying" remote_name=%s url=\S+ err="[^"]*%s'
                                    % (n, re.escape(msg)), log)]
        return not missing or missing

    wait_until(refused_logged, 60, "clear log lines for the refused targets")
    for name in expected:
        assert sent(name) == 0, name
    assert sent("good") >= 1
    assert sl.proc.poll() is None
