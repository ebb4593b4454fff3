"""`course check cp`: the solution passes, the starter fails per function, each faulty submission is named right.

The faulty submissions are in tests/cp_faulty/cases.py (declared as tests/faulty.py describes). Every run is real:
one process, then gloo ranks for cp = 2, 3, 4 and dp = 2 x cp = 2.

The starter, the right variants and most faulty submissions are checked together (``check_many``), one launch per
set of world sizes: torch starts once per world instead of once per file. The solution and the submissions that
leave a rank waiting go through ``check`` alone, the path a learner's file takes.
"""
import subprocess
import sys

import pytest
from conftest import ROOT, live_processes
from cp_faulty.cases import CASES, RIGHT
from faulty import Faulty, assert_every_case_applies, ids

from course_lib import checking
from course_lib.cp import cases as cp_check
from course_lib.cp import reference

# one xdist worker runs the module's tests, so that the batch fixture is built once (see test_zero_checker.py)
pytestmark = pytest.mark.xdist_group("cp_checker")

SOLUTION = ROOT / "solutions" / "11_context_parallel" / "cp.py"
EXERCISE = ROOT / "exercises" / "11_context_parallel" / "cp.py"
FOLDER = ROOT / "tests" / "cp_faulty"
# Checked alone: a deadlock, and a rank's error that leaves the others waiting (a case that does not end cleanly
# makes check_many check every file of its launch again, each alone).
ALONE = {"ring_send_then_recv", "ring_global_rank"}
# cp = 3 and 4 show the direction of a ring
RIGHT_CASES = [Faulty(name, {}, edits=edits, options={"world_sizes": (3, 4)}) for name, edits in RIGHT.items()]


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """{case name or "starter": (path, report)}, from one check_many run per set of world sizes."""
    # copies, not the repository's files: a notebook test may check those same paths, and "nothing survives" looks
    # for processes by path
    starter = tmp_path_factory.mktemp("starter") / "cp.py"
    starter.write_text(EXERCISE.read_text())
    groups: dict = {(2,): [("starter", starter)]}
    for c in [c for c in CASES if c.name not in ALONE] + RIGHT_CASES:
        path = c.write(SOLUTION, FOLDER, tmp_path_factory.mktemp(c.name))
        groups.setdefault(tuple(c.options["world_sizes"]), []).append((c.name, path))
    out = {}
    for worlds, files in groups.items():
        for (name, path), report in zip(files, checking.check_many("cp", [p for _, p in files], world_sizes=worlds)):
            print(report.text())
            assert not live_processes(str(path)), f"a worker process for {path} survived the check"
            out[name] = (path, report)
    return out


@pytest.mark.slow
def test_solution_passes_every_function():
    report = cp_check.check(str(SOLUTION))
    assert report.passed, report.text()
    assert [v.item for v in report.verdicts] == list(cp_check.ITEMS)
    assert all(f"cp={n}" in report.text() for n in (1, 2, 3, 4)) and "dp=2 x cp=2" in report.text()


@pytest.mark.slow
def test_starter_fails_every_function_at_its_line(batch):
    report = batch["starter"][1]
    got = {v.item: v for v in report.verdicts}
    assert set(got) == set(cp_check.ITEMS), report.text()
    assert all(v.result == "fail" for v in got.values()), report.text()
    assert all("not written yet" in v.message and "cp.py line" in v.message for v in got.values()), report.text()


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_faulty_named_with_reason_and_nothing_survives(request, tmp_path, case):
    if case.name in ALONE:
        case.assert_checked(cp_check.check, SOLUTION, FOLDER, tmp_path)
        return
    path, report = request.getfixturevalue("batch")[case.name]
    case.assert_reported(report, path.read_text())
    assert not live_processes(str(path)), "a worker process survived the check"


@pytest.mark.slow
@pytest.mark.parametrize("case", RIGHT_CASES, ids=ids(RIGHT_CASES))
def test_right_in_another_style_passes(batch, case):
    """A ring may turn either way, and may post the next transfer before computing with the block it has: the rules
    on whom a rank talks to and when it posts its sends must not fail those."""
    report = batch[case.name][1]
    assert report.passed, report.text()


def test_every_case_applies():
    assert_every_case_applies(CASES + RIGHT_CASES, SOLUTION, FOLDER)


def test_reference_split_keeps_every_token_and_balances_causal_work():
    for cp in range(1, 5):
        for seq_len in range(cp, 20):
            for balanced in (False, True):
                shares = [reference.positions(seq_len, cp, r, balanced) for r in range(cp)]
                assert sorted(p for s in shares for p in s.tolist()) == list(range(seq_len))
    # causal work of a shard: the keys its queries see, sum(p + 1); plain puts most on the last rank
    work = {b: [int((reference.positions(64, 4, r, b) + 1).sum()) for r in range(4)] for b in (False, True)}
    assert work[False] == [136, 392, 648, 904] and len(set(work[True])) == 1


def test_cli_exit_codes(tmp_path):
    missing = subprocess.run([sys.executable, "-m", "course_lib.cli", "check", "cp", str(tmp_path / "nope.py")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "no such file" in missing.stderr
