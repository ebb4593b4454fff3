"""`course check cp`: the solution passes, the starter fails per function, each faulty submission is named right.

The faulty submissions are in tests/cp_faulty/cases.py (declared as tests/faulty.py describes). Every run is real:
one process, then gloo ranks for cp = 2, 3, 4 and dp = 2 x cp = 2.
"""
import subprocess
import sys

import pytest
from conftest import ROOT
from cp_faulty.cases import CASES, RIGHT
from faulty import Faulty, assert_every_case_applies, ids

from course_lib.cp import cases as cp_check
from course_lib.cp import reference

SOLUTION = ROOT / "solutions" / "11_context_parallel" / "cp.py"
EXERCISE = ROOT / "exercises" / "11_context_parallel" / "cp.py"
FOLDER = ROOT / "tests" / "cp_faulty"


@pytest.mark.slow
def test_solution_passes_every_function():
    report = cp_check.check(str(SOLUTION))
    assert report.passed, report.text()
    assert [v.item for v in report.verdicts] == list(cp_check.ITEMS)
    assert all(f"cp={n}" in report.text() for n in (1, 2, 3, 4)) and "dp=2 x cp=2" in report.text()


@pytest.mark.slow
def test_starter_fails_every_function_at_its_line():
    report = cp_check.check(str(EXERCISE), world_sizes=(2,))
    got = {v.item: v for v in report.verdicts}
    assert set(got) == set(cp_check.ITEMS), report.text()
    assert all(v.result == "fail" for v in got.values()), report.text()
    assert all("not written yet" in v.message and "cp.py line" in v.message for v in got.values()), report.text()


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_faulty_named_with_reason_and_nothing_survives(tmp_path, case):
    case.assert_checked(cp_check.check, SOLUTION, FOLDER, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RIGHT))
def test_right_in_another_style_passes(tmp_path, name):
    """A ring may turn either way, and may post the next transfer before computing with the block it has: the rules
    on whom a rank talks to and when it posts its sends must not fail those (cp = 3 and 4 show the direction)."""
    path = Faulty(name, {}, edits=RIGHT[name]).write(SOLUTION, FOLDER, tmp_path)
    report = cp_check.check(str(path), world_sizes=(3, 4))
    assert report.passed, report.text()


def test_every_case_applies():
    assert_every_case_applies(CASES, SOLUTION, FOLDER)
    for name, edits in RIGHT.items():
        Faulty(name, {}, edits=edits).source(SOLUTION, FOLDER)


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
