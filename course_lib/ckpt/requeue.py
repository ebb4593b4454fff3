"""The requeue job of notebook 08 on a real Slurm: submit the ckpt exercise's ``requeue.sbatch``, follow it through its
runs, and read its log.

A requeued job waits at least ``cred_expire`` seconds (slurm.conf(5): 120 by default) in PENDING with reason
BeginTime before it may start again. ``follow(..., release_hold=True)`` shortens that wait the way an
administrator can, ``scontrol update JobId=ID StartTime=now`` (the course's own test cluster runs as root);
a learner on a shared cluster just waits. Whatever happens, a job that ``follow`` gives up on is cancelled.
"""
import re
import shutil
import time
from pathlib import Path

from course_lib import jobs, registry
from course_lib.core.paths import tree_dir
from course_lib.runtime import runner, slurm
from course_lib.runtime.job import Job

TERMINAL = {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
FIELD = re.compile(r"(\w+)=(\S*)")


class RequeueError(RuntimeError):
    """sbatch refused the job, or it did not end in time (it has been cancelled)."""


def should_run(setting, quick: bool) -> tuple[bool, str]:
    """Whether notebook 08 runs the requeue job, and why not: ``setting`` is its SLURM parameter (None: outside a
    quick run, where the course's jobs go: course_lib.jobs.choose, auto asking the controller). Slurm's client
    without a controller (a laptop with the client installed) is a reason not to, said in words; with SLURM = True
    it stops, saying what to set."""
    if setting is False:
        return False, "SLURM = False"
    if setting is None and quick:
        return False, "a quick run"
    if setting is None:
        try:
            name, why = jobs.engine()
        except (jobs.SubmitError, ValueError) as e:   # Slurm asked for and not there, or no engine of that name
            return False, str(e)
        return name == "slurm", "" if name == "slurm" else why
    ok, why = slurm.available()
    if ok:
        return True, ""
    if setting:
        raise RequeueError(f"SLURM = True, but {why}: set SLURM = False in the parameters cell to go on without it")
    return False, why


def prepare(folder, tree: str = "solutions") -> Path:
    """A run folder with the tree's snapshot.py and requeue.sbatch (the job runs there, its snapshot lands there)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    exercise = tree_dir(tree) / registry.get("ckpt").file        # its snapshot.py, next to it requeue.sbatch
    for source in (exercise, exercise.with_name("requeue.sbatch")):
        shutil.copy(source, folder / source.name)
    return folder


def submit(folder, time_limit: str = "2", signal_at: int = 60, max_requeues: int = 1, args=(), env=None) -> str:
    """sbatch the folder's requeue.sbatch from the folder (its SLURM_SUBMIT_DIR); the job id."""
    cmd = ["sbatch", "--parsable", f"--time={time_limit}", f"--signal=B:USR1@{signal_at}",
           f"--export=ALL,MAX_REQUEUES={max_requeues}", "requeue.sbatch", *map(str, args)]
    r = slurm.command(cmd, timeout=60, cwd=folder, env=env)
    if r.returncode != 0:
        raise RequeueError(f"sbatch refused the job: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout.strip().split(";")[0]


class _Followed(Job):
    """The requeue job for runner.wait (the course's one loop that waits for a job): its state is scontrol's, read
    with the caller's ``env`` (SLURM_CONF); each change is reported, and the requeue hold released if asked. It ends
    only in one of TERMINAL: the states a requeue passes through (REQUEUED, PREEMPTED, ...) and a job scontrol no
    longer shows (its fields {}) are waited on, as before."""

    def __init__(self, job_id: str, release_hold: bool, env, on_event):
        super().__init__(job_id, None, Path("."), time.monotonic())
        self.release_hold, self.env, self.on_event = release_hold, env, on_event
        self.fields, self.seen, self.released, self.held = {}, None, set(), {}

    def _query(self) -> tuple[str, str, int | None]:
        r = slurm.command(["scontrol", "show", "job", "-o", self.id], timeout=30, env=self.env)
        st = self.fields = dict(FIELD.findall(r.stdout)) if r.returncode == 0 else {}   # {}: Slurm forgot the job
        now = (st.get("JobState"), st.get("Restarts"), st.get("Reason"))
        if now != self.seen:
            self.on_event(f"job {self.id}: {now[0]} (restarts {now[1]}, reason {now[2]})")
            self.seen = now
        if now[0] in TERMINAL:
            return now[0], now[2] or "", None
        if self.release_hold and now[0] == "PENDING" and now[2] == "BeginTime" and now[1] not in self.released:
            self.held.setdefault(now[1], time.monotonic())
            if _may_release(self.held[now[1]], self.env):
                self.released.add(now[1])
                slurm.command(["scontrol", "update", f"JobId={self.id}", "StartTime=now"], timeout=30, env=self.env)
                self.on_event(f"job {self.id}: requeue hold released (scontrol update StartTime=now)")
        return "PENDING" if now[0] == "PENDING" else "RUNNING", now[2] or "", None   # RUNNING: not ended

    def _record(self) -> None:
        pass   # the job writes its own log in its folder

    def _cancel(self) -> None:
        cancel(self.id, self.env)


def follow(job_id: str, timeout: float = 300, release_hold: bool = False, env=None, on_event=print) -> dict:
    """Poll the job until it ends; report each change of state (and release the requeue hold if asked)."""
    job = _Followed(job_id, release_hold, env, on_event)
    try:
        runner.wait(job, say=None, run_timeout=float("inf"), poll=0.5, timeout=timeout, interrupt_cancels=False)
    except BaseException:
        cancel(job_id, env)
        raise
    if job.done:
        return job.fields
    cancel(job_id, env)
    raise RequeueError(f"job {job_id} did not end within {timeout:.0f} s (last state {job.seen}); it was cancelled")


def _may_release(held_since: float, env=None) -> bool:
    """Whether the requeue hold may be cut short: the old run is gone from the nodes, and the clock has moved on.

    slurmd revokes the old run's credential when it ends it, and refuses any credential made in the same second or
    before (Slurm's cred.c: ``cred->ctime <= j->revoked``); a run released too soon fails at launch. So: no node
    still completing a job, and 2 s since the hold was seen.
    """
    if time.monotonic() - held_since < 2:
        return False
    r = slurm.command(["sinfo", "-h", "-N", "-o", "%T"], timeout=30, env=env)
    return r.returncode == 0 and "completing" not in r.stdout


def cancel(job_id: str, env=None) -> None:
    slurm.command(["scancel", job_id], timeout=30, env=env)


def log(folder, job_id: str) -> str:
    path = Path(folder) / f"ckpt-requeue-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def verdict(state: dict, text: str, reference: dict) -> tuple[bool, str]:
    """(ok, what happened) for a requeue job that was sent USR1 once: it must stop with a snapshot, requeue itself,
    run again, resume and end with the uninterrupted run's curve (``reference``: step -> loss). ``text``: its log."""
    from course_lib.ckpt import curves
    restarts, end = int(state.get("Restarts") or 0), state.get("JobState")
    if "USR1 at" not in text:
        return False, ("no USR1 reached the job script (its log has no 'USR1 at'): it needs #SBATCH "
                       "--signal=B:USR1@60 and `trap on_usr1 USR1` before the training starts, in the background")
    if restarts == 0:
        if "stopped before step" in text:
            return False, (f"the training stopped and wrote its snapshot, but the job was not requeued (it ended "
                           f"{end}): after the training stops, `scontrol requeue $SLURM_JOB_ID` (with --requeue)")
        return False, (f"USR1 arrived, but the training did not stop (the job ended {end}, never requeued): the trap "
                       "must ask it to stop, `touch \"$STOP\"`, the stop file every rank checks at each step")
    curve = curves.Curve()
    for line in text.splitlines():
        curve.on_line(0, line)
    if end != "COMPLETED" or len(curve.attempts) < 2:
        return False, f"requeued {restarts} time(s), but the job ended {end} with {len(curve.attempts)} run(s) logged"
    first, second = curve.attempts[0], curve.attempts[1]
    if second.resumed is None:
        return False, "requeued, but the second run began again at step 1: it did not find the snapshot"
    equal, message = curves.compare(reference, curve.losses)
    head = (f"USR1 after step {curve.global_step(first.snapshots[-1]) if first.snapshots else 0}, snapshot, "
            f"requeued {restarts} time(s), resumed at epoch {second.resumed[0]}, step {second.resumed[1]}")
    return equal, f"{head}: {message}"
