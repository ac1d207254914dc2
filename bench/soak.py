#!/usr/bin/python3
"""bench/soak.py — long-running mixed load against a real sluice; fails on errors or RSS growth.

    bench/soak.py --sluice build/sluice --tools build/tests/tools [--duration 30m] [--tms 200]
                  [--polls 1000] [--warmup 3m] [--scrape-interval S] [--quiet-every 10m] [--out DIR]

Starts its own sluice (data in a temporary directory unless --data) and runs, in one asyncio
loop with a small hand-written HTTP/1.1 client (keep-alive, one connection per simulated client):

  push         --tms TaskManagers (flink_gen bodies, new values every tick), each PUTting its
               body every 10 s to /metrics/job/<its job>, spread evenly over the interval
  remote_write a Prometheus-style sender: --rw-series series sampled every 15 s, shipped in
               batches of 500 samples (Prometheus' max_samples_per_send) to /api/v1/write
  query_range  a Grafana-style dashboard of 6 panels refreshed every 10 s
               (POST /api/v1/query_range, last 30 min, step 15 s)
  long_poll    --polls parked control long-polls GET /api/v1/control/jobs/J?version=N&wait=60s,
               re-issued as soon as answered (200 on a change, 304 on timeout)
  control      a pause/resume of one of the polled jobs every 5 s (wakes its pollers)
  scrape       with --scrape-interval S: a Prometheus that still scrapes GET /metrics (every
               pushed group, ~130 MB for 200 TaskManagers) every S seconds, as during a migration
               (curl in its own process, as a Prometheus would be)

Every 5 s it samples the daemon's RSS (/proc/<pid>/status) and sluice_storage_head_memory_bytes
(from /-/metrics: sluice's own metrics without the pushed groups). Output: a summary table
(requests, errors, p50/p99/max per endpoint; RSS at start, after warm-up and at the end) on
stdout, and DIR/soak.json with every sample.

Verdict (exit 1 on failure):
  - any error: a non-2xx/304 status, a PromQL error, a connection error or a timeout;
  - RSS growth after warm-up: the daemon's RSS is expected to grow by what it stores (raw samples
    stay in memory for --retention.raw), so the check is on RSS minus the head's own accounted
    memory, measured while the dashboard pauses for 30 s at the end of warm-up and again at the
    end of the run (the transient memory of a range query over 100k series is not growth; the
    dashboard's window also widens through the run): the second figure may exceed the first by at
    most 5 % + 16 MiB. The range under full load and raw RSS figures are reported too.
"""
import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integration"))
import promproto as pp  # noqa: E402


def parse_dur(s):
    units = {"s": 1, "m": 60, "h": 3600}
    return float(s[:-1]) * units[s[-1]] if s[-1] in units else float(s)


class Stats:
    def __init__(self):
        self.lat = {}
        self.ends = {}  # ep -> end time of each latency in lat, for the figures after warm-up
        self.errors = {}
        self.error_samples = []
        self.slow = []  # (end time, endpoint, seconds) of requests over a second, to line up stalls

    def ok(self, ep, dt):
        self.lat.setdefault(ep, []).append(dt)
        self.ends.setdefault(ep, []).append(time.time())
        if dt > 1 and ep != "long_poll_cycle":
            self.slow.append((round(time.time(), 2), ep, round(dt, 3)))

    def err(self, ep, what):
        self.errors[ep] = self.errors.get(ep, 0) + 1
        if len(self.error_samples) < 20:
            self.error_samples.append((ep, time.time(), str(what)[:300]))


class Conn:
    """A keep-alive HTTP/1.1 connection (reconnects when the server closed it)."""

    def __init__(self, host, port):
        self.host, self.port = host, port
        self.r = self.w = None

    async def request(self, method, path, body=b"", headers=None, timeout=30):
        return await asyncio.wait_for(self._request(method, path, body, headers or {}), timeout)

    async def _request(self, method, path, body, headers):
        for attempt in (0, 1):
            if self.w is None:
                self.r, self.w = await asyncio.open_connection(self.host, self.port, limit=1 << 22)
                fresh = True
            else:
                fresh = False
            head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Length: {len(body)}\r\n"
            head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
            try:
                self.w.write(head.encode() + body)
                await self.w.drain()
                line = await self.r.readline()
                if not line:
                    raise ConnectionResetError("closed")
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                if fresh or attempt:
                    raise
                continue  # the server closed an idle keep-alive connection: retry once
            status = int(line.split()[1])
            clen, chunked, close = 0, False, False
            while True:
                h = await self.r.readline()
                if h in (b"\r\n", b""):
                    break
                k, _, v = h.decode("latin-1").partition(":")
                k, v = k.strip().lower(), v.strip()
                if k == "content-length":
                    clen = int(v)
                elif k == "transfer-encoding" and "chunked" in v.lower():
                    chunked = True
                elif k == "connection" and v.lower() == "close":
                    close = True
            if chunked:
                # a list, not data += chunk: 100 MB in 64 KiB chunks would copy quadratically and
                # stall this loop (and every latency it measures) for seconds
                parts = []
                while True:
                    n = int((await self.r.readline()).split(b";")[0], 16)
                    if n == 0:
                        await self.r.readline()
                        break
                    parts.append(await self.r.readexactly(n))
                    await self.r.readline()
                data = b"".join(parts)
            else:
                data = await self.r.readexactly(clen) if clen else b""
            if close:
                self.close()
            return status, data
        raise ConnectionError("unreachable")

    def close(self):
        if self.w:
            self.w.close()
        self.r = self.w = None


