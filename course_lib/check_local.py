"""A check run here, in a check slot, by its overall deadline (course_lib.check's docstring says what both are).

The checker runs in the caller's thread (a second thread that stopped the check at its deadline made papermill
stall in CI; commit 5a647d9). ``course check`` here and a check job on Slurm (course_lib.check_slurm) both run a
check through here. Slots exist because under a room's overload the checks' wall-clock rules (a rank's stall,
torchrun's rendezvous) failed correct solutions. A slot is an flock on a file in one folder every user can write
(``$COURSE_CHECK_SLOTS_DIR``, default /tmp/course-check-slots): the kernel releases it when the check's process
ends, however it ends.
"""
import contextlib
import fcntl
import math
import os
import random
import time
from pathlib import Path

from course_lib.registry import EXERCISES, get
from course_lib.runtime.scope import scope

MARGIN = 60.0       # seconds beyond the launches' own deadlines: the fork server's start, stopping ranks
# launches one after the other, at most, of the checkers that are not run by course_lib.checking.check, each with
# its own ``timeout`` (default): the registry's ``rounds`` (ddp: the launches side by side, then up to two simulated
# ones again with the style that worked; ckpt: the cases, then the resume runs; sbatch: the job as a whole)
ROUNDS = {e.name: e.rounds for e in EXERCISES.values() if e.rounds}
SLOTS_DIR = "/tmp/course-check-slots"
# set while a check holds a slot (and by a check job, whose CPUs are Slurm's): a check inside it takes none, so a
# check that runs another (its ranks, a job it starts) cannot wait for itself
HELD = "COURSE_IN_CHECK"


def check_here(exercise: str, path, seconds: float, say=None, **kwargs):
    """The Report of ``exercise``'s checker on ``path``, by ``seconds`` from when it holds a check slot (``say``:
    where a wait for one is said; None: silent)."""
    with slot(say), scope(seconds, engine="local") as bound:
        report = get(exercise).check(path, **kwargs)
    if bound.cut:   # a "check run" FAIL first: the check's overall deadline, not the learner's code, stopped a run
        report.add("check run", False, f"no verdict within the check's deadline of {seconds:.0f} s: the runs still "
                   f"going then were stopped (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores), so a "
                   "run said to time out or hang below may not be your code's doing. Check again when the machine is "
                   "less busy; tell your instructor if it happens again")
        report.verdicts.insert(0, report.verdicts.pop())
    return report


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


def slots() -> int:
    """How many checks may run at once on this machine: ``$COURSE_CHECK_SLOTS``, else this process's CPUs."""
    value = os.environ.get("COURSE_CHECK_SLOTS", "").strip()
    if value and not value.isdigit():
        raise ValueError(f"COURSE_CHECK_SLOTS must be a number of checks (0: no limit), not {value!r}")
    return int(value) if value else len(os.sched_getaffinity(0))


@contextlib.contextmanager
def slot(say=None):
    """Hold one of the machine's ``slots()`` check slots while the block runs; wait for one first (said once)."""
    n, fds, held = slots(), [], False
    try:
        held = bool(n) and not os.environ.get(HELD) and _wait(n, fds, say or (lambda text: None))
        if held:
            os.environ[HELD] = "1"
        yield
    finally:
        if held:
            del os.environ[HELD]
        for fd in fds:
            os.close(fd)    # the lock goes with the held one's file description (not inherited: close-on-exec)


def _wait(n: int, fds: list, say) -> bool:
    """Open the slot files into ``fds`` and lock one, waiting while all are locked; False where they cannot be
    opened (said: the check runs without a slot rather than not at all)."""
    folder = Path(os.environ.get("COURSE_CHECK_SLOTS_DIR") or SLOTS_DIR)
    try:
        _open_slots(folder, n, fds)
    except OSError as e:
        say(f"checking without a check slot: {e}")
        return False
    if not _take(fds):
        say(f"waiting for a free check slot: {n} checks are running on this machine (this check's deadline starts "
            "when it has one)")
    while not _take(fds):
        time.sleep(random.uniform(0.2, 0.5))   # several waiters: not all at once on a freed slot
    return True


def _take(fds: list) -> bool:
    for fd in fds:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
    return False


def _open_slots(folder: Path, n: int, fds: list) -> None:
    """Read-only descriptors of the ``n`` slot files into ``fds``, each made where missing. /tmp's sticky bit and
    fs.protected_regular refuse O_CREAT on another user's file there, even an existing one: an existing file is
    opened without it, a missing one made with O_EXCL; modes past the umask, so that every user can open it."""
    with contextlib.suppress(FileExistsError):
        folder.mkdir()
        folder.chmod(0o1777)
    for i in range(n):
        path = folder / f"slot-{i}"
        try:
            fds.append(os.open(path, os.O_RDONLY | os.O_NOFOLLOW))
        except FileNotFoundError:
            try:
                fds.append(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CREAT | os.O_EXCL, 0o666))
                os.fchmod(fds[-1], 0o666)
            except FileExistsError:     # another check made it meanwhile
                fds.append(os.open(path, os.O_RDONLY | os.O_NOFOLLOW))
