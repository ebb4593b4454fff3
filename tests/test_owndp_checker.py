"""`course check ownddp`: the solution passes on W=2 and 3, the starter fails every variant, each faulty submission
(tests/owndp_faulty/cases.py) is named right and nothing survives. Every run is real: gloo processes, the learner's
hooks and async all-reduces, a single-process run as the reference.

The starter and most faulty submissions are checked together, on W=2, in one launch (``check_many``). The
solution (W=2 and 3), a submission that hangs and one that does not load go through ``check`` alone, the path a
learner's file takes."""
import re

import pytest
from conftest import ROOT, live_processes
from faulty import ids
from owndp_faulty.cases import CASES

from course_lib import checking, registry
from course_lib.owndp import cases as owndp_check
from course_lib.owndp.cases import CAPS, TIED_CAP, plain_model, reference_buckets, tied_model

# One worker runs the module's tests one after another. Handed out among the others (conftest orders the
# slow tests longest first, across modules), a worker came back to this module again and again, and each time
# pytest set up its module fixture anew (the batch check of the starter and faulty files):
# 10 times in one run of the checker tests on 4 workers.
pytestmark = pytest.mark.xdist_group("owndp_checker")

SOLUTION = ROOT / "solutions" / "10_own_ddp" / "own_ddp.py"
EXERCISE = ROOT / "exercises" / "10_own_ddp" / "own_ddp.py"
FOLDER = ROOT / "tests" / "owndp_faulty"
ALONE = {"rank0_only_reduce", "syntax_error"}
BATCH = [c for c in CASES if c.name not in ALONE]
STRIDED = ("            for p in module.parameters():\n"
           "                if p.dim() == 2:\n"
           "                    p.data = p.data.t().contiguous().t()\n")


def verdicts(report):
    return {v.item: v for v in report.verdicts}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """{case name, "starter" or "from_import": (path, report)} from one check_many run on W=2."""
    assert all(c.options == {"world_sizes": (2,)} for c in BATCH), "a batched case needs options of its own"
    starter = tmp_path_factory.mktemp("starter") / "own_ddp.py"   # a copy: notebook tests may check the original
    starter.write_text(EXERCISE.read_text())
    # the solution with `from torch.distributed import all_reduce`: a name bound before the checker's recorder exists
    from_import = tmp_path_factory.mktemp("from_import") / "own_ddp.py"
    line = "import torch.distributed as dist\n"
    from_import.write_text(SOLUTION.read_text().replace("dist.all_reduce(", "all_reduce(").replace(
        line, line + "from torch.distributed import all_reduce\n"))
    # the solution with every matrix kept transposed in memory: right, with parameters that are not contiguous
    strided = tmp_path_factory.mktemp("strided") / "own_ddp.py"
    line = "                dist.broadcast(t, src=0)\n"
    strided.write_text(SOLUTION.read_text().replace(line, line + STRIDED))
    paths = [starter, from_import, strided] + [c.write(SOLUTION, FOLDER, tmp_path_factory.mktemp(c.name))
                                               for c in BATCH]
    reports = checking.check_many("ownddp", paths, world_sizes=(2,))
    for path, report in zip(paths, reports):
        print(report.text())
        assert not live_processes(str(path)), f"a worker process for {path} survived the check"
    return dict(zip(["starter", "from_import", "strided"] + [c.name for c in BATCH], zip(paths, reports)))


@pytest.mark.slow
def test_solution_passes_on_two_and_three_ranks(tmp_path):
    path = tmp_path / "own_ddp.py"
    path.write_text(SOLUTION.read_text())
    report = owndp_check.check(str(path))
    print(report.text())
    assert report.passed, report.text()
    assert [v.item for v in report.verdicts] == list(owndp_check.ITEMS)
    assert all(v.message.startswith("W=2, 3: equals one process") for v in report.verdicts), report.text()
    assert not live_processes(str(path))


