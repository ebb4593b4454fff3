"""Gradescope's autograder for the course: the bundle (``course release gradescope DIR``) and what it runs
(docs/grading.md, "Exports"). ``run_autograder`` copies ``/autograder/submission`` as one learner's folder and
grades it with ``course grade`` itself (same sandbox, limits and rows), whose Gradescope export becomes
``results/results.json``; where grading fails, a results.json with score 0 says so.
"""
import argparse
import json
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from course_lib.core.atomic import write_text
from course_lib.core.paths import course_root
from course_lib.grading.feedback import file_stem
from course_lib.grading.reports import Outputs
from course_lib.grading.run import grade
from course_lib.grading.sandbox import Limits
from course_lib.registry import EXERCISES

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu): Python, a virtual
# environment with PyTorch's CPU build and the course (its checkers) from /autograder/source/course.
set -euo pipefail
TORCH=${{TORCH:-{torch}}}
TORCH_INDEX=${{TORCH_INDEX:-https://download.pytorch.org/whl/cpu}}   # the CPU wheels: no CUDA packages
apt-get install -y --no-install-recommends python3 python3-venv python3-pip
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install --index-url "$TORCH_INDEX" "$TORCH"
/autograder/venv/bin/pip install /autograder/source/course
"""

RUN = """#!/usr/bin/env bash
# Gradescope runs this for every submission: grade /autograder/submission with the course's checkers
# ({exercises}) and write /autograder/results/results.json. AUTOGRADER_ROOT and COURSE_PYTHON stand in for
# /autograder and its venv's Python (to try the bundle elsewhere).
set -uo pipefail
ROOT=${{AUTOGRADER_ROOT:-/autograder}}
PY=${{COURSE_PYTHON:-$ROOT/venv/bin/python}}
export PYTHONPATH="$ROOT/source/course${{PYTHONPATH:+:$PYTHONPATH}}"
cd "$ROOT"
exec "$PY" -m course_lib.grading.autograder "$ROOT" --check-timeout 600 {exercises}
"""

COURSE_FILES = ("pyproject.toml", "README.md")
TORCH_PIN = "torch==2.13.0"


def write_bundle(dest: Path, exercises: list[str]) -> Path:
    """Write the bundle into ``dest`` (a new or empty folder) and ``dest/autograder.zip`` (what Gradescope takes)."""
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty: choose a new folder for the autograder bundle")
    root = course_root()
    dest.mkdir(parents=True, exist_ok=True)
    for name, text in (("setup.sh", SETUP.format(torch=TORCH_PIN)),
                       ("run_autograder", RUN.format(exercises=" ".join(exercises)))):
        write_text(dest / name, text)
        (dest / name).chmod(0o755)
    shutil.copytree(root / "course_lib", dest / "course" / "course_lib",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in COURSE_FILES:
        shutil.copyfile(root / name, dest / "course" / name)
    archive = dest / "autograder.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(dest.rglob("*")):
            if p.is_file() and p != archive:
                z.write(p, p.relative_to(dest))      # keeps the mode bits: run_autograder stays executable
    return archive


def _learner(root: Path) -> str:
    """The learner's name for the report: the submitter's e-mail from Gradescope's submission_metadata.json."""
    try:
        users = json.loads((root / "submission_metadata.json").read_text(encoding="utf-8"))["users"]
        return str(users[0].get("email") or users[0].get("name") or "submission")
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return "submission"


def _failed(results: Path, why: str) -> int:
    write_text(results, json.dumps({"score": 0.0, "visibility": "visible", "tests": [],
                                    "output": f"The autograder could not grade this submission ({why}). Your "
                                              "instructor sees the details; resubmit, or ask them."}, indent=1))
    print(f"autograder: {why}", file=sys.stderr)
    return 1


def run(root: Path, exercises: list[str], deadline: float) -> int:
    """Grade ``root/submission`` as one learner; ``root/results/results.json``. The exit code of the grading."""
    results = root / "results" / "results.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    name = _learner(root)
    with tempfile.TemporaryDirectory(prefix="course-autograder-") as tmp:
        subs, out = Path(tmp) / "subs", Path(tmp) / "out"
        try:
            shutil.copytree(root / "submission", subs / name, symlinks=True)
        except OSError as e:
            return _failed(results, f"the submission could not be read: {e}")
        (out / "logs").mkdir(parents=True)
        (Path(tmp) / "scratch").mkdir()
        code = grade(subs, out, exercises, Limits(deadline=deadline), 1, [], Path(tmp) / "scratch",
                     outputs=Outputs(("gradescope",)))
        made = out / "gradescope" / file_stem(name) / "results.json"
        if not made.is_file():
            return _failed(results, f"course grade ended with exit code {code} and wrote no results")
        shutil.copyfile(made, results)
        print((out / "grades.md").read_text(encoding="utf-8"))      # the instructors' view (stdout)
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m course_lib.grading.autograder")
    p.add_argument("root", type=Path, help="the autograder's folder (/autograder on Gradescope)")
    p.add_argument("exercises", nargs="+", choices=list(EXERCISES))
    p.add_argument("--check-timeout", type=float, default=600)
    args = p.parse_args(argv)
    return run(args.root, args.exercises, args.check_timeout)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
