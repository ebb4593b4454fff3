"""Check a learner's exercise file: ``course check ddp|allreduce|tp|ckpt PATH``.

Prints one verdict per step or function. Exit codes: 0 all passed, 1 something failed, 2 bad input
(no such file); errors go to stderr.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from course_lib.registry import EXERCISES, get


def check(exercise: str, path, **kwargs):
    """Run the checker of ``exercise`` on ``path``; returns a course_lib.core.report.Report."""
    return get(exercise).check(path, **kwargs)


def add_arguments(p):
    p.add_argument("exercise", choices=list(EXERCISES))
    p.add_argument("path", help="the learner's file, e.g. exercises/02_ddp/mnist_classify_ddp.py")
    p.add_argument("--timeout", type=float, default=None,
                   help="deadline in seconds for each multi-process run of the check")
    p.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    p.add_argument("--strict-launchers", action="store_true",
                   help="ddp, Step 6: the script must work under both srun and torchrun (default: under the "
                        "launcher it reads)")


def run(args) -> int:
    if not Path(args.path).is_file():
        print(f"course check: no such file: {args.path} (give the path of your exercise file)", file=sys.stderr)
        return 2
    kwargs = {} if args.timeout is None else {"timeout": args.timeout}
    if getattr(args, "strict_launchers", False):
        if args.exercise != "ddp":
            print("course check: --strict-launchers is for `course check ddp` only", file=sys.stderr)
            return 2
        kwargs["strict_launchers"] = True
    report = check(args.exercise, args.path, **kwargs)
    print(json.dumps(report.rows(), indent=1) if args.json else report.text())
    return 0 if report.passed else 1
