"""Grading a class: discover learners, run each check in a sandbox, write grades.csv and grades.md.

    discover    what each learner handed in, where (folders, zips, single files)
    reports     grades.csv, grades.md and the exports (Gradescope, LMS), written atomically; read_rows reads
                grades.csv back; scores: scores.csv
    feedback    feedback/<learner>.md and .html: one learner's rows, to hand back
    sandbox     run_check: one checker on one file, with a deadline, bounded output, limits, everything killed
    cgroups, sweep, sandbox_worker   the sandbox's parts: cgroup limits (v2 subtree, systemd scope, v1, chosen
                at run time), killing a check's processes, the worker process
    run         the class: a pool of checks, Ctrl-C and --resume
    array, array_task   the class as one Slurm job array (--engine slurm): submit, wait, merge; a task
    nbgrader_layout   nbgrader's submitted/<student>/<assignment>/ and its gradebook (--nbgrader-db)
    cli         ``course grade`` (its options and exit codes)
"""
from course_lib.grading.discover import MAX_FILE, Found, Learner, discover, guess_exercise, locate, precheck
from course_lib.grading.reports import md_name, outcome_rows, read_rows, summary_cell, write_reports
from course_lib.grading.run import grade
from course_lib.grading.sandbox import Limits, Outcome, run_check

__all__ = ["MAX_FILE", "Found", "Learner", "discover", "guess_exercise", "locate", "precheck", "md_name",
           "outcome_rows", "read_rows", "summary_cell", "write_reports", "grade", "Limits", "Outcome", "run_check"]
