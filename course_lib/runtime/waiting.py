"""The course's one loop that waits for a job: a run's and a check's job (course_lib.runtime.runner, which gives it as
``runner.wait``), a grading array (course_lib.grading.array), the sbatch check's job (course_lib.sbatch.run) and a
job a notebook follows (course_lib.runtime.progress). It imports nothing of the course's, so that Job.wait can use it.

Any Job will do (course_lib.runtime.job: ``state``, ``done``, ``reason``, ``cancel()``; ``queue_place()`` where it says
what it waits for). It says that a job is queued (with Slurm's reason and its place in the partition's queue, again
when either changes) and when it starts, and cancels it (scancel) at the queue deadline, past its run deadline, when
``stop`` is set, or on Ctrl-C.
Not submitit's Job.wait()/result(): they block until the end; what is said while queued and the deadlines are this
loop's.
"""
from __future__ import annotations

import sys
import time

POLL = 1.0   # seconds between two looks at the job (squeue: a controller serves a whole room)
PLACE_EVERY = 10.0   # seconds between two looks at a pending job's place in the queue (two more squeue calls)


class JobError(RuntimeError):
    """The job gave no answer (refused, cancelled at a deadline, ended early); the message says why."""


def say_on_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cancel(job, why: str, error=JobError, queued: bool = False) -> JobError:
    """scancel ``job``; the error that says why and what it was (``.queued``: it never started)."""
    state, reason = job.state, job.reason
    job.cancel()
    e = error(f"job {job.id} cancelled (scancel {job.id}): {why}; it was {state}"
              + (f" (reason {reason})" if reason else "") + f", now {job.state}. Its folder: {job.run_dir}")
    e.queued = queued
    return e


def wait(job, queue_timeout: float = float("inf"), say=say_on_stderr, run_timeout: float | None = None,
         on_poll=None, stop=None, error=JobError, poll: float = POLL, timeout: float | None = None,
         interrupt_cancels: bool = True) -> None:
    """Until the job ends: the course's one loop that waits for a job (a run's, a check's, a grading array's, one a
    notebook follows). Cancelled (``error`` raised) after ``queue_timeout`` s in the queue, ``run_timeout`` s
    running (None: its time limit + 60 s), or when ``stop`` (a threading.Event) is set. ``on_poll()`` runs at
    every look, every ``poll`` s (e.g. to pass on new lines); a true answer ends the wait (e.g. every task of an
    array has ended). ``timeout``: return after that many seconds, the job left as it is. ``say=None``: silent.
    Ctrl-C cancels the job, or, with ``interrupt_cancels=False``, only stops the waiting (raised either way)."""
    if run_timeout is None:
        run_timeout = job.spec.time_limit_s + 60 if job.spec is not None else float("inf")
    give_up = float("inf") if timeout is None else time.monotonic() + timeout
    started = None
    reason_said = place_said = None
    place_at = 0.0
    try:
        while True:
            state, now = job.state, time.monotonic()
            if job.done:   # the state just read (a Job keeps it a moment), or an end since: no TERMINAL import
                return
            if state == "PENDING":
                if say is not None:   # a silent wait asks nothing more of the controller
                    reason = job.reason or "None"
                    place = place_said
                    if now >= place_at:
                        place, place_at = job.queue_place(), now + PLACE_EVERY
                    if reason_said is None:
                        say(f"queued as job {job.id} (state PENDING, reason {reason}"
                            + (f"; {place})" if place else ")"))
                    elif reason != reason_said or place != place_said:   # the scheduler's first look comes later
                        say(f"job {job.id} still queued (reason {reason}" + (f"; {place})" if place else ")"))
                    reason_said, place_said = reason, place
                if now - job.submitted > queue_timeout:
                    raise cancel(job, f"it waited in the queue longer than {queue_timeout:.0f} s. The cluster is "
                                      "busy: try again later, or ask your instructor (a reservation?)", error, True)
            elif started is None:
                started = now
                if say is not None:
                    say(f"job {job.id} started ({state}); its log: {job.log_path}")
            elif now - started > run_timeout:
                raise cancel(job, f"it ran past its deadline ({run_timeout:.0f} s)", error)
            if stop is not None and stop.is_set():
                raise cancel(job, "stopped", error)
            if on_poll is not None and on_poll():
                return
            if now >= give_up:
                return
            time.sleep(poll)
    except KeyboardInterrupt:
        if interrupt_cancels:
            job.cancel()
            if say is not None:
                say(f"interrupted: job {job.id} cancelled")
        raise
