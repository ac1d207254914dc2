"""Runs sluice's own PromQL test scripts (tests/promql/*.test) through the promql_test tool."""
import os
import subprocess

TOOLS = os.environ.get("SLUICE_TOOLS_DIR", os.path.join(os.path.dirname(__file__), "../../build/tests/tools"))
SRC = os.environ.get("SLUICE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "../.."))


def test_sluice_promql_scripts():
    r = subprocess.run([os.path.join(TOOLS, "promql_test"), os.path.join(SRC, "tests", "promql")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "total" in r.stdout
