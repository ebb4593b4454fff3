"""nbgrader's layout and gradebook: a course folder with submitted/<student>/<assignment>/ is graded as it is,
and the scores read back through nbgrader's own Gradebook API match grades.csv.

The checker is tests/grading_class/run_file_check.py (runs the file as 2 ranks: pass when it runs), so the
test takes seconds; the real checkers' verdicts are the class tests' business (test_grading.py).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from course_lib.grading import read_rows
from course_lib.grading.nbgrader_layout import read_gradebook, scores

pytest.importorskip("nbgrader", reason="nbgrader is a test dependency (pip install -e '.[test]')")



def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


@pytest.mark.slow   # a multi-process run: make test, not test-fast
def test_an_nbgrader_course_is_graded_and_its_gradebook_filled(tmp_path):
    course = tmp_path / "course"
    write(course / "nbgrader_config.py", "c = get_config()\n")
    write(course / "source" / "allreduce_lab" / "allreduce.py", "# the instructor's source\n")
    sub = course / "submitted"
    write(sub / "ann" / "allreduce_lab" / "allreduce.py", "print('ann runs')\n")
    write(sub / "ann" / "allreduce_lab" / "timestamp.txt", "2026-11-20 10:00:00.000000 UTC\n")
    write(sub / "anna" / "allreduce_lab" / "allreduce.py", "raise SystemExit('anna stops')\n")
    write(sub / "anna" / "allreduce_lab" / "timestamp.txt", "2026-11-20 11:00:00.000000 UTC\n")
    write(sub / "ben" / "allreduce_lab" / "timestamp.txt", "2026-11-20 12:00:00.000000 UTC\n")
    db, out = tmp_path / "gradebook.db", tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests" / "grading_class")]))
    p = subprocess.run([sys.executable, "-m", "course_lib.cli", "grade", str(course), "--out", str(out),
                        "--exercise", "allreduce", "--checker", "run_file_check", "--nbgrader-db", str(db),
                        "--timeout", "120"], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    print(p.stdout, p.stderr)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = read_rows(out / "grades.csv")
    assert [(r["learner"], r["result"]) for r in rows] == [("ann", "pass"), ("anna", "fail"), ("ben", "missing")]
    assert "nbgrader course folder" in (out / "grades.md").read_text()
    back = read_gradebook(db, {"allreduce": "allreduce_lab"})
    assert back == scores(rows) == {("ann", "allreduce"): 1.0, ("anna", "allreduce"): 0.0,
                                    ("ben", "allreduce"): 0.0}
    assert "allreduce -> allreduce_lab" in p.stdout
