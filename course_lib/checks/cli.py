"""Check a learner's exercise file: ``course check ddp|allreduce|tp PATH``.

Prints one verdict per step or function and exits 1 when anything fails (2 when the file is missing).
"""
from __future__ import annotations

import importlib
import json
from pathlib import Path

EXERCISES = {"ddp": "course_lib.checks.ddp", "allreduce": "course_lib.checks.allreduce", "tp": "course_lib.checks.tp"}


def check(exercise: str, path, **kwargs):
    """Run the checker of ``exercise`` on ``path``; returns a course_lib.checks.report.Report."""
    return importlib.import_module(EXERCISES[exercise]).check(str(path), **kwargs)


def add_arguments(p):
    p.add_argument("exercise", choices=sorted(EXERCISES))
    p.add_argument("path", help="the learner's file, e.g. exercises/02_ddp/mnist_classify_ddp.py")
    p.add_argument("--timeout", type=float, default=None, help="deadline in seconds for each multi-process run")
    p.add_argument("--json", action="store_true", help="print the verdicts as JSON")


def run(args) -> int:
    if not Path(args.path).is_file():
        print(f"no such file: {args.path} (give the path of your exercise file)")
        return 2
    kwargs = {} if args.timeout is None else {"timeout": args.timeout}
    report = check(args.exercise, args.path, **kwargs)
    print(json.dumps(report.rows(), indent=1) if args.json else report.text())
    return 0 if report.passed else 1
