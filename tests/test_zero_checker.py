"""`course check zero`: the solution passes on W=2 and on W=4 with optimizer state at about 1/W of DDP's, the starter
fails every piece, each faulty submission (tests/zero_faulty/cases.py) is named right and nothing survives.
Every run is real: gloo processes, torch's own DDP as the reference.

The starter and most faulty submissions are checked together, on W=2, in one launch (``check_many``): torch and
DDP start once instead of once per file. The solution, a submission that hangs and one that does not load go
through ``check`` alone, the path a learner's file takes."""
import re
import subprocess
import sys

import pytest
from conftest import ROOT, live_processes
from faulty import ids
from zero_faulty.cases import CASES, HONEST

from course_lib import checking
from course_lib.zero import cases as zero_check
from course_lib.zero.cases import range_problem, reference_range

# One worker runs the module's tests one after another. Handed out among the others (conftest orders the
# slow tests longest first, across modules), a worker came back to this module again and again, and each time
# pytest set up its module fixture anew (the batch check of the solution, starter and faulty files):
# 14 times in one run of the checker tests on 4 workers.
pytestmark = pytest.mark.xdist_group("zero_checker")

SOLUTION = ROOT / "solutions" / "09_zero" / "zero.py"
EXERCISE = ROOT / "exercises" / "09_zero" / "zero.py"
FOLDER = ROOT / "tests" / "zero_faulty"


