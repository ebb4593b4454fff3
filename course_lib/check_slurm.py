"""``course check --engine slurm``: one check as a short Slurm job, so that a hub on a login node does not run
thirty learners' ranks itself.

The job is submitted through course_lib.jobs (``sbatch --test-only`` first; its folder
``<runs>/check-<exercise>-<job id>/`` holds job.sbatch and output.log) and runs ``python -m course_lib.check_slurm``:
that drops the job's Slurm variables as the grader's array tasks do (course_lib.jobs.slurm.forget_the_job), so
the check sees what it sees here, runs the same checker in the submitter's folder and writes ``report.json``
into the job's folder. The caller waits (in the queue at most ``queue_timeout`` seconds, then the job's time
limit), cancels the job at that deadline or on Ctrl-C, and rebuilds the Report from the JSON: the same
verdicts and text as a local check.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from course_lib.core.atomic import write_text
from course_lib.core.report import Report

REPORT_NAME = "report.json"
QUEUE_TIMEOUT = 900.0   # seconds a check may wait in the queue before it is cancelled
CHECK_DEADLINE = 600.0  # seconds for a whole check once it runs (the grader's --check-timeout default)
# the most ranks each checker runs at once
RANKS = {"ddp": 3, "allreduce": 5, "tp": 4, "ckpt": 2, "zero": 4, "ownddp": 3}
# what the job script exports for a training run; a check starts its own ranks, so it gets the submitter's values
JOB_ONLY = ("MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "SRUN_CPUS_PER_TASK")
POLL = 1.0              # seconds between two looks at the job


class CheckJobError(RuntimeError):
    """The check's job gave no report (refused, cancelled at the deadline, ended early); the message says why."""


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def spec_for(exercise: str, path: str, options: dict, site, minutes: int):
    """The job: one task with a CPU per rank the check starts (at most a node's), ``minutes`` to run."""
    from course_lib.jobs import JobSpec

    ranks = max(options.get("world_sizes") or [RANKS.get(exercise, 2)])
    if "more_ranks" in options:          # the DDP check: 2 ranks, and ``more_ranks`` in its last run
        ranks = max(2, options["more_ranks"] or 0)
    request = json.dumps({"exercise": exercise, "path": path, "cwd": os.getcwd(), "options": options,
                          "env": {k: os.environ[k] for k in JOB_ONLY if k in os.environ}})
    # launcher "python" runs `python -m course_lib.check_slurm REQUEST`: -m keeps course_lib/ off sys.path
    # a check needs CPUs only: a site may send it to a CPU partition or QoS (check_partition, check_qos)
    return JobSpec(name=f"check-{exercise}", script="-m", args=["course_lib.check_slurm", request],
                   launcher="python", cpus_per_task=max(1, min(ranks, site.cpus_per_node)), time=str(minutes),
                   partition=site.check_partition or None, qos=site.check_qos or None)


def submit(exercise: str, path, options: dict, site=None):
    """sbatch the check; the SlurmJob. SubmitError (Slurm's words) when Slurm refuses it."""
    from course_lib import jobs
    from course_lib.jobs import slurm

    site = site if isinstance(site, jobs.Site) else jobs.load_site(site)
    try:
        options = json.loads(json.dumps(options))
    except TypeError as e:
        raise TypeError(f"a check run as a Slurm job takes options that JSON can hold: {e}") from None
    # the job's time limit: the whole check (longer when each run may take longer), plus 3 minutes to start,
    # as the grader's array tasks
    deadline = max(CHECK_DEADLINE, 3 * float(options.get("timeout") or 0))
    spec = spec_for(exercise, str(path), options, site, math.ceil((deadline + 180) / 60))
    return slurm.submit(spec, site, jobs.runs_dir())


def _cancel(job, why: str) -> CheckJobError:
    state, reason = job.state, job.reason
    job.cancel()
    return CheckJobError(f"job {job.id} cancelled (scancel {job.id}): {why}; it was {state}"
                         + (f" (reason {reason})" if reason else "") + f", now {job.state}. Its folder: {job.run_dir}")


def wait(job, queue_timeout: float, say=_say) -> None:
    """Until the job ends; at the queue deadline, or past its time limit, it is cancelled (CheckJobError)."""
    from course_lib.jobs import TERMINAL

    started = None
    queued_said = False
    try:
        while (state := job.state) not in TERMINAL:
            now = time.monotonic()
            if state == "PENDING":
                if not queued_said:
                    say(f"queued as job {job.id} (state PENDING, reason {job.reason or 'None'})")
                    queued_said = True
                if now - job.submitted > queue_timeout:
                    raise _cancel(job, f"it waited in the queue longer than {queue_timeout:.0f} s. The cluster "
                                       "is busy: try again later, or ask your instructor (a reservation?)")
            elif started is None:
                started = now
                say(f"job {job.id} started ({state}); its log: {job.log_path}")
            elif now - started > job.spec.time_limit_s + 60:
                raise _cancel(job, f"it ran past its time limit ({job.spec.time} minutes)")
            time.sleep(POLL)
    except KeyboardInterrupt:
        job.cancel()
        say(f"interrupted: job {job.id} cancelled")
        raise


def report_of(job) -> Report:
    """The Report the job wrote; CheckJobError with the job's state and last log lines when there is none."""
    try:
        return Report.from_dict(json.loads((job.run_dir / REPORT_NAME).read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        raise CheckJobError(f"job {job.id} ended {job.state} (exit code {job.exit_code}) without a report; "
                            f"the last lines of {job.log_path}:\n" + (job.log(tail=15) or "(empty)")) from None


def check_on_slurm(exercise: str, path, site=None, queue_timeout: float = QUEUE_TIMEOUT, say=_say,
                   **options) -> Report:
    """Run ``course check EXERCISE PATH`` as a Slurm job; its Report. CheckJobError when it gives none."""
    from course_lib.jobs import SubmitError

    try:
        job = submit(exercise, path, options, site)
    except SubmitError as e:
        raise CheckJobError(f"Slurm did not take the check's job: {e}\nFix the site profile's partition, "
                            "account, reservation or qos (COURSE_SITE names it), or run the check here: "
                            "--engine local (in Python: engine=\"local\")") from None
    wait(job, queue_timeout, say)
    return report_of(job)


def main(argv: list[str]) -> int:
    """In the job: run the check the request names, in the submitter's folder; report.json into the job's."""
    from course_lib.jobs.slurm import forget_the_job
    from course_lib.registry import get

    request = json.loads(argv[0])
    out = Path.cwd() / REPORT_NAME         # the job script runs in the job's folder
    forget_the_job()
    for key in JOB_ONLY:
        os.environ.pop(key, None)
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    report = get(request["exercise"]).check(request["path"], **request["options"])
    write_text(out, json.dumps(report.to_dict(), indent=1))
    print(report.text(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