class Soak:
    def __init__(self, a, port, pid):
        self.a = a
        self.port = port
        self.pid = pid
        self.stats = Stats()
        self.t0 = time.time()
        self.end = self.t0 + a.duration
        self.samples = []  # (elapsed_s, rss_kb, head_bytes, heap_in_use_bytes)
        self.bodies = {}  # tm -> (job, body bytes)
        self.poll_jobs = [f"soak-job-{i}" for i in range(50)]
        self.poll_cycles = 0
        self.heap = {}  # sluice_heap_* figures, latest
        self.quiet_windows = quiet_windows(a.warmup, a.duration, a.quiet_every)

    def running(self):
        return time.time() < self.end

    async def gen_bodies(self, tick):
        p = await asyncio.create_subprocess_exec(os.path.join(self.a.tools, "flink_gen"), str(self.a.tms), "7",
                                                 str(tick), stdout=asyncio.subprocess.PIPE)
        out, _ = await p.communicate()
        bodies = {}
        for i, part in enumerate(out.split(b"# flink_gen ")[1:]):
            hdr, _, body = part.partition(b"\n")
            job = hdr.split(b"job=")[1].split()[0].decode()
            bodies[i] = (job, body)
        self.bodies = bodies

    async def body_refresher(self):
        tick = 0
        while self.running():
            await asyncio.sleep(10)
            tick += 1
            await self.gen_bodies(tick)

    async def pusher(self, tm):
        c = Conn("127.0.0.1", self.port)
        await asyncio.sleep(10 * tm / self.a.tms)
        nxt = time.time()
        while self.running():
            job, body = self.bodies[tm]
            t = time.time()
            try:
                st, data = await c.request("PUT", f"/metrics/job/{job}", body, {"Content-Type": "text/plain; version=0.0.4"})
                (self.stats.ok if st == 200 else self.stats.err)("push", time.time() - t if st == 200 else (st, data))
            except Exception as e:  # noqa: BLE001 — every failure is an error of the soak
                self.stats.err("push", repr(e))
                c.close()
            nxt += 10
            await asyncio.sleep(max(0, nxt - time.time()))

    async def remote_writer(self):
        c = Conn("127.0.0.1", self.port)
        n = self.a.rw_series
        names = [[("__name__", f"node_metric_{i % 50}"), ("instance", f"node-{i // 50}:9100"), ("job", "node")]
                 for i in range(n)]
        rng = random.Random(1)
        nxt = time.time()
        k = 0
        while self.running():
            ts = int(time.time() * 1000)
            k += 1
            for b in range(0, n, 500):
                series = [(names[i], [(ts, float(k * (i % 7)) + rng.random())]) for i in range(b, min(n, b + 500))]
                body = pp.snappy.compress(pp.write_request(series))
                t = time.time()
                try:
                    st, data = await c.request("POST", "/api/v1/write", body, pp.WRITE_HEADERS)
                    if st in (200, 204):
                        self.stats.ok("remote_write", time.time() - t)
                    else:
                        self.stats.err("remote_write", (st, data))
                except Exception as e:  # noqa: BLE001
                    self.stats.err("remote_write", repr(e))
                    c.close()
            nxt += 15
            await asyncio.sleep(max(0, nxt - time.time()))

    PANELS = [
        'sum by (job) (rate(flink_taskmanager_job_task_operator_numRecordsIn[1m]))',
        'topk(10, max by (tm_id) (flink_taskmanager_Status_JVM_CPU_Load))',
        'avg(flink_taskmanager_job_task_busyTimeMsPerSecond) by (job)',
        'histogram_quantile(0.99, sum by (le) (rate(flink_taskmanager_job_task_operator_processingLatencyMs[1m])))',
        'sum(rate(node_metric_1[1m])) by (instance)',
        'count(up) or vector(0)',
    ]

    def quiet(self, t=None):
        """Inside a quiet window (end of warm-up, end of run, --quiet-every): no dashboard query."""
        e = (t or time.time()) - self.t0
        return any(w0 <= e < w1 for w0, w1 in self.quiet_windows)

    async def dashboard(self):
        c = Conn("127.0.0.1", self.port)
        nxt = time.time()
        while self.running():
            if self.quiet():
                await asyncio.sleep(1)
                nxt = time.time()
                continue
            now = time.time()
            for q in self.PANELS:
                form = urllib.parse.urlencode({"query": q, "start": f"{max(self.t0, now - 1800):.3f}",
                                               "end": f"{now:.3f}", "step": "15"}).encode()
                t = time.time()
                try:
                    st, data = await c.request("POST", "/api/v1/query_range", form,
                                               {"Content-Type": "application/x-www-form-urlencoded"}, timeout=60)
                    if st == 200 and json.loads(data)["status"] == "success":
                        self.stats.ok("query_range", time.time() - t)
                    else:
                        self.stats.err("query_range", (st, data[:300]))
                except Exception as e:  # noqa: BLE001
                    self.stats.err("query_range", repr(e))
                    c.close()
            nxt += 10
            await asyncio.sleep(max(0, nxt - time.time()))

    async def long_poll(self, i):
        c = Conn("127.0.0.1", self.port)
        job = self.poll_jobs[i % len(self.poll_jobs)]
        version = 0
        await asyncio.sleep(i * 0.003)
        while self.running():
            t = time.time()
            try:
                st, data = await c.request("GET", f"/api/v1/control/jobs/{job}?version={version}&wait=60s", timeout=90)
                if st == 200:
                    version = json.loads(data)["version"]
                    self.poll_cycles += 1
                elif st == 304:
                    self.poll_cycles += 1
                else:
                    self.stats.err("long_poll", (st, data[:300]))
                    await asyncio.sleep(1)
                self.stats.ok("long_poll_cycle", time.time() - t)
            except Exception as e:  # noqa: BLE001
                if not self.running():
                    break
                self.stats.err("long_poll", repr(e))
                c.close()
                await asyncio.sleep(1)

    async def controller(self):
        c = Conn("127.0.0.1", self.port)
        rng = random.Random(2)
        i = 0
        while self.running():
            await asyncio.sleep(5)
            job = rng.choice(self.poll_jobs)
            action = "pause" if i % 2 == 0 else "resume"
            i += 1
            t = time.time()
            try:
                st, data = await c.request("POST", f"/api/v1/control/jobs/{job}/{action}",
                                           json.dumps({"reason": "soak"}).encode(), {"Content-Type": "application/json"})
                (self.stats.ok if st == 200 else self.stats.err)("control", time.time() - t if st == 200 else (st, data))
            except Exception as e:  # noqa: BLE001
                self.stats.err("control", repr(e))
                c.close()

    async def scraper(self):
        # A separate process, as a real Prometheus is: reading and searching ~130 MB in this loop
        # stalled it for hundreds of milliseconds per scrape, and every push and control latency
        # measured meanwhile grew by that much. One long-lived shell loop, started once: forking
        # this process (it holds every TaskManager's bodies) for each scrape would stall the loop
        # too. Each scrape is curl piped into grep -c (the body's push_time_seconds series); the
        # loop prints "status count microseconds" per scrape, on the interval's grid.
        url = f"http://127.0.0.1:{self.port}/metrics"
        script = r"""
iv=$1; next=$(( ${EPOCHREALTIME/./} + iv ))
while :; do
  now=${EPOCHREALTIME/./}
  if (( next > now )); then d=$(( next - now )); sleep "$(( d / 1000000 )).$(printf %06d $(( d % 1000000 )))"; fi
  next=$(( next + iv ))
  t0=${EPOCHREALTIME/./}
  n=$(set -o pipefail; curl -fsS --max-time 60 "$0" 2>&1 | grep -c '^push_time_seconds{')
  rc=$?
  echo "$rc ${n:-0} $(( ${EPOCHREALTIME/./} - t0 ))"
done"""
        p = await asyncio.create_subprocess_exec("bash", "-c", script, url, str(int(self.a.scrape_interval * 1e6)),
                                                 stdout=asyncio.subprocess.PIPE)
        try:
            while self.running():
                line = (await p.stdout.readline()).decode().split()
                if len(line) != 3:
                    self.stats.err("scrape", "scraper loop ended")
                    return
                rc, n, us = int(line[0]), int(line[1]), int(line[2])
                if rc == 0 and n > 0:
                    self.stats.ok("scrape", us / 1e6)
                else:
                    self.stats.err("scrape", (rc, n))
        finally:
            if p.returncode is None:
                p.kill()
                await p.wait()

    async def sampler(self):
        c = Conn("127.0.0.1", self.port)
        while self.running():
            rss = 0
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss = int(line.split()[1])
            head = 0
            try:
                st, data = await c.request("GET", "/-/metrics")
                for line in data.decode().splitlines():
                    if line.startswith("sluice_storage_head_memory_bytes "):
                        head = float(line.split()[1])
                    elif line.startswith("sluice_heap_"):
                        k, v = line.split()
                        self.heap[k] = float(v)
            except Exception as e:  # noqa: BLE001
                self.stats.err("metrics", repr(e))
                c.close()
            self.samples.append((round(time.time() - self.t0, 1), rss, head, self.heap.get("sluice_heap_in_use_bytes", 0)))
            await asyncio.sleep(5)

    async def run(self):
        await self.gen_bodies(0)
        tasks = [asyncio.create_task(self.body_refresher()), asyncio.create_task(self.remote_writer()),
                 asyncio.create_task(self.dashboard()), asyncio.create_task(self.controller()),
                 asyncio.create_task(self.sampler())]
        if self.a.scrape_interval > 0:
            tasks.append(asyncio.create_task(self.scraper()))
        tasks += [asyncio.create_task(self.pusher(tm)) for tm in range(self.a.tms)]
        tasks += [asyncio.create_task(self.long_poll(i)) for i in range(self.a.polls)]
        await asyncio.sleep(self.a.duration)
        await asyncio.sleep(1)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# The dashboard pauses for QUIET_S seconds at the end of warm-up and at the end of the run; the
