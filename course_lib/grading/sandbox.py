"""Run one checker on one learner's file in a sandbox: ``run_check(exercise, file, limits)``, a worker process
(``python -m course_lib.grading.sandbox_worker``) on a fresh copy of the file, with a deadline, bounded output,
the limits course_lib.grading.cgroups finds here, and a sweep after it (README, "What isolation grading gives, and
what it does not"). The sweep finds the check's processes by its cgroup, by descent from the worker, and by its
token in their environment or its folder as their working directory (one that cleared its environment): the
checkers' ranks run in sessions of their own (course_lib.runtime.launch), so a process-group kill alone would miss
them. Not a security boundary: the learner's code runs as the grader's user.
"""
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from course_lib.grading.cgroups import Cgroups
from course_lib.runtime import proc

TOKEN_VAR = "COURSE_GRADE_TOKEN"
CGROUPS_VAR = "COURSE_GRADE_CGROUPS"
GRACE = 2.0     # seconds a check's processes get to end by themselves once it is over, before they are leftovers


@dataclass
class Limits:
    deadline: float = 600.0          # seconds for the whole check
    run_timeout: float | None = None  # passed to the checker (each multi-process run); None: its default
    max_processes: int = 512         # processes + threads (pids cgroup) or processes (RLIMIT_NPROC)
    memory_mb: int = 4096            # memory cgroup only
    max_file_mb: int = 256           # RLIMIT_FSIZE: largest file the check may write
    keep_output_kb: int = 32         # output kept: first 8 KB and the last keep_output_kb KB
    cgroups: bool = True             # False: rlimits and the sweep only (as where cgroups are not allowed)
    checker: str = ""                # a module with check(path, timeout=...) instead of the course's checker
    strict_launchers: bool = False   # ddp Step 6: the script must work under srun and torchrun


@dataclass
class Outcome:
    verdicts: list[dict] | None      # the checker's rows (item, result, message); None: it gave none
    returncode: int | None
    timed_out: bool
    seconds: float
    output: str                      # head and tail of what the check printed
    output_bytes: int                # everything it printed
    leftovers: int = 0               # processes still there after the worker ended (killed by the sweep)
    isolation: str = ""              # course_lib.grading.cgroups.Cgroups.kind: "cgroup v1", ..., "sweep"
    events: dict[str, int] = field(default_factory=dict)   # Cgroups.events(): what the limits refused

    def last_lines(self, n: int = 8, width: int = 200) -> str:
        lines = [line[:width] for line in self.output.splitlines() if line.strip()]
        return "\n".join(lines[-n:])


class BoundedOutput:
    """Drains a pipe in a thread; keeps the first 8 KB and the last ``tail_kb`` KB."""

    HEAD = 8192

    def __init__(self, stream, tail_kb: int):
        self.head, self.tail = bytearray(), bytearray()
        self.tail_max, self.total = tail_kb * 1024, 0
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream):
        for chunk in iter(lambda: stream.read1(65536), b""):
            self.total += len(chunk)
            room = max(0, self.HEAD - len(self.head))
            self.head += chunk[:room]
            self.tail += chunk[room:]
            if len(self.tail) > 2 * self.tail_max:   # cut in steps: each byte is moved about twice at most
                del self.tail[:len(self.tail) - self.tail_max]
        stream.close()

    def text(self) -> str:
        tail = bytes(self.tail[max(0, len(self.tail) - self.tail_max):])
        cut = self.total - len(self.head) - len(tail)
        middle = f"\n[... {cut} bytes not kept ...]\n".encode() if cut > 0 else b""
        return (bytes(self.head) + middle + tail).decode("utf-8", "replace")


# ---------------------------------------------------------------- one check

def _marked(p: psutil.Process, token: str, folder: str) -> bool:
    env, cwd = p.info["environ"] or {}, p.info["cwd"] or ""
    return any(token in v for v in env.values()) or cwd == folder or cwd.startswith(folder + os.sep)


