"""`course check allreduce`: the solution passes, the starter fails per function, and each faulty
submission in tests/allreduce_faulty/ fails at the right function for the right reason (real gloo ranks)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import live_processes
from course_lib.checks import allreduce_worker as worker
from course_lib.checks.allreduce import FUNCTIONS, check

ROOT = Path(__file__).resolve().parent.parent
FAULTY = ROOT / "tests" / "allreduce_faulty"
SOLUTION = ROOT / "solutions" / "05_allreduce" / "allreduce.py"
STARTER = ROOT / "exercises" / "05_allreduce" / "allreduce.py"

# file -> (world sizes to check (the smallest that shows the fault, to keep the suite quick), {function: (verdict, regex the message must match)}); unlisted functions pass
EXPECT = {
    "all_correct.py": ((3, 5), {}),
    "naive_float32_accumulator.py": ((1,), {"naive_allreduce": ("fail", r"float64.*float32 precision")}),
    "naive_no_group_parameter.py": ((2,), {"naive_allreduce": ("fail", r"must accept group=None")}),
    "naive_returns_new_tensor.py": ((2,), {"naive_allreduce": ("fail", r"W=2.*returned the sum as a new tensor")}),
    "naive_uses_all_reduce.py": ((2,), {"naive_allreduce": ("fail", r"calls dist\.all_reduce .*:7 ")}),
    "naive_recv_before_send.py": ((2,), {"naive_allreduce": ("fail", r"W=2.*deadlock.*ranks \[0, 1\].*rank 1 was waiting at "
                                                                       r"naive_recv_before_send\.py:9")}),
    "ring_averages.py": ((2,), {"ring_allreduce": ("fail", r"W=2, 1,009 elements, float32.*the mean")}),
    "ring_missing.py": ((2,), {"ring_allreduce": ("missing", r"no function ring_allreduce")}),
    "ring_send_before_recv.py": ((2,), {"ring_allreduce": ("fail", r"W=2.*deadlock.*ring_send_before_recv\.py:29")}),
    "ring_tail_lost.py": ((2,), {"ring_allreduce": ("fail", r"W=2, 1,009 elements.*1 of 1009 elements wrong.*chunk boundaries")}),
    "ring_torch_chunk.py": ((2,), {"ring_allreduce": ("fail", r"W=2, 1 element,.*IndexError")}),
    "tree_no_broadcast.py": ((2,), {"tree_allreduce": ("fail", r"W=2.*rank 1: .*never comes back")}),
    "tree_pow2_only.py": ((3,), {"tree_allreduce": ("fail", r"W=3.*deadlock|W=3.*[Ii]nvalid")}),
    "tree_rebinds_name.py": ((2,), {"tree_allreduce": ("fail", r"W=2.*in place")}),
    "tree_uses_broadcast.py": ((2,), {"tree_allreduce": ("fail", r"calls dist\.broadcast")}),
}


def test_every_faulty_file_has_an_expectation():
    assert sorted(p.name for p in FAULTY.glob("*.py") if p.name != "syntax_error.py") == sorted(EXPECT)


def test_cases_cover_the_edges():
    for world in (1, 2, 3, 5):
        cases = worker.cases(world)
        counts = {c["shape"][0] for c in cases if len(c["shape"]) == 1}
        assert {0, 1, max(world - 1, 0), world + 1, worker.PRIME, worker.BIG} <= counts
        assert {c["dtype"] for c in cases} == {"float32", "float64", "int64"}
        assert len({(tuple(c["shape"]), c["dtype"]) for c in cases}) == len(cases)


def test_diagnose_names_the_mistake():
    import torch
    x = [torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), torch.tensor([4.0, 5.0, 6.0], dtype=torch.float64)]
    total = x[0] + x[1]
    assert "the mean" in worker.diagnose(total / 2, total, x[0], 2)
    assert "still holds this rank's input" in worker.diagnose(x[0].clone(), total, x[0], 2)
    tail = total.clone()
    tail[2] = 0
    msg = worker.diagnose(tail, total, x[0], 2)
    assert "1 of 3 elements wrong (indices 2..2)" in msg and "chunk boundaries" in msg


@pytest.mark.slow
def test_solution_passes():
    report = check(str(SOLUTION))
    assert report.passed, report.text()
    assert [v.item for v in report.verdicts] == list(FUNCTIONS)
    print(report.text())


@pytest.mark.slow
def test_starter_fails_fast_with_a_message_per_function():
    proc = subprocess.run([sys.executable, "-m", "course_lib.cli", "check", "allreduce", str(STARTER)],
                          capture_output=True, text=True, timeout=180, cwd=ROOT)
    print(proc.stdout)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for fn in FUNCTIONS:
        assert re.search(rf"FAIL\s+{fn}\s+W=\d.*not written yet \(NotImplementedError: {fn}: ", proc.stdout), fn
    seconds = float(re.search(r"passed in ([\d.]+) s", proc.stdout).group(1))
    assert seconds < 120, "the starter must fail at once, not run into deadlines"


def test_syntax_error_is_one_verdict():
    report = check(str(FAULTY / "syntax_error.py"), world_sizes=(1,))
    assert [(v.item, v.result) for v in report.verdicts] == [("import", "fail")]
    assert re.search(r"syntax_error\.py:20.*SyntaxError", report.verdicts[0].message), report.text()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECT))
def test_faulty_submission_is_caught(name):
    worlds, expected = EXPECT[name]
    path = FAULTY / name
    report = check(str(path), case_timeout=6, world_sizes=worlds)
    print(report.text())
    got = {v.item: v for v in report.verdicts}
    assert list(got) == list(FUNCTIONS), report.text()
    for fn in FUNCTIONS:
        result, pattern = expected.get(fn, ("pass", ""))
        assert got[fn].result == result, f"{fn}: {report.text()}"
        assert re.search(pattern, got[fn].message, re.S), f"{fn}: {got[fn].message}"
    assert not live_processes(worker.__name__, str(path)), "a worker process survived the check"
