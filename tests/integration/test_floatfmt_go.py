"""sluice's float formatting (internal/util/floatfmt.cc) against an oracle independent of it and of
double-conversion: Go's strconv.FormatFloat(v, fmt, -1, 64) layouts built here from Python's
repr, which gives the shortest digits that parse back and, of those, the closest to v (ties to
even), as Go does. Values: every power of two and its neighbours (where shortest-digit searches
that assume symmetric bounds go wrong), exact halfway values, random bit patterns, and specials.
sluice's own spellings are kept: NaN, +Inf, -Inf; zero is 0 / -0, and 0e+00 / -0e+00 in 'e' as in Go."""
import math
import os
import random
import struct
import subprocess

TOOLS = os.environ.get("SLUICE_TOOLS_DIR", os.path.join(os.path.dirname(__file__), "../../build/tests/tools"))


def go_format(v, fmt):
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, v) < 0 else ""
    if v == 0:
        return sign + ("0e+00" if fmt == "e" else "0")
    mant, _, exp = repr(abs(v)).partition("e")
    ip, _, fp = mant.partition(".")
    digits = (ip + fp).lstrip("0")
    point = len(ip) + (int(exp) if exp else 0) - (len(ip + fp) - len(digits))
    digits = digits.rstrip("0")
    n = len(digits)
    if fmt == "e" or (fmt == "g" and (point - 1 < -4 or point - 1 >= 6)):
        e = point - 1
        s = digits[0] + ("." + digits[1:] if n > 1 else "") + "e" + ("-" if e < 0 else "+") + "%02d" % abs(e)
    elif point <= 0:
        s = "0." + "0" * -point + digits
    elif point >= n:
        s = digits + "0" * (point - n)
    else:
        s = digits[:point] + "." + digits[point:]
    return sign + s


def values():
    rnd = random.Random(19)
    vs = []
    for k in range(-1074, 1024):
        p = math.ldexp(1.0, k)
        vs += [p, -p, math.nextafter(p, 0), math.nextafter(p, math.inf)]
    for e in range(1, 8):  # quarters, eighths ... near 2^52: exact halfway values among them
        vs += [rnd.randrange(2**52, 2**53) * 2.0**-e for _ in range(3000)]
    vs += [struct.unpack("<d", struct.pack("<Q", rnd.getrandbits(64)))[0] for _ in range(100000)]
    vs += [rnd.randrange(10**8) / 1000 for _ in range(20000)]
    vs += [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, 1.7976931348623157e308, 1e21, 1e23, 1e-7, 0.1]
    return vs


def test_formatting_matches_go():
    vs = values()
    inp = "".join("%016x\n" % struct.unpack("<Q", struct.pack("<d", v))[0] for v in vs)
    r = subprocess.run([os.path.join(TOOLS, "floatfmt_dump")], input=inp, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == len(vs)
    bad = []
    for v, line in zip(vs, lines):
        got = line.split(" ")
        want = [go_format(v, f) for f in "efg"]
        if got != want:
            bad.append((v.hex(), got, want))
    assert not bad, "%d of %d values differ, e.g. %s" % (len(bad), len(vs), bad[:5])
