"""A minimal checker for the grader's sandbox tests: runs the learner's file as 2 ranks, as real checkers do.

Real checkers (course_lib.checks.*) run learners' code through course_lib.runtime.launch, each rank in a session
of its own; this one does only that, so the sandbox tests do not depend on how long a real check takes.
"""
from course_lib.core.report import Report
from course_lib.runtime.launch import launch


def check(path: str, timeout: float = 60) -> Report:
    report = Report("demo", path)
    result = launch([path], nprocs=2, timeout=timeout)
    report.add("runs", result.ok, result.summary())
    return report
