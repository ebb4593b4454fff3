"""A checker for the grader's tests of SKIPPED verdicts: one item judged (the file is valid Python), one that
could not be established here (as the job-script checker says of a run without Slurm)."""
import ast
from pathlib import Path

from course_lib.core.report import Report


def check(path: str, timeout: float = 60) -> Report:
    report = Report("demo", path)
    try:
        ast.parse(Path(path).read_text(encoding="utf-8"))
        report.add("parses", True, "valid Python")
    except SyntaxError as e:
        report.add("parses", False, f"line {e.lineno}: {e.msg}")
    report.skip("runs under Slurm", "no Slurm here: not run, not counted")
    return report
