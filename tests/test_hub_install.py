"""A graded workshop's install (issue 55): learners cannot read any solution, instructors and their tools can.

scripts/hub/withhold-solutions.sh (shared-install.sh runs it with SOLUTIONS_GROUP) on a copy of the course laid out
and opened as shared-install.sh leaves it, then two learner accounts and an instructor of the group read it.
Root only (it makes accounts and changes owners); it needs no hub.
"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import hub_support as hs
import pytest
from conftest import ROOT

ENV = hs.course_as_others()
if isinstance(ENV, str):
    pytest.skip(ENV, allow_module_level=True)
# one worker makes the accounts (two at once would race in useradd); a few seconds: slow
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hub_install")]
LEARNERS = ("hubwithheld1", "hubwithheld2")
TEACHER, STAFF = "hubteacher1", "hubstaff"
READABLE = {"answers", "01_serial"}      # what every learner's kernel reads: quiz keys, the serial script


@pytest.fixture(scope="module")
def course():
    """A course folder as shared-install.sh leaves it (root's, a+rX, go-w), with the solutions withheld."""
    for name in LEARNERS:
        hs.account(name)
    hs.account(TEACHER, STAFF)
    prefix = Path(tempfile.mkdtemp(prefix="course-withheld-", dir="/tmp"))
    try:
        junk = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "*.pyc")
        for tree in ("notebooks", "exercises", "solutions", "tests"):
            shutil.copytree(ROOT / tree, prefix / "course" / tree, ignore=junk)
        subprocess.run(["chmod", "-R", "a+rX,go-w", str(prefix)], check=True)
        p = subprocess.run(["bash", str(ROOT / "scripts/hub/withhold-solutions.sh"), str(prefix / "course"), STAFF],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        yield prefix / "course"
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


READ_ALL = """
import os, sys
readable, refused = [], []
for top in sys.argv[1:]:
    for folder, dirs, files in os.walk(top, onerror=lambda e: refused.append(e.filename)):
        for name in files:
            path = os.path.join(folder, name)
            try:
                open(path, "rb").read(1)
                readable.append(path)
            except PermissionError:
                refused.append(path)
print("\\n".join(["R " + p for p in readable] + ["X " + p for p in refused]))
"""


def _reads(name: str, *folders: Path) -> tuple[set, set]:
    """The files ``name`` can read under ``folders``, and the paths refused to them."""
    p = hs.run_as(name, [hs.SYSTEM_PYTHON, "-c", READ_ALL, *folders])
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    return {x[2:] for x in lines if x[:2] == "R "}, {x[2:] for x in lines if x[:2] == "X "}


def test_learners_cannot_read_a_solution(course):
    solutions = course / "solutions"
    withheld = [d for d in solutions.iterdir() if d.name not in READABLE]
    assert len(withheld) >= 10, withheld      # every exercise's folder (02_ddp ... 10_own_ddp)
    for name in LEARNERS:
        readable, refused = _reads(name, solutions, course / "tests", course / "exercises")
        leaked = sorted(p for p in readable if not p.startswith(str(course / "exercises"))
                        and Path(p).relative_to(solutions).parts[0] not in READABLE)
        assert not leaked, f"{name} can read {leaked[:5]}"
        assert {str(d) for d in withheld} | {str(course / "tests")} <= refused, refused
        assert str(course / "exercises" / "05_allreduce" / "allreduce.py") in readable
        assert str(solutions / "answers" / "02.toml") in readable
        # nor by a path learned elsewhere (the folder cannot be listed, the file still cannot be opened)
        got = hs.run_as(name, ["cat", solutions / "05_allreduce" / "allreduce.py"])
        assert got.returncode != 0 and "Permission denied" in got.stderr, got


def test_instructors_and_the_grading_tools_still_read_them(course):
    readable, refused = _reads(TEACHER, course / "solutions", course / "tests")
    assert not refused and str(course / "solutions" / "05_allreduce" / "allreduce.py") in readable
    # the tools, as the instructor: `course release --check` reads every solution, the grader's starters too
    env = {"COURSE_HOME": str(course), **ENV}
    as_root = subprocess.run([sys.executable, "-m", "course_lib.cli", "release", "--check"], capture_output=True,
                             text=True, timeout=300, cwd="/tmp", env=dict(os.environ, COURSE_HOME=str(course)))
    teacher = hs.run_as(TEACHER, [hs.SYSTEM_PYTHON, "-m", "course_lib.cli", "release", "--check"], env)
    assert "exercise files up to date" in teacher.stdout and "Error" not in teacher.stderr, teacher
    assert (teacher.returncode, teacher.stdout) == (as_root.returncode, as_root.stdout)
    count = [hs.SYSTEM_PYTHON, "-c",
             "from course_lib.grading.starters import starters; print(len(starters('allreduce')))"]
    # the instructor's grader knows the --no-hints starter (read from solutions/); a learner's only exercises/'s
    assert hs.run_as(TEACHER, count, env).stdout.strip() == "2"
    assert hs.run_as(LEARNERS[0], count, env).stdout.strip() == "1"