@pytest.mark.slow
def test_starter_fails_every_variant(batch):
    report = batch["starter"][1]
    got = verdicts(report)
    assert set(got) == set(owndp_check.ITEMS), report.text()
    assert all(v.result == "fail" and re.search(r"not written yet: \w.*\(own_ddp\.py line", v.message)
               for v in got.values()), report.text()


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_faulty_named_with_reason_and_nothing_survives(request, tmp_path, case):
    if case.name in ALONE:
        path = case.write(SOLUTION, FOLDER, tmp_path)
        report = owndp_check.check(str(path), **case.options)
    else:
        path, report = request.getfixturevalue("batch")[case.name]
    print(report.text())
    case.assert_reported(report, path.read_text(), re.S)
    assert not live_processes(str(path)), "a worker process survived the check"


@pytest.mark.slow
def test_parameters_that_are_not_contiguous_pass(batch):
    """The checker compares values, however the learner's code lays them out in memory (it once ``view``ed them)."""
    path, report = batch["strided"]
    assert STRIDED in path.read_text()
    assert report.passed, report.text()


@pytest.mark.slow
def test_all_reduce_imported_by_name_is_seen(batch):
    path, report = batch["from_import"]
    assert "from torch.distributed import all_reduce" in path.read_text()
    assert report.passed, report.text()


def test_every_case_applies():
    for case in CASES:
        case.source(SOLUTION, FOLDER)   # each edit's old text occurs exactly once in the solution


def test_bucket_caps_give_one_two_and_three_buckets():
    sizes = [p.numel() for p in plain_model(0).parameters()]
    assert {n: len(reference_buckets(sizes, cap)) for n, cap in CAPS.items()} == {1: 1, 2: 2, 3: 3}
    assert reference_buckets(sizes, CAPS[3]) == [27, 104, 72]       # the last layer's parameters first
    tied = [p.numel() for p in tied_model(0).parameters() if p.requires_grad]
    assert reference_buckets(tied, TIED_CAP) == [27, 36, 66]        # the first holds the unused layer


def test_registry_knows_the_exercise():
    ex = registry.get("ownddp")
    assert (ROOT / "solutions" / ex.file).is_file() and (ROOT / "exercises" / ex.file).is_file()
    assert registry.guess("own_ddp.py", None) == ("ownddp", "its name")
    assert registry.guess("mine.py", SOLUTION.read_text()) == ("ownddp", "what it defines")
    assert registry.guess("mnist_classify_ddp.py", None)[0] == "ddp"


@pytest.mark.slow
def test_course_grade_grades_the_exercise(tmp_path):
    """A made-up class of two: the starter in a copy of exercises/, and the starter handed in as one file whose name
    says which exercise it is. Both are found through the registry and fail with the checker's reason."""
    import csv
    import os
    import subprocess
    import sys
    subs = tmp_path / "subs"
    (subs / "bob" / "10_own_ddp").mkdir(parents=True)
    # a line of their own: the released starter handed in unchanged is not run at all (course_lib.grading)
    started = EXERCISE.read_text() + "\nSEED = 0   # a line of the learner's own\n"
    (subs / "bob" / "10_own_ddp" / "own_ddp.py").write_text(started)
    (subs / "frank_own_ddp.py").write_text(started)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "course_lib.cli", "grade", str(subs), "--out", str(tmp_path / "out"),
                        "--exercise", "ownddp"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    print(p.stdout, p.stderr)
    assert p.returncode == 0, p.stdout + p.stderr      # graded (the grades say the work failed)
    assert "bob / ownddp: 0/4 passed" in p.stdout and "frank_own_ddp / ownddp: 0/4 passed" in p.stdout, p.stdout
    with open(tmp_path / "out" / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    got = {(r["learner"], r["item"]): r for r in rows}
    for learner in ("bob", "frank_own_ddp"):
        for item in owndp_check.ITEMS:
            row = got[(learner, item)]
            assert row["exercise"] == "ownddp" and row["result"] == "fail", rows
            assert re.search(r"not written yet: \w.*\(own_ddp\.py line", row["message"]), rows
