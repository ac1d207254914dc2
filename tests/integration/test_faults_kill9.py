"""Fault injection: kill -9 of the real daemon during sustained push + remote-write load.

tests/integration/test_storage_crash.py kills the storage loader (storage_load) and corrupts the
files; this one kills `sluice` itself while HTTP clients write through both ingest paths, several
times in a row on the same data directory, and checks the durability contract end to end:

  every sample whose request was acknowledged (PUT 200 / POST 204) more than one fsync interval
  (--wal.fsync-interval, 1 s by default) before the kill is there after the restart;
  nothing stored is something no client sent (no corruption), and /-/ready comes back.

Load per round (3-5 s, then SIGKILL):
  - 2 push clients, each cycling over 8 groups (PUT /metrics/job/fault/pusher/<p>/group/<g>),
    each body 40 gauges whose value is the push's sequence number. Pushes are stamped with the
    receive second and a later push of the same second replaces the earlier, so "present" means:
    a sample of that group with value >= seq stamped no earlier than the push's send second.
  - 1 remote-write client: requests of 150 series `fault_rw{s="<i>"}`, request k carrying
    (base + k s, k) for every series (explicit timestamps, one new second per request).
Everything is read back through POST /api/v1/read (SAMPLES).
"""
import os
import random
import threading
import time

import requests

import promproto as pp

ROUNDS = 4
FSYNC_MS = 1000
PUSHERS = 2
GROUPS = 8
FILL = 40
RW_SERIES = 150
BASE_MS = (int(time.time()) - 3600) * 1000  # inside the 2 h raw retention for the whole test


