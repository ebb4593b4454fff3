"""scripts/gpu-first-run.sh (issue 54): one command on a GPU machine without internet that stops itself within its
limit and leaves report.md/json and the raw facts in one folder. Here it runs end to end on CPU (every GPU item
NOT POSSIBLE); and the check it runs ends cleanly when the script's backstop (``timeout``) sends SIGTERM."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, live_processes

from course_lib.selftest.runs import NOT_POSSIBLE, PASS

SCRIPT = ROOT / "scripts" / "gpu-first-run.sh"


def _first_run(tmp_path, limit: int) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PY": sys.executable, "WHEELS": str(tmp_path / "none"),
           "LIMIT": str(limit)}
    start = time.monotonic()
    p = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit + 60)
    return p, time.monotonic() - start


@pytest.mark.slow
def test_the_first_run_runs_on_cpu_within_its_limit_and_leaves_one_folder(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU here: the items would run for minutes")
    p, seconds = _first_run(tmp_path, 240)
    said = p.stdout + p.stderr
    assert p.returncode == 3 and seconds < 240, said          # cuda-torch is required: NOT POSSIBLE here
    out = tmp_path / "out"
    data = json.loads((out / "report.json").read_text())
    assert data["complete"] and data["exit_code"] == 3 and 0 < data["budget_s"] <= 240 - 45
    assert {r["status"] for r in data["items"]} == {NOT_POSSIBLE} and data["items"][-1]["name"] == "notebook-02"
    assert "**0 PASS, 0 FAIL," in (out / "report.md").read_text()
    assert (out / "gpu-check-logs.tar.gz").is_file()
    facts = out / "facts"
    assert f"torch {torch.__version__}" in (facts / "versions.txt").read_text()
    assert "$ nvidia-smi -L" in (facts / "nvidia-smi.txt").read_text()
    assert (facts / "nccl-debug.txt").is_file()
    assert f"read {out}/report.md" in p.stdout and "no wheels in" in p.stdout


def test_a_limit_too_small_for_the_check_stops_at_once(tmp_path):
    p, seconds = _first_run(tmp_path, 10)
    assert p.returncode == 124 and "no time left for the check (LIMIT=10" in p.stdout, p.stdout + p.stderr
    assert (tmp_path / "out" / "facts" / "versions.txt").is_file()


TERMINATED_RUN = """
import subprocess, sys, time
from pathlib import Path
from course_lib.selftest import gpu
from course_lib.selftest.items import Item
from course_lib.selftest.runs import PASS, Outcome, run_command

def slow(ctx):   # a process in a session of its own, as every item's: a signal to this group misses it
    run_command([sys.executable, "-c", "import time; time.sleep(300)", sys.argv[2] + "-child"], ctx.folder / "log",
                300)

items = [Item("quick", "passes", lambda p: "", lambda ctx: Outcome(PASS, "done")),
         Item("slow", "sleeps", lambda p: "", slow)]
sys.exit(gpu.check(items, Path(sys.argv[1])))
"""


@pytest.mark.slow
def test_sigterm_stops_the_check_and_the_running_items_processes(tmp_path):
    out, marker = tmp_path / "report", f"selftest-term-{time.monotonic_ns()}"
    child = marker + "-child"     # in the slow item's process only (the check's own command line has the marker)
    p = subprocess.Popen([sys.executable, "-c", TERMINATED_RUN, str(out), marker], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not live_processes(child):
            time.sleep(0.1)
        assert live_processes(child), "the slow item's process never started"
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 128 + signal.SIGTERM
    finally:
        p.kill()
    deadline = time.monotonic() + 10
    while live_processes(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not live_processes(child)
    data = json.loads((out / "report.json").read_text())
    assert [(r["name"], r["status"]) for r in data["items"]] == [("quick", PASS)]
    assert not data["complete"] and data["running"] == "slow"
