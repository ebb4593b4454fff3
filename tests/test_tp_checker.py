"""`course check tp`: the solution passes, the starter fails per piece, each faulty submission is named right.

The faulty submissions are in tests/tp_faulty/cases.py (declared as tests/faulty.py describes). Every run
is real: gloo processes on 2 and 4 ranks.

Most files are checked together, one launch per world size for all (``check_many``): the tp=2 cases in one batch,
the solution, the starter and the case on the checker's own world sizes in another. Submissions that hang, one that
does not load and one whose setting no other file has go through ``check`` alone, the path a learner's file takes.
"""
import subprocess
import sys

import pytest
from conftest import ROOT, live_processes
from faulty import assert_every_case_applies, ids
from tp_faulty.cases import CASES, TP2

from course_lib import checking
from course_lib.tp import cases as tp_check
from course_lib.tp import grid

# One worker runs the module's tests one after another, so that it sets up each batch once (handed out among the
# workers, every worker that came to the module set up its module fixtures anew).
pytestmark = pytest.mark.xdist_group("tp_checker")

SOLUTION = ROOT / "solutions" / "06_tensor_parallel" / "tp.py"
EXERCISE = ROOT / "exercises" / "06_tensor_parallel" / "tp.py"
FOLDER = ROOT / "tests" / "tp_faulty"
PIECES = tp_check.ITEMS
# Checked alone: a hang stops its launch (check relaunches after it, check_many checks every file again alone); a
# load error ends check early. So is a case whose options no batch has.
ALONE = {"f_backward_only_rank0_reduces", "init_groups_rank0_only", "init_groups_only_own", "syntax_error"}
OWN_WORLDS = {"world_sizes": tp_check.WORLDS}     # the checker's own: what the solution and the starter run on
BATCH = [c for c in CASES if c.name not in ALONE and c.options == TP2]
BATCH_OWN = [c for c in CASES if c.name not in ALONE and c.options == OWN_WORLDS]
FIXTURE = {**{c.name: "batch" for c in BATCH}, **{c.name: "batch_own" for c in BATCH_OWN}}


def verdicts(report):
    return {v.item: v for v in report.verdicts}


def checked_together(files: dict, options: dict) -> dict:
    """{name: (path, report)} for ``files`` (name -> path), from one check_many run with ``options``."""
    reports = checking.check_many("tp", list(files.values()), **options)
    for path, report in zip(files.values(), reports):
        print(report.text())
        assert not live_processes(str(path)), f"a worker process for {path} survived the check"
    return dict(zip(files, zip(files.values(), reports)))


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """{case name: (path, report)} of the tp=2 cases, checked together."""
    return checked_together({c.name: c.write(SOLUTION, FOLDER, tmp_path_factory.mktemp(c.name)) for c in BATCH}, TP2)


@pytest.fixture(scope="module")
def batch_own(tmp_path_factory):
    """{"solution", "starter" or case name: (path, report)} on the checker's own world sizes, checked together."""
    # copies, not the repository's files: a notebook test on another xdist worker may check those same paths at the
    # same time, and "nothing survives" looks for processes by path
    files = {}
    for name, original in (("solution", SOLUTION), ("starter", EXERCISE)):
        files[name] = tmp_path_factory.mktemp(name) / "tp.py"
        files[name].write_text(original.read_text())
    files.update({c.name: c.write(SOLUTION, FOLDER, tmp_path_factory.mktemp(c.name)) for c in BATCH_OWN})
    return checked_together(files, OWN_WORLDS)


@pytest.mark.slow
def test_solution_passes_every_piece(batch_own):
    report = batch_own["solution"][1]
    assert report.passed, report.text()
    assert [v.item for v in report.verdicts] == list(PIECES)


@pytest.mark.slow
def test_starter_fails_every_piece_with_its_message(batch_own):
    report = batch_own["starter"][1]
    got = verdicts(report)
    assert set(got) == set(PIECES), report.text()
    assert all(v.result == "fail" for v in got.values()), report.text()
    assert "NotImplementedError" in got["copy_to_parallel_region"].message
    assert "weight is None" in got["ColumnParallelLinear"].message
    assert "not written yet" in got["rank_groups"].message


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_faulty_named_with_reason_and_nothing_survives(request, tmp_path, case):
    if case.name not in FIXTURE:
        case.assert_checked(tp_check.check, SOLUTION, FOLDER, tmp_path)
        return
    path, report = request.getfixturevalue(FIXTURE[case.name])[case.name]
    case.assert_reported(report, path.read_text())
    assert not live_processes(str(path)), "a worker process survived the check"


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
