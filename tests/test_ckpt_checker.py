"""`course check ckpt`: the solution passes, the starter fails where it is unfinished, each faulty submission is
named at the right piece with the right reason (tests/ckpt_faulty/cases.py), and nothing is left running.

Every run is real: 2 gloo ranks for the pieces, the real torchrun with --max-restarts 1 for "resume".
"""
import subprocess
import sys

import pytest
from ckpt_faulty.cases import CASES, RIGHT, RIGHT_BYTES
from conftest import ROOT
from faulty import Faulty, assert_every_case_applies, ids

from course_lib.ckpt import cases as ckpt_check

SOLUTION = ROOT / "solutions" / "08_checkpoint" / "snapshot.py"
EXERCISE = ROOT / "exercises" / "08_checkpoint" / "snapshot.py"
FOLDER = ROOT / "tests" / "ckpt_faulty"


def verdicts(report):
    return {v.item: v for v in report.verdicts}


@pytest.mark.slow
def test_solution_passes_every_item():
    report = ckpt_check.check(str(SOLUTION))
    assert report.passed, report.text()
    assert [v.item for v in report.verdicts] == list(ckpt_check.ITEMS)
    assert "all 24 steps equal" in verdicts(report)["resume"].message, report.text()
    print("\n" + report.text())


@pytest.mark.slow
def test_starter_passes_what_it_does_and_fails_the_rest():
    report = ckpt_check.check(str(EXERCISE), resume=False)
    got = verdicts(report)
    assert set(got) == set(ckpt_check.ITEMS) - {"resume"}, report.text()
    # the starter saves the weights from rank 0, straight onto the file, and nothing else
    assert got["model"].result == "pass" and got["rank 0 writes"].result == "pass", report.text()
    for item in ("optimizer", "scheduler", "position", "RNG states", "atomic write"):
        assert got[item].result == "fail", report.text()
    assert "returned (epoch=1, step=0)" in got["position"].message


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_faulty_named_with_reason_and_nothing_survives(tmp_path, case):
    case.assert_checked(ckpt_check.check, SOLUTION, FOLDER, tmp_path)


@pytest.mark.slow
def test_right_in_another_style_passes(tmp_path):
    """A random draw before the generators are taken, tempfile.mkstemp, pathlib's replace, a barrier at the end of
    every rank's save (the rank left waiting when its partner dies in the crash test is no fault): all right."""
    path = Faulty("right", {}, edits=RIGHT).write(SOLUTION, FOLDER, tmp_path)
    report = ckpt_check.check(str(path), resume=False)
    assert report.passed, report.text()


@pytest.mark.slow
def test_bytes_written_then_renamed_passes(tmp_path):
    """Serialised into a BytesIO, the bytes written to path.tmp, flushed, fsynced and renamed: the crash comes at that
    write, not only at a torch.save into a file, and the restart after it loads the old snapshot."""
    path = Faulty("right_bytes", {}, edits=RIGHT_BYTES).write(SOLUTION, FOLDER, tmp_path)
    report = ckpt_check.check(str(path), resume=False)
    assert report.passed, report.text()
    assert "a restart's load_snapshot went on from it" in verdicts(report)["atomic write"].message, report.text()


def test_every_case_applies():
    assert_every_case_applies(CASES, SOLUTION, FOLDER)


def test_cli_says_no_such_file(tmp_path):
    p = subprocess.run([sys.executable, "-m", "course_lib", "check", "ckpt", str(tmp_path / "nope.py")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2 and "no such file" in p.stderr


def test_grade_recognises_a_stray_checkpoint_file():
    """`course grade` names a lone file by the registry's rules: a checkpoint file is not taken for the DDP one."""
    from course_lib import registry
    assert registry.guess("snapshot.py", None)[0] == "ckpt"
    assert registry.guess("ddp_ckpt.py", None)[0] == "ckpt"          # it checkpoints a DDP training
    assert registry.guess("mnist_classify_ddp.py", None)[0] == "ddp"
    mine = "from torch.nn.parallel import DistributedDataParallel\n\ndef save_snapshot(path, model):\n    pass\n"
    assert registry.guess("lab.py", mine) == ("ckpt", "what it defines")
    assert registry.guess("lab.py", SOLUTION.read_text()) == ("ckpt", "what it defines")
    assert registry.guess("lab.py", (ROOT / "solutions/02_ddp/mnist_classify_ddp.py").read_text())[0] == "ddp"