class Load:
    """Runs the writers until stop(); records (key, send_wall_ms, ack_wall_ms) per acknowledged
    request. Connection errors (the kill) end a writer quietly; any other non-2xx is recorded."""

    def __init__(self, url, push_seq0, rw_k0):
        self.url = url
        self.stop_ev = threading.Event()
        self.lock = threading.Lock()
        self.push_acks = []  # (pusher, group, seq, send_ms, ack_ms)
        self.rw_acks = []  # (k, send_ms, ack_ms)
        self.push_sent_max = push_seq0
        self.rw_sent_max = rw_k0
        self.bad = []
        self.seq = push_seq0
        self.k = rw_k0
        self.threads = [threading.Thread(target=self.pusher, args=(p,), daemon=True) for p in range(PUSHERS)]
        self.threads.append(threading.Thread(target=self.rw, daemon=True))
        for t in self.threads:
            t.start()

    def next_seq(self):
        with self.lock:
            self.seq += 1
            self.push_sent_max = max(self.push_sent_max, self.seq)
            return self.seq

    def pusher(self, p):
        sess = requests.Session()
        g = 0
        while not self.stop_ev.is_set():
            seq = self.next_seq()
            body = f"fault_push_seq {seq}\n" + "".join(f'fault_push_fill{{i="{i}"}} {seq}\n' for i in range(FILL))
            send = time.time() * 1000
            try:
                r = sess.put(f"{self.url}/metrics/job/fault/pusher/p{p}/group/g{g}", data=body, timeout=10)
            except requests.RequestException:
                return
            ack = time.time() * 1000
            if r.status_code == 200:
                with self.lock:
                    self.push_acks.append((p, g, seq, send, ack))
            else:
                self.bad.append(("push", r.status_code, r.text))
            g = (g + 1) % GROUPS

    def rw(self):
        while not self.stop_ev.is_set():
            with self.lock:
                self.k += 1
                k = self.k
                self.rw_sent_max = k
            series = [([("__name__", "fault_rw"), ("s", str(i))], [(BASE_MS + k * 1000, float(k))])
                      for i in range(RW_SERIES)]
            send = time.time() * 1000
            try:
                st, _, body = pp.remote_write(self.url, series)
            except OSError:  # URLError, ConnectionReset, RemoteDisconnected
                return
            ack = time.time() * 1000
            if st == 204:
                with self.lock:
                    self.rw_acks.append((k, send, ack))
            else:
                self.bad.append(("rw", st, body))

    def join(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(15)


def read_series(url, matchers):
    st, _, res = pp.remote_read(url, [(0, BASE_MS + 10**9, matchers, None)])
    assert st == 200, res
    return res[0]


def check_push(url, acks, cutoff_ms, sent_max):
    series = read_series(url, [(pp.EQ, "__name__", "fault_push_seq"), (pp.EQ, "job", "fault")])
    by_group = {}
    for labels, samples in series:
        d = dict(labels)
        # Staleness markers are legitimate (a group's series end when the group is replaced).
        by_group[(d["pusher"], d["group"])] = [(t, pp.bits2f(v)) for t, v in samples if v != pp.STALE_NAN_BITS]
    checked = late_kept = 0
    for p, g, seq, send, ack in acks:
        got = by_group.get((f"p{p}", f"g{g}"), [])
        ok = any(v >= seq and t >= (int(send) // 1000) * 1000 - 1000 for t, v in got)
        if ack < cutoff_ms:
            assert ok, f"push p{p}/g{g} seq {seq} acknowledged at {ack:.0f} (kill - {cutoff_ms + FSYNC_MS - ack:.0f} ms) lost: {got[-5:]}"
            checked += 1
        else:
            late_kept += ok
    for key, samples in by_group.items():
        ts = [t for t, _ in samples]
        assert ts == sorted(set(ts)), f"{key}: timestamps not strictly increasing"
        vals = [v for _, v in samples]
        assert vals == sorted(vals), f"{key}: values not increasing (corruption?) {vals[-10:]}"
        assert all(v == int(v) and 0 < v <= sent_max for v in vals), f"{key}: a value nobody sent: {vals}"
    return checked, late_kept


def check_rw(url, acks, cutoff_ms, sent_max):
    series = read_series(url, [(pp.EQ, "__name__", "fault_rw")])
    assert len(series) == RW_SERIES or not acks, len(series)
    stored = {}
    for labels, samples in series:
        s = dict(labels)["s"]
        pts = {}
        for t, v in samples:
            k = (t - BASE_MS) // 1000
            assert (t - BASE_MS) % 1000 == 0 and 0 < k <= sent_max, f"series {s}: sample at {t} nobody sent"
            assert pp.bits2f(v) == float(k), f"series {s}: value {pp.bits2f(v)} at k={k} (corruption)"
            pts[k] = True
        stored[s] = pts
    checked = late_kept = 0
    for k, send, ack in acks:
        present = all(k in stored.get(str(i), {}) for i in range(RW_SERIES))
        if ack < cutoff_ms:
            missing = [i for i in range(RW_SERIES) if k not in stored.get(str(i), {})]
            assert not missing, f"remote write k={k} acknowledged {cutoff_ms + FSYNC_MS - ack:.0f} ms before the kill lost for series {missing[:10]}"
            checked += 1
        else:
            late_kept += present
    return checked, late_kept


def test_kill9_under_push_and_remote_write_load(start_sluice, tmpdir_path):
    d = os.path.join(tmpdir_path, "kill9-data")
    rng = random.Random(int(os.environ.get("FAULT_SEED", "10")))
    push_acks, rw_acks = [], []
    seq = k = 0
    figures = []
    s = start_sluice(f"--wal.fsync-interval={FSYNC_MS}ms", data_dir=d)
    for rnd in range(ROUNDS):
        load = Load(s.url, seq, k)
        time.sleep(rng.uniform(3, 5))
        kill_ms = time.time() * 1000
        s.kill9()
        load.join()
        assert not load.bad, load.bad[:5]
        assert load.push_acks and load.rw_acks, "no load was acknowledged"
        push_acks += load.push_acks
        rw_acks += load.rw_acks
        seq, k = load.push_sent_max, load.rw_sent_max
        # The contract is relative to the kill: acknowledged before kill - fsync interval.
        cutoff = kill_ms - FSYNC_MS
        s = start_sluice(f"--wal.fsync-interval={FSYNC_MS}ms", data_dir=d)  # waits for /-/ready
        assert requests.get(s.url + "/-/ready", timeout=5).status_code == 200
        log = s.read_log()
        assert "level=error" not in log, log
        # Earlier rounds' acks are all older than this round's cutoff, so one cutoff covers all.
        pc, pl = check_push(s.url, push_acks, cutoff, seq)
        rc, rl = check_rw(s.url, rw_acks, cutoff, k)
        figures.append((rnd, len(load.push_acks), len(load.rw_acks), pc, rc,
                        sum(1 for a in load.push_acks if a[4] >= cutoff), pl,
                        sum(1 for a in load.rw_acks if a[2] >= cutoff), rl))
    for f in figures:
        print("round %d: %d pushes, %d remote writes acknowledged; checked %d/%d (all present); "
              "acknowledged within the last fsync interval: pushes %d (kept %d), writes %d (kept %d)" % f)
    # Once more under load the daemon must still take writes after all the recoveries.
    st, _, body = pp.remote_write(s.url, [([("__name__", "fault_rw_after")], [(BASE_MS + (k + 1) * 1000, 1.0)])])
    assert st == 204, body
