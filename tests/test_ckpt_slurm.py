"""The requeue job of notebook 08 on the session's real one-node Slurm (tests/conftest.py, scripts/local-slurm/).

solutions/08_checkpoint/requeue.sbatch as shipped: on USR1 the job saves a snapshot, requeues itself, runs again and
resumes; its loss curve must equal an uninterrupted run's. The test sends the batch shell the USR1 that
``--signal=B:USR1@N`` makes Slurm send near the limit (``scancel --batch --signal=USR1``, the same delivery) once
the first run has trained a few steps: Slurm's own timing (it checks limits every 30 s or so, and may signal up to
60 s early) left a loaded CI machine with the signal before the ranks had even started (one CI run). The job's
limit is long enough that Slurm's signal never comes first. The test shortens the requeue hold (cred_expire,
120 s) with `scontrol update StartTime=now`, and cancels the job on any failure.
"""
import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT, live_processes

from course_lib.ckpt import curves, requeue
from course_lib.ckpt import resume as ckpt_check

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
STEP_SECONDS = 1.0        # 24 steps: about 24 s of training; after the step that triggers USR1, 20 s are left
                          # for the test to see it (it looks every 0.5 s) and for scancel to deliver it
SIGNAL_AFTER_STEP = 4     # the first run is stopped after its first snapshot (every 3 steps): it resumes past step 0


def test_job_requeues_itself_before_its_limit_and_resumes(slurm, tmp_path):
    folder = requeue.prepare(tmp_path / "run")
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    events, start = [], time.monotonic()
    job = requeue.submit(folder, time_limit="10", signal_at=60, max_requeues=1, env=env,
                         args=["--epochs", ckpt_check.RESUME["epochs"], "--every", ckpt_check.RESUME["every"],
                               "--step-seconds", STEP_SECONDS])
    try:
        _usr1_after_progress(folder, job, env, events, start)
        state = requeue.follow(job, timeout=300, release_hold=True, env=env,
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
    ok, said = requeue.verdict(state, log, ckpt_check.reference_curve(timeout=240))
    assert ok and "resumed at epoch" in said and "all 24 steps equal" in said, said
    print(f"\n[ckpt requeue] job {job}: {time.monotonic() - start:.0f} s; stopped after step "
          f"{curve.global_step(second.resumed)} of {len(curve.losses)}; {message}\n" + "\n".join(events))
    assert not live_processes(f"stop-{job}"), "processes of the job are still running"


def _usr1_after_progress(folder, job, env, events, start, timeout=300):
    """USR1 to the batch shell once rank 0 has logged step SIGNAL_AFTER_STEP (what Slurm would send near the limit)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if f"step={SIGNAL_AFTER_STEP} " in requeue.log(folder, job):
            subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True, timeout=30, env=env,
                           capture_output=True)
            events.append(f"{time.monotonic() - start:5.1f} s  USR1 sent after step {SIGNAL_AFTER_STEP}")
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job} logged no step {SIGNAL_AFTER_STEP} within {timeout} s:\n"
                         + requeue.log(folder, job)[-2000:])


# The learner's requeue.sbatch judged by requeue.verdict (notebook 08 prints it): the starter's trap does nothing,
# and one that stops the training but never runs `scontrol requeue`. Each is sent USR1 after step 4, as above.
UNFINISHED = {"starter": None,
              "no_requeue": ('    scontrol requeue "$SLURM_JOB_ID"\n', "")}


@pytest.mark.parametrize("name", list(UNFINISHED))
def test_an_unfinished_requeue_job_is_named(slurm, tmp_path, name):
    from course_lib.core.paths import tree_dir
    from course_lib.instructor.release import solution_view
    folder = requeue.prepare(tmp_path / "run")
    script = folder / "requeue.sbatch"
    if UNFINISHED[name] is None:
        script.write_text((tree_dir("exercises") / "08_checkpoint" / "requeue.sbatch").read_text())
    else:
        old, new = UNFINISHED[name]
        text = solution_view(script.read_text())
        assert text.count(old) == 1
        script.write_text(text.replace(old, new))
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    events, start = [], time.monotonic()
    job = requeue.submit(folder, time_limit="10", signal_at=60, max_requeues=1, env=env,
                         args=["--epochs", ckpt_check.RESUME["epochs"], "--every", ckpt_check.RESUME["every"],
                               "--step-seconds", 0.5])
    try:
        _usr1_after_progress(folder, job, env, events, start)
        state = requeue.follow(job, timeout=300, env=env, on_event=events.append)
    finally:
        requeue.cancel(job, env)
    ok, said = requeue.verdict(state, requeue.log(folder, job), ckpt_check.reference_curve(timeout=240))
    print(f"\n[ckpt requeue {name}] {said}")
    assert not ok, said
    expected = {"starter": "USR1 arrived, but the training did not stop",
                "no_requeue": "the training stopped and wrote its snapshot, but the job was not requeued"}[name]
    assert expected in said, said + "\n" + requeue.log(folder, job)[-2000:]
    assert not live_processes(f"stop-{job}"), "processes of the job are still running"