def sweep(token: str, roots: set[int], cgroups, folder: str, grace: float = 0.0) -> int:
    """Stop, then kill, every process of the check (the module docstring); how many were running (leftovers).
    ``grace``: seconds given to those found first to end by themselves before they count: processes the
    checker has just killed are still exiting, they are not leftovers."""
    def found():
        members = roots | cgroups.pids()   # the cgroups' members, and below: what descends from them
        every = {p.pid: p for p in proc.live(("ppid", "environ", "cwd")) if p.pid != os.getpid()}
        marked = {pid for pid, p in every.items() if pid in members or _marked(p, token, folder)}
        return [every[pid] for pid in marked | proc.below(marked, every.values()).keys()]
    first = found()
    if grace and first:
        first = [p for p in first if p.pid in set(proc.wait_gone(first, grace))]
    return len(proc.stop_tree(first, more=found)) if first else 0


def _remove_tree(path: Path) -> None:
    def retry(func, p, _exc):
        try:
            os.chmod(p, 0o700)
            os.chmod(os.path.dirname(p), 0o700)
            func(p)
        except OSError:
            pass
    shutil.rmtree(path, onerror=retry)


def _read_verdicts(result: Path) -> list[dict] | None:
    """The verdicts the worker wrote to ``result``; None when it wrote none (or something unreadable)."""
    try:
        data = json.loads(result.read_text(encoding="utf-8"))
        return [{"item": str(v["item"]), "result": str(v["result"]), "message": str(v.get("message", ""))}
                for v in data["verdicts"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_check(exercise: str, source: Path, relative: str, limits: Limits, on_start=None) -> Outcome:
    """Grade ``source``, copied to ``relative`` (e.g. ``05_allreduce/allreduce.py``) in a fresh folder, with the
    checker of ``exercise`` (or ``limits.checker``); ``on_start(kill)`` gets what stops it at once (Ctrl-C)."""
    base = Path(tempfile.mkdtemp(prefix="course-grade-work-"))
    # nested, so that a file writing to its parent's parent (and one more) still writes into the sandbox
    work = base / "sandbox" / "learner"
    result = Path(tempfile.mkdtemp(prefix="course-grade-result-")) / "report.json"   # not the learner's folder
    token, cgroups, stopped = secrets.token_hex(16), Cgroups(limits), threading.Event()
    worker = out = None
    timed_out, leftovers, start = False, 0, time.monotonic()

    def kill() -> None:
        stopped.set()
        if worker.poll() is None:   # once reaped, its pid and group number may be another process's
            proc.stop_tree([worker.pid], group=worker.pid)

    try:
        copy = work / relative
        copy.parent.mkdir(parents=True)
        shutil.copyfile(source, copy)
        env = dict(os.environ, **{
            TOKEN_VAR: token, CGROUPS_VAR: os.pathsep.join(map(str, cgroups.dirs)), "HOME": str(work),
            "TMPDIR": str(work), "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1",
        })
        cmd = [sys.executable, "-m", "course_lib.grading.sandbox_worker", exercise, str(copy), str(result),
               json.dumps(asdict(limits))]
        worker = subprocess.Popen(cgroups.prefix + cmd, cwd=work, env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        out = BoundedOutput(worker.stdout, limits.keep_output_kb)
        if on_start is not None:
            on_start(kill)
        try:
            worker.wait(limits.deadline)
            leftovers = sweep(token, set(), cgroups, str(base), grace=GRACE)
        except subprocess.TimeoutExpired:
            timed_out = not stopped.is_set()
            # collect the tree while the worker still holds it together, then kill it all
            sweep(token, {worker.pid}, cgroups, str(base))
            worker.wait()
    finally:
        if worker is not None and worker.poll() is None:
            proc.stop_tree([worker.pid], group=worker.pid)
            worker.wait()
        sweep(token, set(), cgroups, str(base))
        if out is not None:
            out.thread.join(10)
        events = cgroups.events()     # before the cgroups go: did a limit refuse something?
        cgroups.remove()
        verdicts = _read_verdicts(result)
        _remove_tree(base)
        _remove_tree(result.parent)
    return Outcome(verdicts, worker.returncode, timed_out, time.monotonic() - start, out.text(), out.total,
                   leftovers, cgroups.kind, events=events)
