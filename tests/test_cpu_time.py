"""tests/cpu_time.py: a test's CPU time counts what its child processes used, and a test that waits shows none."""
import os
import re
import subprocess
import sys

import cpu_time
import pytest
from conftest import ROOT

BURN = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 1: pass"
TESTS = f"""import subprocess, sys, time
def test_burns_in_a_child():   # about one CPU-second, all of it in another process
    subprocess.run([sys.executable, "-c", "{BURN}"])
def test_sleeps():
    time.sleep(1)
"""


@pytest.mark.slow   # a pytest run of its own: make test, not test-fast
def test_a_childs_cpu_counts_for_its_test_and_a_sleep_for_nothing(tmp_path):
    if cpu_time._group is None:   # this run measures nothing (and the inner run, with the same environment, neither)
        pytest.skip(f"cpu_time: not measured here: {cpu_time._why_not}")
    (tmp_path / "test_inner.py").write_text(TESTS)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests"), "PYTEST_ADDOPTS": ""}
    env.pop("PYTEST_XDIST_WORKER", None)
    groups = set(os.listdir(cpu_time.MOUNT))
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "cpu_time", "-p", "no:cacheprovider",
                        "-o", "addopts=", "test_inner.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    shown = {name: float(cpu) for cpu, name in re.findall(r"([\d.]+) CPU-s  test_inner\.py::(\w+)", p.stdout)}
    assert shown.get("test_burns_in_a_child", 0) >= 0.9, p.stdout[-2000:]
    assert shown.get("test_sleeps", 9) < 0.3, p.stdout[-2000:]
    assert set(os.listdir(cpu_time.MOUNT)) <= groups, "the inner run's cpuacct group is left"
