"""The requeue job of notebook 08 on the session's real one-node Slurm (tests/conftest.py, scripts/local-slurm/).

solutions/08_checkpoint/requeue.sbatch as shipped, submitted with a 2-minute limit and USR1 70 s before it (Slurm
checks time limits every 30 s or so, so the signal comes 20-50 s after the start here): the job saves a snapshot,
requeues itself, runs again and resumes; its loss curve must equal an uninterrupted run's. The test shortens the
requeue hold (cred_expire, 120 s) with `scontrol update StartTime=now`, and cancels the job on any failure.
"""
import os
import sys
import time

import pytest
from conftest import ROOT, live_processes

from course_lib.ckpt import check as ckpt_check
from course_lib.ckpt import curves, requeue

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
STEP_SECONDS = 2.2        # 24 steps: about 53 s of training, longer than the latest the signal can come


def test_job_requeues_itself_before_its_limit_and_resumes(slurm, tmp_path):
    folder = requeue.prepare(tmp_path / "run")
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    events, start = [], time.monotonic()
    job = requeue.submit(folder, time_limit="2", signal_at=70, max_requeues=1, env=env,
                         args=["--epochs", ckpt_check.RESUME["epochs"], "--every", ckpt_check.RESUME["every"],
                               "--step-seconds", STEP_SECONDS])
    try:
        state = requeue.follow(job, timeout=170, release_hold=True, env=env,
                               on_event=lambda m: events.append(f"{time.monotonic() - start:5.1f} s  {m}"))
    finally:
        requeue.cancel(job, env)     # a no-op once it ended
    log = requeue.log(folder, job)
    report = "\n".join(events) + "\n--- log (rank 0 and the job script):\n" + log[-3000:]
    assert state.get("JobState") == "COMPLETED" and state.get("Restarts") == "1", report
    assert "USR1 at" in log and f"requeue job {job}" in log, report

    curve = curves.Curve()
    for line in log.splitlines():
        curve.on_line(0, line)
    first, second = curve.attempts
    assert first.snapshots and second.resumed == first.snapshots[-1], report
    assert curve.global_step(second.resumed) > 0, "the first run stopped before any step: nothing was resumed"
    equal, message = curves.compare(ckpt_check.reference_curve(timeout=240), curve.losses)
    assert equal, message + "\n" + report
    print(f"\n[ckpt requeue] job {job}: {time.monotonic() - start:.0f} s; stopped after step "
          f"{curve.global_step(second.resumed)} of {len(curve.losses)}; {message}\n" + "\n".join(events))
    assert not live_processes(f"stop-{job}"), "processes of the job are still running"
