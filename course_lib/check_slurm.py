"""``course check --engine slurm``: one check as a short Slurm job, so that a hub on a login node does not run
thirty learners' ranks itself.

The job is submitted through course_lib.jobs (``sbatch --test-only`` first; its folder
``<runs>/check-<exercise>-<job id>/`` holds job.sbatch and output.log) and runs ``python -m course_lib.check_slurm``:
that drops the job's Slurm variables as the grader's array tasks do (course_lib.runtime.slurm.forget_the_job), so
the check sees what it sees here, runs the same checker in the submitter's folder and writes ``report.json``
into the job's folder. The caller waits (in the queue at most ``queue_timeout`` seconds, then the job's time
limit), cancels the job at that deadline or on Ctrl-C, and rebuilds the Report from the JSON: the same
verdicts and text as a local check.
"""
import hashlib
import importlib
import inspect
import json
import math
import os
import sys
import time
from pathlib import Path

from course_lib import check_local, jobs
from course_lib.core.atomic import write_text
from course_lib.core.report import Report
from course_lib.jobs import SubmitError
from course_lib.registry import EXERCISES, get
from course_lib.runtime import runner, slurm
from course_lib.runtime.runner import JobError, say_on_stderr

REPORT_NAME = "report.json"
QUEUE_TIMEOUT = 900.0   # seconds a check may wait in the queue before it is cancelled
CHECK_DEADLINE = 600.0  # seconds for a whole check once it runs (the grader's --check-timeout default)
# the most ranks each checker runs at once: the registry's ``slurm_cpus``
RANKS = {e.name: e.slurm_cpus for e in EXERCISES.values()}
_REPORTS: dict = {}   # (exercise, file, its sha256, options) -> (a job's report of every step, when it was made)


class CheckJobError(JobError):
    """The check's job gave no report (refused, cancelled at the deadline, ended early); the message says why."""


def spec_for(exercise: str, path: str, options: dict, site, minutes: int):
    """The job: one task with a CPU per rank the check starts (at most a node's), ``minutes`` to run."""
    ranks = max(options.get("world_sizes") or [RANKS.get(exercise, 2)])
    if "more_ranks" in options:          # the DDP check: 2 ranks, and ``more_ranks`` in its last run
        ranks = max(2, options["more_ranks"] or 0)
    request = {"exercise": exercise, "path": path, "cwd": os.getcwd(), "options": options}
    # a check needs CPUs only: a site may send it to a CPU partition or QoS (check_partition, check_qos)
    return runner.spec(f"check-{exercise}", "course_lib.check_slurm", request, site, minutes, cpus=ranks,
                       partition=site.check_partition or None, qos=site.check_qos or None)


def submit(exercise: str, path, options: dict):
    """sbatch the check; the SlurmJob. SubmitError (Slurm's words) when Slurm refuses it."""
    site = jobs.load_site()
    try:
        options = json.loads(json.dumps(options))
    except TypeError as e:
        raise TypeError(f"a check run as a Slurm job takes options that JSON can hold: {e}") from None
    # the job's time limit: the whole check (longer when each run may take longer), plus 3 minutes to start,
    # as the grader's array tasks
    deadline = max(CHECK_DEADLINE, 3 * float(options.get("timeout") or 0))
    return slurm.submit(spec_for(exercise, str(path), options, site, math.ceil((deadline + 180) / 60)), site,
                        jobs.runs_dir())


def check_on_slurm(exercise: str, path, queue_timeout: float = QUEUE_TIMEOUT, say=say_on_stderr,
                   **options) -> Report:
    """Run ``course check EXERCISE PATH`` as a Slurm job; its Report. CheckJobError when it gives none.

    A checker with a ``cache`` (ddp) has the job's verdicts reused as it reuses its own: the job checks every step,
    ``steps=`` picks those shown, and a repeated call on the unchanged file with the same other options submits
    nothing (``cache=False``: a new job): notebook 02's seven check cells make one job, not seven."""
    checker = importlib.import_module(get(exercise).checker)
    if "cache" not in inspect.signature(checker.check).parameters:
        return _job_report(exercise, path, options, queue_timeout, say)
    steps, cache = options.pop("steps", None), options.pop("cache", True)
    file = Path(path).resolve()
    key = file.is_file() and (exercise, str(file), hashlib.sha256(file.read_bytes()).hexdigest(),
                              json.dumps(options, sort_keys=True, default=str))
    if cache and key in _REPORTS:
        full, ran_at = _REPORTS[key]
        return checker.shown(full, path, steps, ran_at)
    full = _job_report(exercise, path, options, queue_timeout, say)
    if key:
        _REPORTS[key] = full, time.time()
    return checker.shown(full, path, steps)

def _job_report(exercise: str, path, options: dict, queue_timeout: float, say) -> Report:
    try:
        job = submit(exercise, path, options)
    except SubmitError as e:
        here = 'the check here: --engine local (in Python: engine="local")'
        raise CheckJobError(runner.not_taken("check", e, here)) from None
    runner.wait(job, queue_timeout, say, error=CheckJobError)   # cancelled at the queue deadline or past its limit
    try:
        return Report.from_dict(json.loads((job.run_dir / REPORT_NAME).read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        raise CheckJobError(f"job {job.id} ended {job.state} (exit code {job.exit_code}) without a report; "
                            f"the last lines of {job.log_path}:\n" + (job.log(tail=15) or "(empty)")) from None


def main(argv: list[str]) -> int:
    """In the job: run the check the request names, in the submitter's folder; report.json into the job's."""
    request, folder = runner.become_the_job(argv)
    options = request["options"]
    os.environ[check_local.HELD] = "slurm"     # its CPUs are the job's: no slot of the node's to wait for
    report = check_local.check_here(request["exercise"], request["path"],
                                    check_local.overall_deadline(request["exercise"], options), **options)
    write_text(folder / REPORT_NAME, json.dumps(report.to_dict(), indent=1))
    print(report.text(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
