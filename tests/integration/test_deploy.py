"""Checks of deploy/ that can run here (docs/deploy.md):

  * the systemd unit passes `systemd-analyze verify` without a single warning, and keeps its
    hardening;
  * every query of the Grafana dashboard (deploy/grafana/flink-flow.json) evaluates without error
    and returns data against sluice loaded with Flink-shaped pushes (tests/tools/flink_gen),
    as instant and as range queries; its job variable's label_values query too;
  * the Kubernetes manifests have the StatefulSet/PVC/Service shape and probes, and the config
    they mount is accepted by sluice itself;
  * the Containerfile is multi-stage, runs on Debian slim as a non-root user, and installs the
    package of every shared library the built binary links;
  * Prometheus examples pass `promtool check config`; the Flink 1.x and 2.x snippets say the
    same; the load balancer's routing rule maps pushes and control calls of a job to one key.

Not possible here: building the image (no container daemon) and running nginx (not installed);
docs/deploy.md says so.
"""
import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
import yaml

SRC = os.environ.get("SLUICE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "../.."))
DEPLOY = os.path.join(SRC, "deploy")
SLUICE_BIN = os.environ.get("SLUICE_BIN", os.path.join(SRC, "build/sluice"))
TOOLS = os.environ.get("SLUICE_TOOLS_DIR", os.path.join(SRC, "build/tests/tools"))


def read(*p):
    with open(os.path.join(DEPLOY, *p)) as f:
        return f.read()


# ---- systemd ---------------------------------------------------------------------------------------


def test_systemd_unit_verifies_and_is_hardened(tmpdir_path):
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze missing (Debian package systemd)"
    unit = read("systemd", "sluice.service")
    # verify checks that ExecStart's binary exists: point it at the one under test
    path = os.path.join(tmpdir_path, "sluice.service")
    with open(path, "w") as f:
        f.write(unit.replace("/usr/bin/sluice", os.path.abspath(SLUICE_BIN)))
    r = subprocess.run([analyze, "verify", path], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == "", r.stderr  # unknown keys are only warnings: none allowed
    for line in ("DynamicUser=yes", "ProtectSystem=strict", "ReadWritePaths=/var/lib/sluice", "StateDirectory=sluice",
                 "NoNewPrivileges=yes", "CapabilityBoundingSet=", "ProtectHome=yes", "PrivateTmp=yes",
                 "SystemCallFilter=@system-service"):
        assert re.search("^" + re.escape(line) + "$", unit, re.M), line
    # and the broken twin is caught, so the check can fail
    with open(path, "w") as f:
        f.write(unit.replace("/usr/bin/sluice", "/nonexistent/sluice"))
    assert subprocess.run([analyze, "verify", path], capture_output=True, timeout=120).returncode != 0


# ---- Grafana dashboard ---------------------------------------------------------------------------


def push_flink(sluice, tick):
    out = subprocess.run([os.path.join(TOOLS, "flink_gen"), "3", "7", str(tick)], capture_output=True,
                         check=True).stdout.decode()
    parts = re.split(r"^# flink_gen job=(\S+) tm=\d+\n", out, flags=re.M)
    assert len(parts) >= 7
    # the operations scenario adds the JobManager (checkpoints, restarts) and GC/lag series
    ops = subprocess.run([os.path.join(TOOLS, "flink_gen"), "--ops", "7", str(tick), str(tick)], capture_output=True,
                         check=True).stdout.decode()
    ops_parts = re.split(r"^# flink_gen ops tick=\d+ job=(\S+) instance=\S+\n", ops, flags=re.M)
    assert len(ops_parts) == 11
    bodies = [(p[i], p[i + 1]) for p in (parts, ops_parts) for i in range(1, len(p), 2)]
    for job, body in bodies:
        req = urllib.request.Request(sluice.url + "/metrics/job/" + job, data=body.encode(),
                                     method="PUT", headers={"Content-Type": "text/plain; version=0.0.4"})
        assert urllib.request.urlopen(req, timeout=30).status == 200


def dashboard_exprs():
    d = json.loads(read("grafana", "flink-flow.json"))
    exprs = []
    for p in d["panels"]:
        assert p["datasource"]["uid"] == "${datasource}"
        for t in p["targets"]:
            exprs.append((p["title"], t["expr"]))
    var = [v for v in d["templating"]["list"] if v["name"] == "job_name"][0]
    return d, exprs, var


def substitute(expr):
    return expr.replace("$__rate_interval", "1m").replace("$job_name", ".*")


def api(sluice, path, **params):
    body = urllib.parse.urlencode(params).encode()
    req = urllib.request.Request(sluice.url + path, data=body, method="POST",
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return json.loads(e.read())


def test_grafana_dashboard_queries_evaluate_against_flink_data(sluice):
    for tick in range(4):
        push_flink(sluice, tick)
        time.sleep(1.05)  # pushes are stamped with the whole second: one sample per second
    d, exprs, var = dashboard_exprs()
    assert len(exprs) >= 12
    now = time.time()
    failures = []
    for title, e in exprs:
        q = substitute(e)
        r = api(sluice, "/api/v1/query", query=q, time="%.3f" % now)
        if r.get("status") != "success":
            failures.append((title, q, r))
            continue
        if not r["data"]["result"]:
            failures.append((title, q, "empty result"))
        rr = api(sluice, "/api/v1/query_range", query=q, start="%.3f" % (now - 60), end="%.3f" % now, step="5")
        if rr.get("status") != "success" or not rr["data"]["result"]:
            failures.append((title, q, rr if rr.get("status") != "success" else "empty range result"))
    assert not failures, json.dumps(failures, indent=1)[:4000]
    # the variable: label_values(metric, label) is GET /api/v1/label/<label>/values?match[]=metric
    m = re.match(r"label_values\((\w+), *(\w+)\)", var["query"]["query"])
    assert m
    q = urllib.parse.urlencode({"match[]": m.group(1)})
    with urllib.request.urlopen("%s/api/v1/label/%s/values?%s" % (sluice.url, m.group(2), q), timeout=30) as r:
        vals = json.loads(r.read())["data"]
    assert vals, "no job names"
    # a dashboard query with a typo would be caught: the same check fails on it
    bad = api(sluice, "/api/v1/query", query="sum(rate(flink_taskmanager_job_task_numRecordsIn[1m])", time=now)
    assert bad["status"] == "error"


# ---- Kubernetes ----------------------------------------------------------------------------------


def test_kubernetes_manifests(start_sluice, tmpdir_path):
    docs = [d for d in yaml.safe_load_all(read("kubernetes", "sluice.yaml")) if d]
    kinds = {d["kind"]: d for d in docs}
    assert {"StatefulSet", "Service", "ConfigMap"} <= set(kinds)
    sts = kinds["StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    assert any(m["name"] == "data" and m["mountPath"] == "/var/lib/sluice" for m in c["volumeMounts"])
    assert c["readinessProbe"]["httpGet"]["path"] == "/-/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/-/healthy"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["http"] == 9091
    assert pod["securityContext"]["runAsNonRoot"] is True
    services = [d for d in docs if d["kind"] == "Service"]
    assert any(s["spec"].get("clusterIP") == "None" for s in services)
    assert sts["spec"]["serviceName"] in [s["metadata"]["name"] for s in services]
    for s in services:
        assert s["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    # the config file the ConfigMap mounts is one sluice accepts
    cfg = os.path.join(tmpdir_path, "sluice.yml")
    with open(cfg, "w") as f:
        f.write(kinds["ConfigMap"]["data"]["sluice.yml"])
    s = start_sluice("--config.file=" + cfg, "--remote-write.timeout=1s")
    with urllib.request.urlopen(s.url + "/api/v1/status/flags", timeout=10) as r:
        flags = json.loads(r.read())["data"]
    assert "mimir" in flags["remote-write.url"] and flags["external-label"] == "cluster=prod-eu1"


# ---- Containerfile -------------------------------------------------------------------------------


def test_containerfile_is_multistage_slim_nonroot_and_complete():
    text = read("container", "Containerfile")
    froms = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert len(froms) >= 2, "multi-stage"
    assert re.search(r"debian:[a-z]+-slim$", froms[-1]), froms[-1]
    runtime = text[text.rindex("\nFROM "):]
    user = re.findall(r"^USER\s+(\S+)", runtime, re.M)
    assert user and user[-1].split(":")[0] not in ("0", "root")
    m = re.search(r"apt-get install[^\n]*\\\n(.*?)&&", runtime, re.S)
    listed = set(re.findall(r"[a-z0-9][a-z0-9.+-]+", m.group(1).replace("\\", " "))) - {"rm", "rf"}
    # every library the binary links comes from a listed package or one of their dependencies
    libs = subprocess.run(["ldd", SLUICE_BIN], capture_output=True, text=True, check=True).stdout
    needed = set()
    for path in re.findall(r"=> (/\S+)", libs):
        real = os.path.realpath(path)
        for cand in (real, re.sub(r"^/usr", "", real), "/usr" + real if not real.startswith("/usr") else real):
            r = subprocess.run(["dpkg", "-S", cand], capture_output=True, text=True)
            if r.returncode == 0:
                needed.add(r.stdout.split(":")[0])
                break
    base = {"libc6", "libgcc-s1", "libasan8", "libubsan1", "libtsan2"}  # slim base / sanitizer builds
    deps = set()
    for p in listed:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Depends}", p], capture_output=True, text=True)
        deps |= set(re.findall(r"([a-z0-9][a-z0-9.+-]+)", r.stdout))
    missing = needed - base - listed - deps
    assert needed and not missing, missing


# ---- Prometheus, Flink, load balancer ------------------------------------------------------------


def test_prometheus_examples_pass_promtool(tmpdir_path):
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    cfg = {"global": {"scrape_interval": "15s"}}
    cfg.update(yaml.safe_load(read("prometheus", "remote_write.yml")))
    cfg.update(yaml.safe_load(read("prometheus", "remote_read.yml")))
    assert cfg["remote_write"][0]["url"].endswith("/api/v1/write")
    assert cfg["remote_read"][0]["url"].endswith("/api/v1/read")
    path = os.path.join(tmpdir_path, "prometheus.yml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    r = subprocess.run([promtool, "check", "config", path], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, prefix + k + "."))
        else:
            out[prefix + k] = v
    return out


def test_flink_snippets_agree():
    v1 = yaml.safe_load(read("flink", "flink-conf.yaml"))
    v2 = flatten(yaml.safe_load(read("flink", "config.yaml")))
    assert v1 == v2
    assert v1["metrics.reporter.promgateway.factory.class"].endswith("PrometheusPushGatewayReporterFactory")
    assert v1["metrics.reporter.promgateway.hostUrl"].startswith("http://")


def test_load_balancer_routing_rule():
    conf = read("loadbalancer", "nginx-sharding.conf")
    rules = re.findall(r'"~(\^[^"]+)"\s+\$j;', conf)
    assert len(rules) == 2
    # nginx uses PCRE; these patterns mean the same in Python's re
    pats = [re.compile(r.replace("(?<j>", "(?P<j>")) for r in rules]

    def key(uri):
        for p in pats:
            m = p.match(uri)
            if m:
                return m.group("j")
        return None
    suffix = "5a0052b913b21d24fcd9eaecc2acbbfd"
    assert key("/metrics/job/order_enrichment" + suffix) == "order_enrichment"
    assert key("/metrics/job/order_enrichment" + suffix + "/instance/tm1") == "order_enrichment"
    assert key("/metrics/job/abcdef" + suffix) == "abcdef"  # hex-looking names keep their end
    assert key("/metrics/job/order_enrichment") == "order_enrichment"
    assert key("/api/v1/control/jobs/order_enrichment/pause") == "order_enrichment"
    assert key("/api/v1/query") is None
    assert "hash $sluice_job consistent" in conf
