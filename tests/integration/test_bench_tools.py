"""The control benchmark's programs and the soak's pause schedule (issue 19): bench/ is not part of
the build, so these check that bench/control_propagation.c and bench/fanout_floor.c still compile,
run against a real sluice (or sluice's own fan-out) and count every answer, and that
bench/soak.py --quiet-every places its pauses where the report says. No timing is asserted."""
import importlib.util
import os
import re
import subprocess

import pytest

from conftest import SLUICE_BIN

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.dirname(os.path.abspath(SLUICE_BIN))


def load_soak():
    spec = importlib.util.spec_from_file_location("soak", os.path.join(ROOT, "bench", "soak.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_soak_quiet_windows():
    soak = load_soak()
    q = soak.QUIET_S
    # without --quiet-every: the verdict's two pauses only
    assert soak.quiet_windows(300, 1500) == [(300 - q, 300), (1500 - q, 1500)]
    # 50 minutes, every 10 after a 5-minute warm-up: 5, 15, 25, 35, 45, 50
    ends = [w1 for _, w1 in soak.quiet_windows(300, 3000, 600)]
    assert ends == [300, 900, 1500, 2100, 2700, 3000]
    # a pause closer than half an interval to the end is left to the final one
    ends = [w1 for _, w1 in soak.quiet_windows(300, 1400, 600)]
    assert ends == [300, 900, 1400]
    assert all(w1 - w0 == q for w0, w1 in soak.quiet_windows(300, 3000, 600))


def line_figures(out, label):
    m = re.search(re.escape(label) + r"\s+p50\s+([\d.]+) ms\s+p99\s+([\d.]+) ms\s+max\s+([\d.]+) ms", out)
    assert m, f"no '{label}' line in:\n{out}"
    p50, p99, mx = (float(x) for x in m.groups())
    assert 0 < p50 <= p99 <= mx
    return p50, p99


def test_control_propagation_counts_every_answer(sluice, tmp_path):
    exe = tmp_path / "control_propagation"
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", "-o", str(exe), os.path.join(ROOT, "bench", "control_propagation.c")],
                   check=True)
    out = subprocess.run([str(exe), "127.0.0.1", str(sluice.port), "50", "2", str(sluice.proc.pid)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "control change -> 50 parked long-polls, 2 rounds (100 answers)" in out.stdout
    line_figures(out.stdout, "long-poll answer")
    line_figures(out.stdout, "answer arrived")
    assert "(kernel receive time, 100 answers)" in out.stdout
    assert re.search(r"inside sluice \(means\): commit [\d.]+ ms, fan-out [\d.]+ ms", out.stdout), out.stdout


def sanitizer_flags(lib):
    """The flags a program linked against lib needs: those the library was built with."""
    syms = subprocess.run(["nm", "-A", lib], capture_output=True, text=True).stdout
    if "__tsan_" in syms:
        return ["-fsanitize=thread"]
    if "__asan_" in syms:
        return ["-fsanitize=address,undefined"]
    return []


def test_fanout_floor_answers_every_poll(tmp_path):
    lib = os.path.join(BUILD, "libsluice_core.a")
    if not os.path.exists(lib):
        pytest.skip(f"no {lib}")
    exe = tmp_path / "fanout_floor"
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", *sanitizer_flags(lib), f"-I{ROOT}", f"-I{BUILD}/gen", "-o", str(exe),
                    os.path.join(ROOT, "bench", "fanout_floor.c"), lib, "-luring", "-lpthread"], check=True)
    for lanes in ("1", "2"):
        out = subprocess.run([str(exe), "50", "3", lanes], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert re.search(rf"fan-out floor: 50 polls, 3 rounds, {lanes} lanes \((io_uring|send\(\))\), 420-byte answer",
                         out.stdout), out.stdout
        line_figures(out.stdout, "answer read")
        line_figures(out.stdout, "answer arrived")
