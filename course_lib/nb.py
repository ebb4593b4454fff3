"""What every notebook of the course shares: where the files are, and how a check is shown.

Notebook protocol (papermill ``parameters`` cell in each notebook)::

    TREE = "exercises"                          # "solutions": run against the reference files
    QUICK = os.environ.get("COURSE_QUICK") == "1"   # small settings (CI, a first look)
    STRICT = False                              # True: a failing check stops the notebook (CI on solutions)
"""
from __future__ import annotations

from pathlib import Path

from course_lib.core.paths import tree_dir

TREES = ("exercises", "solutions")


def exercise_path(tree: str, relative: str) -> Path:
    """``exercise_path("exercises", "02_ddp/mnist_classify_ddp.py")`` -> the absolute path of that file."""
    if tree not in TREES:
        raise ValueError(f"TREE must be one of {TREES}, not {tree!r}")
    return tree_dir(tree) / relative


def show(report, strict: bool = False):
    """Display a check report (a table in Jupyter, text elsewhere); with ``strict`` a failure raises."""
    try:
        from IPython.display import display
        display(report)
    except ImportError:
        print(report.text())
    if strict and not report.passed:
        raise AssertionError("check failed (STRICT=True):\n" + report.text())
    return report
