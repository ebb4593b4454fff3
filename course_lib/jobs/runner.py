"""A short job that runs ``python -m MODULE REQUEST`` for the caller and is waited for: a check as a job
(course_lib.check_slurm) and a notebook's run as a job (course_lib.runs) both go through here.

``submit`` sbatches it (course_lib.jobs.slurm: ``--test-only`` first, then held, its folder made, released);
``wait`` follows it until it ends, says that it is queued (with Slurm's reason and its place in the partition's queue,
again when either changes) and when it starts, and cancels
it (scancel) at the queue deadline, past its run deadline, when ``stop`` is set, or on Ctrl-C.
"""
from __future__ import annotations

import json
import os
import sys
import time

from course_lib import jobs
from course_lib.jobs import TERMINAL, JobSpec, slurm
from course_lib.jobs.slurm import TAKES_NO_JOB, forget_the_job

POLL = 1.0   # seconds between two looks at the job (squeue: a controller serves a whole room)
PLACE_EVERY = 10.0   # seconds between two looks at a pending job's place in the queue (two more squeue calls)


class JobError(RuntimeError):
    """The job gave no answer (refused, cancelled at a deadline, ended early); the message says why."""


def say_on_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# what the job script exports for a training run; the job's own ranks get the submitter's values instead
JOB_ONLY = ("MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "SRUN_CPUS_PER_TASK")
IN_JOB = "COURSE_IN_JOB"   # set in such a job: the runs it starts stay on its node (no job submitting jobs)


def spec(name: str, module: str, request: dict, site, minutes: int, cpus: int = 1, gpus: int = 0,
         partition: str | None = None, qos: str | None = None):
    """The JobSpec of one task that runs ``python -m module JSON(request)`` for ``minutes``, with ``cpus`` CPUs
    (at most a node's) and ``gpus`` GPUs. The request carries the submitter's JOB_ONLY values (become_the_job)."""
    request = {**request, "env_job_only": {k: os.environ[k] for k in JOB_ONLY if k in os.environ}}
    # launcher "python" runs `python -m MODULE REQUEST`: -m keeps course_lib/ off sys.path
    return JobSpec(name=name, script="-m", args=[module, json.dumps(request)], launcher="python",
                   cpus_per_task=max(1, min(cpus, site.cpus_per_node)), gpus_per_node=gpus, time=str(minutes),
                   partition=partition, qos=qos)


def submit(spec, site):
    """sbatch ``spec`` into a folder of the runs directory; the SlurmJob. SubmitError (Slurm's words) when Slurm
    refuses it."""
    return slurm.submit(spec, site, jobs.runs_dir())


def not_taken(what: str, refused: Exception, here: str) -> str:
    """What to say when Slurm did not take a run's or a check's job: its words, then what to do (wait for the nodes
    it names as taking no job now, else fix the site profile), or run it ``here``."""
    fix = ("Wait until `sinfo` shows those nodes up" if TAKES_NO_JOB in str(refused) else
           "Fix the site profile's partition, account, reservation or qos (COURSE_SITE names it)")
    return f"Slurm did not take the {what}'s job: {refused}\n{fix}, or run {here}"


def become_the_job(request: dict) -> None:
    """In the job: what a process started here would see (no Slurm variables: a learner's script reads SLURM_PROCID
    before RANK; the submitter's JOB_ONLY values), and every run it starts stays here."""
    forget_the_job()
    for key in JOB_ONLY:
        os.environ.pop(key, None)
    os.environ.update(request.get("env_job_only", {}))
    os.environ[IN_JOB] = "1"
    os.environ["COURSE_RUNS"] = "local"


def cancel(job, why: str, error=JobError, queued: bool = False) -> JobError:
    """scancel ``job``; the error that says why and what it was (``.queued``: it never started)."""
    state, reason = job.state, job.reason
    job.cancel()
    e = error(f"job {job.id} cancelled (scancel {job.id}): {why}; it was {state}"
              + (f" (reason {reason})" if reason else "") + f", now {job.state}. Its folder: {job.run_dir}")
    e.queued = queued
    return e


def wait(job, queue_timeout: float, say=say_on_stderr, run_timeout: float | None = None, on_poll=None,
         stop=None, error=JobError) -> None:
    """Until the job ends. Cancelled (``error`` raised) after ``queue_timeout`` s in the queue, ``run_timeout`` s
    running (None: its time limit + 60 s), or when ``stop`` (a threading.Event) is set; cancelled on Ctrl-C.
    ``on_poll()`` runs at every look (e.g. to pass on new lines)."""
    limit = job.spec.time_limit_s + 60 if run_timeout is None else run_timeout
    started = None
    reason_said = place_said = None
    place_at = 0.0
    try:
        while (state := job.state) not in TERMINAL:
            now = time.monotonic()
            if state == "PENDING":
                reason = job.reason or "None"
                place = place_said
                if now >= place_at:
                    place, place_at = job.queue_place(), now + PLACE_EVERY
                if reason_said is None:
                    say(f"queued as job {job.id} (state PENDING, reason {reason}" + (f"; {place})" if place else ")"))
                elif reason != reason_said or place != place_said:   # the scheduler's first look comes later
                    say(f"job {job.id} still queued (reason {reason}" + (f"; {place})" if place else ")"))
                reason_said, place_said = reason, place
                if now - job.submitted > queue_timeout:
                    raise cancel(job, f"it waited in the queue longer than {queue_timeout:.0f} s. The cluster is "
                                      "busy: try again later, or ask your instructor (a reservation?)", error, True)
            elif started is None:
                started = now
                say(f"job {job.id} started ({state}); its log: {job.log_path}")
            elif now - started > limit:
                raise cancel(job, f"it ran past its deadline ({limit:.0f} s)", error)
            if stop is not None and stop.is_set():
                raise cancel(job, "stopped", error)
            if on_poll is not None:
                on_poll()
            time.sleep(POLL)
    except KeyboardInterrupt:
        job.cancel()
        say(f"interrupted: job {job.id} cancelled")
        raise
