"""``course grade``: a class's learners found (discover), each check run in a sandbox (sandbox, with cgroups and
sandbox_worker), on a pool here (run) or as a Slurm job array (array), then grades.csv, scores.csv,
grades.md, feedback/ and the exports (reports, scores, feedback); cli is the command, docs/grading.md the guide.
"""
from course_lib.grading.discover import MAX_FILE, Learner, discover, precheck
from course_lib.grading.reports import md_name, read_rows, write_reports
from course_lib.grading.sandbox import Limits, Outcome

__all__ = ["MAX_FILE", "Learner", "discover", "precheck", "md_name", "read_rows", "write_reports", "Limits", "Outcome"]
