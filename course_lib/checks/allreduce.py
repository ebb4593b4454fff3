"""Checker for the allreduce exercise (being written)."""
from course_lib.checks.report import Report


def check(path: str, timeout: float = 120) -> Report:
    report = Report("allreduce", path)
    report.add("checker", False, "not written yet")
    return report
