"""An exercise nobody touched scores 0: the released starters of every exercise, graded, earn nothing (issue 55).

A starter runs, so its own code earned marks (the sbatch starter 3/7 read, 4/9 run: "ranks" passes with one
rank); now a file that is a starter, unchanged, is not run and every item is 0 with "not started".
"""
import csv
import shutil
import subprocess
import sys

from conftest import ROOT

from course_lib.grading import discover
from course_lib.grading.starters import normalised
from course_lib.registry import EXERCISES

COURSE = [sys.executable, "-m", "course_lib.cli"]


def _starters(dest, hints: bool = True):
    """A learner's folder holding every exercise's starter: the course's exercises/, or the --no-hints ones."""
    if hints:
        for ex in EXERCISES.values():
            (dest / ex.file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / "exercises" / ex.file, dest / ex.file)
        return
    p = subprocess.run([*COURSE, "release", "--no-hints", "--exercises", str(dest)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_every_untouched_starter_scores_zero(tmp_path):
    subs = tmp_path / "subs"
    _starters(subs / "untouched")
    _starters(subs / "hard", hints=False)
    # saved by an editor on Windows: CRLF, and a trailing blank line
    _starters(subs / "saved")
    for ex in EXERCISES.values():
        path = subs / "saved" / ex.file
        path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n") + b"\r\n")
    p = subprocess.run([*COURSE, "grade", str(subs), "--out", str(tmp_path / "out"), "--jobs", "2"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    print(p.stdout[-3000:], p.stderr[-3000:])
    assert p.returncode == 0, p.stdout + p.stderr
    with open(tmp_path / "out" / "scores.csv", newline="", encoding="utf-8") as f:
        scores = {r["learner"]: r for r in csv.DictReader(f)}
    assert set(scores) == {"untouched", "hard", "saved"}
    for learner, line in scores.items():
        assert {ex: line[ex] for ex in EXERCISES} == {ex: "0.0" for ex in EXERCISES}, (learner, line)
        assert line["total"] == "0.0" and line["max"] == str(len(EXERCISES)), line
    with open(tmp_path / "out" / "grades.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 * len(EXERCISES), "one row per learner and exercise: nothing was run"
    assert all((r["item"], r["result"]) == ("file", "fail") and r["message"].startswith("not started")
               for r in rows), rows


def test_a_started_file_is_graded(tmp_path):
    """One changed line, in any exercise, and the file is run as before; a starter is recognised wherever it lies."""
    subs = tmp_path / "subs"
    _starters(subs / "edited")
    for ex in EXERCISES.values():
        path = subs / "edited" / ex.file
        path.write_text(path.read_text(encoding="utf-8") + "# my first line\n", encoding="utf-8")
    flat = subs / "flat" / "exercises"
    flat.mkdir(parents=True)
    shutil.copyfile(ROOT / "exercises" / EXERCISES["tp"].file, flat / "tp (1).py")
    shutil.copyfile(ROOT / "exercises" / EXERCISES["allreduce"].file, subs / "frank_allreduce.py")
    (tmp_path / "scratch").mkdir()
    found, _ = discover(subs, list(EXERCISES), tmp_path / "scratch")
    by = {learner.name: learner.found for learner in found}
    assert all(f.path is not None and f.problem is None for f in by["edited"].values()), by["edited"]
    for learner, ex in (("flat", "tp"), ("frank_allreduce", "allreduce")):
        f = by[learner][ex]
        assert f.path is None and f.problem[0] == "fail" and f.problem[1].startswith("not started"), (learner, f)


def test_a_job_script_starter_written_for_another_site_is_still_the_starter(tmp_path, monkeypatch):
    """A hub's workspace (and nbgrader's release) writes the job script's site block for its site: still a starter."""
    from course_lib.grading.starters import is_starter
    from course_lib.instructor.workspace import course_bytes

    monkeypatch.setenv("COURSE_SITE", "example-gpu-cluster")
    copy = tmp_path / "ddp.sbatch"
    copy.write_bytes(course_bytes(ROOT / "exercises" / EXERCISES["sbatch"].file))
    assert "#SBATCH --partition=gpu" in copy.read_text()
    assert is_starter(copy, "sbatch")
    copy.write_text(copy.read_text().replace("# TODO: #SBATCH lines", "#SBATCH --nodes=1\n# TODO: #SBATCH lines"))
    assert not is_starter(copy, "sbatch")


def test_normalised_keeps_what_a_learner_typed():
    assert normalised("a = 1\r\nb = 2  \r\n\r\n") == normalised("a = 1\nb = 2\n") == "a = 1\nb = 2"
    assert normalised("a = 1\n    b = 2\n") != normalised("a = 1\nb = 2\n")


def test_without_the_course_sources_no_file_is_taken_for_a_starter(tmp_path, monkeypatch):
    """A Gradescope bundle has the course's package, not its sources: grading goes on, every file is run."""
    from course_lib.core import paths
    from course_lib.grading import starters

    monkeypatch.setenv("COURSE_HOME", str(tmp_path))
    paths.course_root.cache_clear()
    starters.starters.cache_clear()
    try:
        assert starters.starters("allreduce") == frozenset()
        assert not starters.is_starter(ROOT / "exercises" / EXERCISES["allreduce"].file, "allreduce")
    finally:
        monkeypatch.delenv("COURSE_HOME")
        paths.course_root.cache_clear()
        starters.starters.cache_clear()