# retained-memory figures come from the last QUIET_SAMPLE_S seconds of each pause, when the last
# query has finished and a heap trim (every 10 s) has given its memory back. Ingest, long-polls
# and control changes go on throughout.
QUIET_S = 30
QUIET_SAMPLE_S = 15


def quiet_windows(warmup, duration, every=0):
    """The dashboard's pauses as (start, end) seconds into the run: the verdict's two, at the end of
    warm-up and at the end of the run, and with every > 0 one every `every` seconds between them
    (none closer than every / 2 to the end), so a long run shows whether the retained memory levels
    off or keeps growing."""
    ends = [warmup]
    if every > 0:
        e = warmup + every
        while e <= duration - every / 2:
            ends.append(e)
            e += every
    ends.append(duration)
    return [(e - QUIET_S, e) for e in ends]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--tools", default="build/tests/tools")
    ap.add_argument("--duration", default="30m")
    ap.add_argument("--warmup", default=None, help="default: a fifth of the duration, at most 5m")
    ap.add_argument("--tms", type=int, default=200)
    ap.add_argument("--polls", type=int, default=1000)
    ap.add_argument("--rw-series", type=int, default=5000)
    ap.add_argument("--scrape-interval", type=float, default=0, help="seconds between GET /metrics; 0: none")
    ap.add_argument("--quiet-every", default="0",
                    help="also pause the dashboard every this long after warm-up and print the retained memory "
                         "at each pause (e.g. 10m); the verdict still compares the first and the last")
    ap.add_argument("--data", default=None)
    ap.add_argument("--out", default=".")
    ap.add_argument("--sluice-arg", action="append", default=[])
    a = ap.parse_args()
    a.duration = parse_dur(a.duration)
    a.warmup = parse_dur(a.warmup) if a.warmup else min(300.0, a.duration / 5)
    a.quiet_every = parse_dur(a.quiet_every)

    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))

    tmp = None
    data = a.data or (tmp := tempfile.mkdtemp(prefix="sluice-soak-"))
    port = pp_free_port()
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "soak-sluice.log"), "wb")
    args = [a.sluice, f"--web.listen-address=127.0.0.1:{port}", f"--storage.path={data}", *a.sluice_arg]
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(port, proc)
        soak = Soak(a, port, proc.pid)
        t_start = time.time()
        asyncio.run(soak.run())
        wall = time.time() - t_start
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(120)
        log.close()
    ok = report(a, soak, wall, rc, args)
    if tmp:
        subprocess.run(["rm", "-rf", tmp])
    sys.exit(0 if ok else 1)


