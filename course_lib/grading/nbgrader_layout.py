"""nbgrader's layout and gradebook (docs/grading.md, "nbgrader's layout and gradebook"): its course folder or
``submitted/`` taken as it is (student id = learner; the folder that held an exercise's file is its assignment),
and ``--nbgrader-db``: each score into ``gradebook.db`` through nbgrader's own ``Gradebook`` API.
"""
import os
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from course_lib.grading.scores import by_learner, exercise_score

NBGRADER_MARKS = ("nbgrader_config.py", "gradebook.db", "source", "release", "autograded")
CELL = "checks"


def submitted_folder(subs: Path) -> tuple[Path, str]:
    """(the folder holding one entry per learner, a note): nbgrader's course folder leads to its submitted/."""
    inner = subs / "submitted"
    if inner.is_dir() and any((subs / m).exists() for m in NBGRADER_MARKS):
        return inner, "nbgrader course folder: grading its `submitted/` (student id = learner)"
    if subs.name == "submitted":
        return subs, "nbgrader's `submitted/` folder (student id = learner)"
    return subs, ""


def assignment_names(learners, exercises: list[str]) -> dict[str, str]:
    """exercise -> the nbgrader assignment: the folder (under each student's) that most learners put it in."""
    names = {}
    for ex in exercises:
        seen = Counter()
        for lr in learners:
            f = lr.found.get(ex)
            if f is not None and f.seen is not None and lr.folder is not None:
                rel = f.seen.relative_to(lr.folder).parts if f.seen.is_relative_to(lr.folder) else ()
                if len(rel) > 1:
                    seen[rel[0]] += 1
        names[ex] = seen.most_common(1)[0][0] if seen else ex
    return names


def scores(rows: list[dict]) -> dict[tuple[str, str], float]:
    """(learner, exercise) -> its ``exercise_score``; one with nothing judged (every check skipped) is left out."""
    got = {(name, ex): exercise_score(ex_rows) for name, own in by_learner(rows).items()
           for ex, ex_rows in own.items()}
    return {key: score for key, score in got.items() if score is not None}


@contextmanager
def _gradebook(db: Path):
    """nbgrader's Gradebook, with this environment's bin/ on PATH: nbgrader runs the ``alembic`` command to learn
    its schema version, and a venv's commands are not on PATH unless the venv was activated."""
    from nbgrader.api import Gradebook

    old = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), old])
    try:
        with Gradebook(f"sqlite:///{db.resolve()}") as gb:
            yield gb
    finally:
        os.environ["PATH"] = old


def write_gradebook(db: Path, rows: list[dict], assignments: dict[str, str]) -> int:
    """Write every (learner, exercise) score into nbgrader's gradebook at ``db``; how many were written."""
    got = scores(rows)
    with _gradebook(db) as gb:
        for ex, assignment in assignments.items():
            gb.update_or_create_assignment(assignment)
            gb.update_or_create_notebook(ex, assignment)
            gb.update_or_create_grade_cell(CELL, ex, assignment, max_score=1.0, cell_type="code")
        for (learner, ex), score in sorted(got.items()):
            if ex not in assignments:
                continue
            gb.update_or_create_student(learner)
            gb.update_or_create_submission(assignments[ex], learner)
            grade = gb.find_grade(CELL, ex, assignments[ex], learner)
            grade.auto_score = score
            gb.db.commit()
    return len(got)


def read_gradebook(db: Path, assignments: dict[str, str]) -> dict[tuple[str, str], float]:
    """(learner, exercise) -> score, read back from the gradebook (what an instructor's nbgrader shows)."""
    out = {}
    with _gradebook(db) as gb:
        for ex, assignment in assignments.items():
            for sub in gb.find_assignment(assignment).submissions:
                for nb in sub.notebooks:
                    if nb.name == ex:
                        out[sub.student.id, ex] = nb.score
    return out
