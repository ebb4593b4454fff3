"""A check run here, by its overall deadline: the sum of its launches' own deadlines plus a margin.

The checker runs in the caller's thread (a second thread that stopped the check at its deadline made papermill
stall in CI; commit 5a647d9). The deadline holds because every launch inside ``course_lib.runtime.scope.scope`` ends
by it, each at min(its own timeout, what is left), and the check's runs stay on this machine: where a check runs is
the site's ``checks``. A run cut short by the deadline makes the report's first row a "check run" FAIL that says
so. ``course check`` here and a check job on Slurm (course_lib.check_slurm) both run a check through here.
"""
from __future__ import annotations

import math
import os

from course_lib.registry import EXERCISES, get
from course_lib.runtime.scope import scope

MARGIN = 60.0       # seconds beyond the launches' own deadlines: the fork server's start, stopping ranks
# launches one after the other, at most, of the checkers that are not run by course_lib.checking.check, each with
# its own ``timeout`` (default): the registry's ``rounds`` (ddp: the launches side by side, then up to two simulated
# ones again with the style that worked; ckpt: the cases, then the resume runs; sbatch: the job as a whole)
ROUNDS = {e.name: e.rounds for e in EXERCISES.values() if e.rounds}


def check_here(exercise: str, path, seconds: float, **kwargs):
    """The Report of ``exercise``'s checker on ``path``, by ``seconds`` from now."""
    with scope(seconds, engine="local") as bound:
        report = get(exercise).check(path, **kwargs)
    if bound.cut:
        _cut_short(report, seconds)
    return report


def _cut_short(report, seconds: float) -> None:
    """A "check run" FAIL first: the check's overall deadline, not the learner's code, stopped a run."""
    report.add("check run", False, f"no verdict within the check's deadline of {seconds:.0f} s: the runs still "
               f"going then were stopped (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores), so a "
               "run said to time out or hang below may not be your code's doing. Check again when the machine is "
               "less busy; tell your instructor if it happens again")
    report.verdicts.insert(0, report.verdicts.pop())


def overall_deadline(exercise: str, options: dict) -> float:
    """Seconds the local check of ``exercise`` with these options may take: its launches' deadlines one after the
    other (for course_lib.checking: ceil(world sizes / PARALLEL) x ``timeout``), plus MARGIN."""
    entry = get(exercise)
    if entry.cases and exercise not in ROUNDS:
        from course_lib.checking import settings
        spec, timeout, _, worlds = settings(exercise, options.get("timeout"), options.get("case_timeout"),
                                            options.get("world_sizes"))
        return math.ceil(len(worlds) / spec.PARALLEL) * timeout + MARGIN
    rounds, default = ROUNDS[exercise]
    if not options.get("resume", True):     # ckpt: the cases alone, without the resume runs
        rounds = 1
    return rounds * (options.get("timeout") or default) + MARGIN
