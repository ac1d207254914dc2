#!/usr/bin/python3
"""Remote-write ingest, side by side: sluice vs Debian's victoria-metrics (/api/v1/write) vs
Debian's prometheus 2.42 (--web.enable-remote-write-receiver), the same pre-built requests
(bench/remote_write_bench.c) against each, a fresh server and data directory per run, median of
--runs runs.

Per run: the sender builds every body first, then the server's CPU time (utime + stime of all its
threads, /proc/<pid>/stat) is read, the senders go, and after the last 2xx a settle second (the
others flush asynchronously) the CPU time is read again.
  samples/s          = samples sent / wall seconds of the sending
  samples/CPU-second = samples sent / server CPU seconds ("per core": independent of how many
                       cores the server could use)

Usage: bench/remote_write_bench.py [--sluice BUILD/sluice] [--senders 2] [--series 2500]
       [--samples 100] [--requests 8] [--runs 3] [--markdown FILE]
"""
import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)


def wait_ready(url, proc, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("server exited with %d" % proc.returncode)
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("not ready: " + url)


def start_server(kind, args, d, port):
    log = open(os.path.join(d, "server.log"), "wb")
    if kind == "sluice":
        cmd = [args.sluice, "--web.listen-address=127.0.0.1:%d" % port, "--storage.path=" + d + "/data",
               "--log.level=warn"]
        ready, path = "/-/ready", "/api/v1/write"
    elif kind == "victoria-metrics":
        cmd = [shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics", "-httpListenAddr=127.0.0.1:%d" % port,
               "-storageDataPath=" + d + "/data", "-retentionPeriod=1y", "-loggerLevel=ERROR"]
        ready, path = "/health", "/api/v1/write"
    else:
        cfg = os.path.join(d, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write("global: {scrape_interval: 1h}\nscrape_configs: []\n")
        cmd = [shutil.which("prometheus") or "/usr/bin/prometheus", "--config.file=" + cfg,
               "--storage.tsdb.path=" + d + "/data", "--web.listen-address=127.0.0.1:%d" % port,
               "--web.enable-remote-write-receiver", "--log.level=warn"]
        ready, path = "/-/ready", "/api/v1/write"
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    wait_ready("http://127.0.0.1:%d%s" % (port, ready), proc)
    return proc, path


def one_run(kind, args, sender_bin):
    d = tempfile.mkdtemp(prefix="rwbench-")
    port = free_port()
    proc, path = start_server(kind, args, d, port)
    try:
        t0 = (int(time.time()) - 100 * 60) * 1000
        snd = subprocess.Popen([sender_bin, "127.0.0.1", str(port), path, str(args.senders), str(args.series),
                                str(args.samples), str(args.requests), str(t0)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert snd.stdout.readline().strip() == "ready"
        c0 = cpu_seconds(proc.pid)
        snd.stdin.write("go\n")
        snd.stdin.flush()
        out = snd.stdout.read().strip()
        snd.wait()
        time.sleep(1.0)
        c1 = cpu_seconds(proc.pid)
        kv = dict(item.split("=") for item in out.split())
        if int(kv["errors"]):
            raise RuntimeError("%s: %s non-2xx answers" % (kind, kv["errors"]))
        sent, wall = int(kv["sent"]), float(kv["wall_s"])
        return sent / wall, sent / max(c1 - c0, 1e-9), c1 - c0, wall
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default=os.path.join(ROOT, "build", "sluice"))
    ap.add_argument("--senders", type=int, default=2)
    ap.add_argument("--series", type=int, default=2500, help="series per sender")
    ap.add_argument("--samples", type=int, default=100, help="samples per series per request")
    ap.add_argument("--requests", type=int, default=8, help="requests per sender")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench"))
    ap.add_argument("--markdown")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sender_bin = os.path.join(args.out, "remote_write_bench")
    subprocess.run(["cc", "-std=c11", "-O2", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-o", sender_bin,
                    os.path.join(ROOT, "bench", "remote_write_bench.c"), "-lsnappy", "-lpthread"], check=True)

    per_req = args.series * args.samples * args.senders
    print("remote write ingest: %d senders x %d requests, each %d series x %d samples (%d samples per round), "
          "%d runs, median" % (args.senders, args.requests, args.series, args.samples, per_req, args.runs))
    rows = []
    for kind in ("sluice", "victoria-metrics", "prometheus"):
        runs = [one_run(kind, args, sender_bin) for _ in range(args.runs)]
        rate = statistics.median(r[0] for r in runs)
        per_core = statistics.median(r[1] for r in runs)
        cpu = statistics.median(r[2] for r in runs)
        wall = statistics.median(r[3] for r in runs)
        rows.append((kind, rate, per_core, cpu, wall))
        print("  %-17s %12.0f samples/s %12.0f samples/CPU-s  (cpu %.2fs, wall %.2fs)" % (kind, rate, per_core, cpu, wall),
              file=sys.stderr)
    vm = rows[1]
    lines = ["| server | samples/s (wall) | samples per CPU-second | server CPU s | wall s | per-core vs VictoriaMetrics |",
             "|---|---:|---:|---:|---:|---:|"]
    for kind, rate, per_core, cpu, wall in rows:
        lines.append("| %s | %.0f | %.0f | %.2f | %.2f | %.2fx |" % (kind, rate, per_core, cpu, wall, per_core / vm[2]))
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