def pp_free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, proc):
    import urllib.request
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"sluice exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("sluice not ready")


def report(a, soak, wall, rc, args):
    st = soak.stats
    print(f"\nsoak: {wall / 60:.1f} min, {a.tms} TaskManagers x {len(next(iter(soak.bodies.values()))[1]) // 1024} KiB "
          f"every 10 s, remote write {a.rw_series} series / 15 s, 6 query_range panels / 10 s, "
          f"{a.polls} parked long-polls ({soak.poll_cycles} answered), control change / 5 s"
          + (f", GET /metrics every {a.scrape_interval:g} s" if a.scrape_interval > 0 else ""))
    print(f"command: {' '.join(args)}")
    print(f"\n{'endpoint':<16} {'requests':>9} {'errors':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'p99 after warm-up':>18}")
    eps = sorted(set(st.lat) | set(st.errors))
    for ep in eps:
        xs = st.lat.get(ep, [])
        print(f"{ep:<16} {len(xs) + st.errors.get(ep, 0):>9} {st.errors.get(ep, 0):>7} {pct(xs, 50) * 1000:>8.1f} "
              f"{pct(xs, 99) * 1000:>8.1f} {max(xs, default=float('nan')) * 1000:>8.1f} "
              f"{pct([d for d, t in zip(xs, st.ends.get(ep, [])) if t >= soak.t0 + a.warmup], 99) * 1000:>18.1f}")
    samples = soak.samples
    after = [s for s in samples if s[0] >= a.warmup]
    ok = True
    quiet = [[s for s in samples if w1 - QUIET_SAMPLE_S <= s[0] < w1] for _, w1 in soak.quiet_windows]
    if after and all(quiet):
        other = lambda win: min(r - h / 1024 for _, r, h, _ in win)  # noqa: E731 — RSS minus head, KiB
        ret0, ret1 = other(quiet[0]), other(quiet[-1])
        rss0, rssw, rss1 = samples[0][1], quiet[0][-1][1], quiet[-1][-1][1]
        print(f"\nRSS: start {rss0 / 1024:.0f} MiB, after warm-up ({a.warmup:.0f} s) {rssw / 1024:.0f} MiB, "
              f"end {rss1 / 1024:.0f} MiB; head memory {quiet[0][-1][2] / 2**20:.0f} -> {quiet[-1][-1][2] / 2**20:.0f} MiB; "
              f"heap in use {quiet[0][-1][3] / 2**20:.0f} -> {quiet[-1][-1][3] / 2**20:.0f} MiB")
        if len(quiet) > 2:
            print("retained memory at each pause (minute: MiB): " + ", ".join(
                f"{w1 / 60:.0f}: {other(win) / 1024:.0f}" for (_, w1), win in zip(soak.quiet_windows, quiet)))
        print(f"retained memory (RSS minus head, dashboard paused): {ret0 / 1024:.0f} -> {ret1 / 1024:.0f} MiB; "
              f"under full load RSS minus head ranged {min(r - h / 1024 for _, r, h, _ in after) / 1024:.0f}-"
              f"{max(r - h / 1024 for _, r, h, _ in after) / 1024:.0f} MiB")
        if soak.heap:
            print(f"heap trims: {soak.heap.get('sluice_heap_trims_total', 0):.0f}, "
                  f"{soak.heap.get('sluice_heap_trim_seconds_total', 0):.2f} s in all, "
                  f"{soak.heap.get('sluice_heap_trimmed_bytes_total', 0) / 2**30:.1f} GiB returned")
        limit = ret0 * 1.05 + 16 * 1024
        if ret1 > limit:
            print(f"FAIL: RSS not accounted for by stored data grew after warm-up ({ret0 / 1024:.0f} -> "
                  f"{ret1 / 1024:.0f} MiB, limit {limit / 1024:.0f} MiB)")
            ok = False
    else:
        print("\nRSS: run too short for the growth check")
    nerr = sum(st.errors.values())
    if nerr:
        print(f"FAIL: {nerr} errors; first ones:")
        for e in st.error_samples:
            print("  ", e)
        ok = False
    if rc != 0:
        print(f"FAIL: sluice exited with {rc}")
        ok = False
    with open(os.path.join(a.out, "soak.json"), "w") as f:
        json.dump({"args": args, "duration_s": wall, "errors": st.errors, "rss_samples": samples, "t0": soak.t0,
               "slow": st.slow, "heap": soak.heap, "p99_ms": {ep: pct(x, 99) * 1000 for ep, x in st.lat.items()},
                   "p99_ms_after_warmup": {ep: pct([d for d, t in zip(x, st.ends[ep]) if t >= soak.t0 + a.warmup], 99) * 1000
                                           for ep, x in st.lat.items()}}, f)
    print("\nresult:", "PASS" if ok else "FAIL")
    return ok


if __name__ == "__main__":
    main()
