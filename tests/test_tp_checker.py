"""`course check tp`: the solution passes, the starter fails per piece, each faulty submission is named right.

The faulty submissions are in tests/tp_faulty/cases.py (declared as tests/faulty.py describes). Every run
is real: gloo processes on 2 and 4 ranks.
"""
import subprocess
import sys

import pytest
from conftest import ROOT
from faulty import assert_every_case_applies, ids
from tp_faulty.cases import CASES

from course_lib.tp import cases as tp_check
from course_lib.tp import grid

SOLUTION = ROOT / "solutions" / "06_tensor_parallel" / "tp.py"
EXERCISE = ROOT / "exercises" / "06_tensor_parallel" / "tp.py"
FOLDER = ROOT / "tests" / "tp_faulty"
PIECES = tp_check.ITEMS


def verdicts(report):
    return {v.item: v for v in report.verdicts}


@pytest.mark.slow
def test_solution_passes_every_piece():
    report = tp_check.check(str(SOLUTION))
    assert report.passed, report.text()
    assert [v.item for v in report.verdicts] == list(PIECES)


@pytest.mark.slow
def test_starter_fails_every_piece_with_its_message():
    report = tp_check.check(str(EXERCISE))
    got = verdicts(report)
    assert set(got) == set(PIECES), report.text()
    assert all(v.result == "fail" for v in got.values()), report.text()
    assert "NotImplementedError" in got["copy_to_parallel_region"].message
    assert "weight is None" in got["ColumnParallelLinear"].message
    assert "not written yet" in got["rank_groups"].message


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_faulty_named_with_reason_and_nothing_survives(tmp_path, case):
    case.assert_checked(tp_check.check, SOLUTION, FOLDER, tmp_path)


def test_every_case_applies_and_every_file_is_used():
    assert_every_case_applies(CASES, SOLUTION, FOLDER)
    assert {c.file for c in CASES if c.file} == {p.name for p in FOLDER.glob("*.py")} - {"cases.py"}


def test_reference_rank_groups_matches_design_example():
    # the exercise's own example: 8 ranks, tp=4, dp=2
    g = grid.reference_rank_groups(8, tp=4, dp=2)
    assert g["tp"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert g["dp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert g["cp"] == [[r] for r in range(8)]
    # dp fastest: consecutive ranks are data-parallel replicas
    g = grid.reference_rank_groups(8, tp=2, dp=4, order="dp-tp-cp-pp")
    assert g["dp"] == [[0, 1, 2, 3], [4, 5, 6, 7]] and g["tp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_reference_rank_groups_partition_every_case():
    for world, tp, dp, cp, pp, order in grid.rank_group_cases():
        g = grid.reference_rank_groups(world, tp=tp, dp=dp, cp=cp, pp=pp, order=order)
        for kind, size in (("tp", tp), ("dp", dp), ("cp", cp), ("pp", pp)):
            assert sorted(r for grp in g[kind] for r in grp) == list(range(world))
            assert all(len(grp) == size for grp in g[kind])
        # groups of different kinds meet in exactly one rank when they meet at all (orthogonal axes)
        for a in g["tp"]:
            for b in g["dp"]:
                assert len(set(a) & set(b)) <= 1


def test_cli_exit_codes(tmp_path):
    missing = subprocess.run([sys.executable, "-m", "course_lib.cli", "check", "tp", str(tmp_path / "nope.py")],
                             capture_output=True, text=True)
    # errors go to stderr (issue 10's CLI convention; the message was on stdout before)
    assert missing.returncode == 2 and "no such file" in missing.stderr
