"""Notebook 08's experiment as ``course check ckpt``'s last item, "resume": the course's training loop with the
learner's functions under the real ``torchrun --max-restarts 1``; rank 1 kills itself mid-epoch; the loss curve must
equal an uninterrupted run's, step for step (course_lib.ckpt.curves.TOLERANCE)."""
from course_lib.ckpt import curves
from course_lib.core.report import Report

WORLD = 2
RESUME = {"epochs": 3, "every": 3, "kill_at": 14}     # 8 steps per epoch: killed in epoch 2, snapshot after step 11
_REFERENCE: dict = {}


def reference_curve(timeout: float):
    """The uninterrupted run's losses (no snapshots at all), computed once per process."""
    if not _REFERENCE:
        ref = curves.run(None, nprocs=WORLD, epochs=RESUME["epochs"], every=RESUME["every"], timeout=timeout,
                         style="srun")
        if not ref.result.ok:
            raise RuntimeError("the uninterrupted reference run failed:\n" + ref.result.summary())
        _REFERENCE.update(ref.losses)
    return _REFERENCE


def resume_verdict(report: Report, path: str, timeout: float) -> None:
    reference = reference_curve(timeout)
    run = curves.run(path, nprocs=WORLD, epochs=RESUME["epochs"], every=RESUME["every"], kill_at=RESUME["kill_at"],
                     restarts=1, timeout=timeout)
    head = f"torchrun --max-restarts 1, rank 1 killed before step {RESUME['kill_at']}"
    if not run.result.ok:
        report.add("resume", False, f"{head}: the run did not finish\n" + run.result.summary())
        return
    if len(run.attempts) < 2:
        report.add("resume", False, f"{head}: no restart was seen:\n" + "\n".join(run.lines[-6:]))
        return
    first, second = run.attempts[0], run.attempts[1]
    last = first.snapshots[-1] if first.snapshots else None
    if second.resumed is None:
        report.add("resume", False, f"{head}: after the restart, training began again at step 1 (no snapshot "
                   "was found, so load_snapshot was not called)")
        return
    ok, msg = curves.compare(reference, run.losses)
    where = f"resumed at epoch {second.resumed[0]}, step {second.resumed[1]}"
    if last is not None and tuple(second.resumed) != tuple(last):
        where += f" (the last snapshot before the kill was at epoch {last[0]}, step {last[1]})"
    report.add("resume", ok, f"{head}; {where}: {msg}")
