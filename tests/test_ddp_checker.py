"""The DDP checker on the reference solution, the starter exercise and a folder of faulty scripts.

Each file in tests/ddp_faulty/ says in its docstring what is wrong with it and what the checker must say:
``# EXPECT: Step N: <regex>`` (that step fails and its message matches), ``# EXPECT: Step N: PASS``, or
``# EXPECT: all pass``; ``# CHECK: styles=srun,torchrun more_ranks=3|none timeout=S stall=S cpu_only=1`` sets up
the check (the fewer runs, the quicker). An instructor adds their own files the same way.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import live_processes
from course_lib.checks import ddp

ROOT = Path(__file__).resolve().parent.parent
FAULTY = sorted((ROOT / "tests" / "ddp_faulty").glob("*.py"))
SOLUTION = ROOT / "solutions" / "02_ddp" / "mnist_classify_ddp.py"
EXERCISE = ROOT / "exercises" / "02_ddp" / "mnist_classify_ddp.py"


def expectations(path: Path):
    """(check options, [(step or None for all, regex or 'PASS')]) from a faulty file's header."""
    text = path.read_text()
    opts = {"styles": ("srun",), "more_ranks": None, "timeout": 120.0, "cpu_only": False}
    m = re.search(r"^# CHECK: (.*)$", text, re.M)
    for item in (m.group(1).split() if m else []):
        k, v = item.split("=", 1)
        if k == "styles":
            opts["styles"] = tuple(v.split(","))
        elif k == "more_ranks":
            opts["more_ranks"] = None if v == "none" else int(v)
        elif k == "timeout":
            opts["timeout"] = float(v)
        elif k == "stall":
            opts["stall"] = float(v)
        elif k == "cpu_only":
            opts["cpu_only"] = v == "1"
    expect = []
    for line in re.findall(r"^# EXPECT: (.*)$", text, re.M):
        if line.strip() == "all pass":
            expect.append((None, "PASS"))
        else:
            step, rule = re.match(r"Step (\d): (.*)$", line).groups()
            expect.append((int(step), rule.strip()))
    assert expect, f"{path.name} has no '# EXPECT:' line"
    return opts, expect


def _gpus():
    import torch
    return torch.cuda.device_count()


@pytest.mark.slow
@pytest.mark.parametrize("path", FAULTY, ids=[p.stem for p in FAULTY])
def test_checker_names_the_step_and_the_reason(path):
    opts, expect = expectations(path)
    if opts.pop("cpu_only") and _gpus() >= 2:
        pytest.skip("this mistake only shows without GPUs")
    report = ddp.check(str(path), cache=False, **opts)
    if "stall" in opts:   # a deadlock is reported once a rank waited `stall` seconds, not at the deadline
        assert report.seconds < 6 * opts["stall"], f"took {report.seconds:.0f} s:\n{report.text()}"
    text = report.text()
    verdicts = {int(v.item.split()[1]): v for v in report.verdicts}
    assert sorted(verdicts) == [1, 2, 3, 4, 5, 6], text
    for step, rule in expect:
        if step is None:
            assert report.passed, text
        elif rule == "PASS":
            assert verdicts[step].result == "pass", text
        else:
            assert verdicts[step].result == "fail", f"Step {step} should fail:\n{text}"
            assert re.search(rule, verdicts[step].message, re.S), f"Step {step} should say /{rule}/:\n{text}"
    if not any(step is None for step, _ in expect):
        assert not report.passed, text
    assert not live_processes(str(path)), live_processes(str(path))


@pytest.mark.slow
def test_solution_passes_every_step_under_both_launchers_and_3_ranks():
    report = ddp.check(str(SOLUTION), cache=False)
    assert report.passed, report.text()
    assert [v.item for v in report.verdicts] == [f"Step {n}" for n in range(1, 7)]
    assert "srun and torchrun, with 2 and 3 ranks" in report.verdicts[5].message, report.text()
    print(f"\nsolution checked in {report.seconds:.1f} s")   # the goal is under 30 s on an idle 2-core machine


@pytest.mark.slow
def test_starter_exercise_fails_every_step_with_a_message():
    report = ddp.check(str(EXERCISE), cache=False, more_ranks=None)
    text = report.text()
    expected = {
        1: "no rank called torch.distributed.init_process_group",
        2: "identical on all ranks only because every rank trained on the same data",
        3: r"every rank trained on all \d+ images",
        4: "never reads the local rank",
        5: r"ranks \[0, 1\] all wrote mnist_cnn.pt",
        6: "works under no launcher",
    }
    for v in report.verdicts:
        n = int(v.item.split()[1])
        assert v.result == "fail", text
        assert re.search(expected[n], v.message), f"Step {n} should say /{expected[n]}/:\n{text}"


def test_cli_exit_codes(tmp_path):
    missing = subprocess.run([sys.executable, "-m", "course_lib.cli", "check", "ddp", str(tmp_path / "nope.py")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no such file" in missing.stdout
    bad = tmp_path / "broken.py"
    bad.write_text("def main(:\n    pass\n")
    out = subprocess.run([sys.executable, "-m", "course_lib.cli", "check", "ddp", str(bad)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert re.search(r"FAIL\s+Step 1\s+the script does not compile: SyntaxError", out.stdout), out.stdout


def test_steps_reuse_one_run_until_the_file_changes(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("def main(:\n    pass\n")
    first = ddp.check(str(bad), styles=("srun",), more_ranks=None)
    again = ddp.check(str(bad), styles=("srun",), more_ranks=None, steps=[1])
    assert [v.item for v in again.verdicts] == ["Step 1"] and again.seconds == first.seconds
    bad.write_text("import sys\nsys.exit('nothing here')\n")
    changed = ddp.check(str(bad), styles=("srun",), more_ranks=None, steps=[1])
    assert "does not compile" not in changed.verdicts[0].message, changed.text()