def verdicts(report):
    return {v.item: v for v in report.verdicts}


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_solution_passes_with_state_about_one_over_w(request, world):
    if world == 2:    # in the batch
        report = request.getfixturevalue("batch")["solution"][1]
    else:
        report = zero_check.check(str(SOLUTION), world_sizes=(world,))
        print(report.text())
    assert report.passed, report.text()
    assert [v.item for v in report.verdicts] == list(zero_check.ITEMS)
    for stage in ("ZeRO-1", "ZeRO-2"):
        msg = verdicts(report)[stage].message
        assert "on your own collectives: no torch collective ran in step()" in msg, msg
        state = re.search(r"AdamW state on rank 0 / DDP's: (.*?); held", msg).group(1)
        ratios = {int(w): float(r) for w, r in re.findall(r"W=(\d): ([\d.]+)", state)}
        assert set(ratios) == {world}, msg     # 101 parameters: rank 0 owns floor(101 / W) of them
        assert abs(ratios[world] - (101 // world) / 101) < 0.01, msg
        # measured: what rank 0 holds beyond the parameters, and sends, within ZeRO's counts
        assert re.search(rf"held on rank 0 after step\(\) beyond the parameters: W={world}: [\d,]+ B; sent by rank 0 "
                         rf"in one step\(\): W={world}: [\d,]+ B", msg), msg
        assert ("only W=2 ran: see reduce_scatter" in msg) == (world == 2), msg


# Checked alone: a hang stops its launch (check relaunches after it); a load error ends check early.
ALONE = {"all_gather_blocking_send", "syntax_error"}
FOUR = {"world_sizes": (4,)}
BATCH4 = [c for c in CASES if c.options == FOUR]          # only W=4 shows them: checked together, in one launch
BATCH = [c for c in CASES if c.name not in ALONE and c.options != FOUR] + HONEST


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """{case name, "solution" or "starter": (path, report)} from one check_many run on W=2."""
    assert all(c.options == {"world_sizes": (2,)} for c in BATCH), "a batched case needs options of its own"
    # copies, not the repository's files: a notebook test on the other xdist worker may check those same paths at
    # the same time, and "nothing survives" looks for processes by path
    own = [tmp_path_factory.mktemp(name) / "zero.py" for name in ("solution", "starter")]
    for copy, original in zip(own, (SOLUTION, EXERCISE)):
        copy.write_text(original.read_text())
    paths = own + [c.write(SOLUTION, FOLDER, tmp_path_factory.mktemp(c.name)) for c in BATCH]
    reports = checking.check_many("zero", paths, world_sizes=(2,))
    for path, report in zip(paths, reports):
        print(report.text())
        assert not live_processes(str(path)), f"a worker process for {path} survived the check"
    return dict(zip(["solution", "starter"] + [c.name for c in BATCH], zip(paths, reports)))


@pytest.fixture(scope="module")
def batch4(tmp_path_factory):
    """{case name: (path, report)} of the W=4 cases, from one check_many run on W=4."""
    paths = [c.write(SOLUTION, FOLDER, tmp_path_factory.mktemp(c.name)) for c in BATCH4]
    reports = checking.check_many("zero", paths, world_sizes=(4,))
    for path, report in zip(paths, reports):
        print(report.text())
        assert not live_processes(str(path)), f"a worker process for {path} survived the check"
    return dict(zip([c.name for c in BATCH4], zip(paths, reports)))


@pytest.mark.slow
def test_starter_fails_every_piece(batch):
    report = batch["starter"][1]
    got = verdicts(report)
    assert set(got) == set(zero_check.ITEMS), report.text()
    assert all(v.result == "fail" for v in got.values()), report.text()
    assert re.search(r"not written yet: shard_range: split range\(n\) .*\(zero\.py line", got["shard_range"].message)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_faulty_named_with_reason_and_nothing_survives(request, tmp_path, case):
    if case.name in ALONE:
        path = case.write(SOLUTION, FOLDER, tmp_path)
        report = zero_check.check(str(path), **case.options)
    else:
        path, report = request.getfixturevalue("batch4" if case.options == FOUR else "batch")[case.name]
    print(report.text())
    case.assert_reported(report, path.read_text(), re.S)
    assert not live_processes(str(path)), "a worker process survived the check"


@pytest.mark.slow
@pytest.mark.parametrize("case", HONEST, ids=ids(HONEST))
def test_right_values_pass_with_a_verdict_that_says_what_ran(batch, case):
    """Not faulty in its values: the verdict must not claim what did not happen (own collectives, W=4)."""
    path, report = batch[case.name]
    got = verdicts(report)
    for item, (result, pattern) in case.expect.items():
        assert got[item].result == result and re.search(pattern, got[item].message, re.S), report.text()


@pytest.mark.slow
def test_wrong_direction_ring_fails_at_w4(tmp_path):
    case = next(c for c in HONEST if c.name == "all_gather_wrong_direction")
    report = zero_check.check(str(case.write(SOLUTION, FOLDER, tmp_path)), world_sizes=(4,))
    got = verdicts(report)
    assert got["all_gather"].result == "fail" and "only W=" not in got["all_gather"].message, report.text()
    assert got["reduce_scatter"].result == "pass", report.text()


def test_every_case_applies():
    for case in CASES + HONEST:
        case.source(SOLUTION, FOLDER)   # each edit's old text occurs exactly once in the solution


def test_range_problem_names_the_mistake():
    assert range_problem(reference_range, 10, 4) is None
    chunk_like = lambda n, r, w: (min(n, r * -(-n // w)), min(n, (r + 1) * -(-n // w)))   # noqa: E731 (torch.chunk)
    assert range_problem(chunk_like, 5, 4) is None
    assert "belong to no rank (n is not divisible by W" in range_problem(
        lambda n, r, w: (r * (n // w), (r + 1) * (n // w)), 10, 4)
    assert "a gap" in range_problem(lambda n, r, w: (r * 3, r * 3 + 2), 6, 2)
    assert "longer than ceil(n/W)" in range_problem(lambda n, r, w: (0, n) if r == 0 else (n, n), 6, 2)


def test_cli_finds_the_exercise(tmp_path):
    missing = subprocess.run([sys.executable, "-m", "course_lib.cli", "check", "zero", str(tmp_path / "nope.py")],
                             capture_output=True, text=True, cwd=ROOT)
    assert missing.returncode == 2 and "no such file" in missing.stderr, missing.stdout + missing.stderr
