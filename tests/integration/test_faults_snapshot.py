"""Fault injection: a damaged head.snapshot (issue #16, case 6).

A clean stop writes head.snapshot and keeps the one before it as head.snapshot.prev, together with
the WAL segments that one needs. With the newest snapshot damaged, the daemon must

  - recover from the previous snapshot + the WAL since it: every raw sample written before the
    last stop and every push group are back (nothing lost);
  - with no previous snapshot (a single clean stop, the WAL before it deleted), recover the intact
    records before the damage: only the series in the damaged record is lost;
  - set the damaged file aside as head.snapshot.corrupt-<ms> (never overwrite or delete it) and
    log what happened at error level.

Samples go in through remote write (explicit timestamps, so every value is known) and through the
push-gateway surface (stamped with the receive second); everything is read back through
POST /api/v1/read (SAMPLES) and GET /api/v1/metrics.
"""
# ctest-labels: integration
import glob
import json
import os
import time

import requests

import promproto as pp

RW_SERIES = 40
BASE_MS = (int(time.time()) - 1800) * 1000  # inside the 2 h raw retention


def write_rw(url, k0, k1):
    """Remote-writes samples k0..k1-1 (t = BASE + k s, value k + i / 1000) of every series."""
    for k in range(k0, k1):
        series = [([("__name__", "snapfault_rw"), ("s", f"{i:03d}")], [(BASE_MS + k * 1000, k + i / 1000)])
                  for i in range(RW_SERIES)]
        st, _, body = pp.remote_write(url, series)
        assert st == 204, body


def push(url, group, body):
    r = requests.put(f"{url}/metrics/job/snapfault/instance/{group}", data=body)
    assert r.status_code == 200, r.text


def groups(url):
    """Push groups as {labels json: group}, timestamps left out (they are the push times)."""
    out = {}
    for g in requests.get(url + "/api/v1/metrics").json()["data"]:
        key = json.dumps(g["labels"], sort_keys=True)
        out[key] = {name: [m.get("value") for m in fam.get("metrics", [])]
                    for name, fam in g.items() if isinstance(fam, dict) and "metrics" in fam}
    return out


def everything(url):
    """Every stored raw sample: {labels tuple: [(t, value bits)]}."""
    st, _, res = pp.remote_read(url, [(0, BASE_MS + 10**10, [(pp.RE, "__name__", "snapfault_.+")], None)])
    assert st == 200, res
    return {tuple(sorted(labels)): list(samples) for labels, samples in res[0]}


def flip(path, at, n=8):
    with open(path, "r+b") as f:
        f.seek(at)
        b = bytearray(f.read(n))
        f.seek(at)
        f.write(bytes(x ^ 0xA5 for x in b))


def set_aside(data):
    return glob.glob(os.path.join(data, "head.snapshot.corrupt-*"))


def test_damaged_snapshot_recovers_from_previous(start_sluice, tmpdir_path):
    """Two clean stops, then 8 bytes flipped in the middle of the newest snapshot: the previous
    snapshot and the WAL kept for it bring back every sample and push group."""
    data = os.path.join(tmpdir_path, "prev")
    s = start_sluice(data_dir=data)
    write_rw(s.url, 0, 20)
    push(s.url, "a", "snapfault_push_a 1\nsnapfault_push_b 2\n")
    push(s.url, "b", "snapfault_push_a 3\n")
    assert s.stop() == 0  # first snapshot
    snap = os.path.join(data, "head.snapshot")
    first = open(snap, "rb").read()

    s = start_sluice(data_dir=data)
    write_rw(s.url, 20, 40)
    push(s.url, "a", "snapfault_push_a 10\nsnapfault_push_b 20\n")  # values only
    push(s.url, "c", "snapfault_push_c 5\n")  # a new group, only in the second snapshot and WAL
    assert requests.delete(f"{s.url}/metrics/job/snapfault/instance/b").status_code == 202
    want_samples = everything(s.url)
    want_groups = groups(s.url)
    assert len(want_samples) >= RW_SERIES + 3
    assert all(len(v) == 40 for k, v in want_samples.items() if ("__name__", "snapfault_rw") in k)
    assert s.stop() == 0  # second snapshot; the first is kept as the previous one

    size = os.path.getsize(snap)
    flip(snap, size // 2)
    damaged = open(snap, "rb").read()

    s = start_sluice(data_dir=data)
    got = everything(s.url)
    for key, samples in want_samples.items():
        assert got.get(key, [])[:len(samples)] == samples, key
    assert groups(s.url) == want_groups
    assert open(snap + ".prev", "rb").read() == first  # what the recovery used, still kept
    assert not os.path.exists(snap)
    aside = set_aside(data)
    assert len(aside) == 1, aside
    assert open(aside[0], "rb").read() == damaged  # set aside untouched
    log = s.read_log()
    assert "level=error" in log and "snapshot damaged; recovering from the previous snapshot" in log, log
    assert "damaged snapshot set aside" in log, log
    assert s.stop() == 0
    # The next clean stop wrote a good snapshot and did not touch the set-aside file.
    assert open(aside[0], "rb").read() == damaged
    s = start_sluice(data_dir=data)
    assert groups(s.url) == want_groups
    assert "snapshot damaged" not in s.read_log()


def test_only_snapshot_damaged_at_its_end(start_sluice, tmpdir_path):
    """One clean stop (the WAL before it is deleted), then the last record of the only snapshot
    damaged: every series in the intact records and every push group come back; exactly the
    series of the damaged record is lost, and the log says so."""
    data = os.path.join(tmpdir_path, "single")
    s = start_sluice(data_dir=data)
    write_rw(s.url, 0, 20)
    push(s.url, "a", "snapfault_push_a 1\nsnapfault_push_b 2\n")
    push(s.url, "b", "snapfault_push_a 3\n")
    want_samples = everything(s.url)
    want_groups = groups(s.url)
    assert s.stop() == 0
    snap = os.path.join(data, "head.snapshot")
    assert not os.path.exists(snap + ".prev")

    size = os.path.getsize(snap)
    flip(snap, size - 24 - 8)  # the last record's payload, just before the 24-byte trailer

    s = start_sluice(data_dir=data)
    got = everything(s.url)
    intact = [k for k, v in want_samples.items() if got.get(k, [])[:len(v)] == v]
    lost = [k for k in want_samples if k not in intact]
    assert len(lost) == 1, lost
    # (Its roll-up buckets may still answer for it: the roll-ups live in SQLite, not the snapshot.)
    assert groups(s.url) == want_groups  # the group state is the snapshot's first record
    assert len(set_aside(data)) == 1
    log = s.read_log()
    assert "snapshot damaged; recovered the records before the damage" in log, log
    assert "records_expected=" in log and "damaged snapshot set aside" in log, log
