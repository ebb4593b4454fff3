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
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from course_lib.grading.cgroups import Cgroups
from course_lib.runtime import proc

__all__ = ["Cgroups", "Limits", "Outcome", "BoundedOutput", "run_check", "TOKEN_VAR", "CGROUPS_VAR"]

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


class _Check:
    """The processes and folders of one check, from its start to the last sweep."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.base = Path(tempfile.mkdtemp(prefix="course-grade-work-"))
        # nested, so that a file writing to its parent's parent (and one more) still writes into the sandbox
        self.work = self.base / "sandbox" / "learner"
        self.private = Path(tempfile.mkdtemp(prefix="course-grade-result-"))   # not the learner's folder
        self.result = self.private / "report.json"
        self.token = secrets.token_hex(16)
        self.cgroups = Cgroups(limits)
        self.proc: subprocess.Popen | None = None
        self.out: BoundedOutput | None = None
        self.stopped = threading.Event()
        self.events: dict[str, int] = {}

    def start(self, exercise: str, source: Path, relative: str, checker: str) -> None:
        copy = self.work / relative
        copy.parent.mkdir(parents=True)
        shutil.copyfile(source, copy)
        env = dict(os.environ, **{
            TOKEN_VAR: self.token, CGROUPS_VAR: os.pathsep.join(map(str, self.cgroups.dirs)),
            "HOME": str(self.work), "TMPDIR": str(self.work), "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg",
            "PYTHONUNBUFFERED": "1",
        })
        limits = self.limits
        cmd = [sys.executable, "-m", "course_lib.grading.sandbox_worker", exercise, str(copy), str(self.result),
               "" if limits.run_timeout is None else str(limits.run_timeout),
               str(limits.max_processes), str(limits.max_file_mb), checker or limits.checker,
               "strict" if limits.strict_launchers else ""]
        self.proc = subprocess.Popen(self.cgroups.prefix + cmd, cwd=self.work, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.out = BoundedOutput(self.proc.stdout, limits.keep_output_kb)

    def kill(self) -> None:
        """Stop the check at once (Ctrl-C in the grader)."""
        self.stopped.set()
        proc.stop_tree([self.proc.pid], group=self.proc.pid)

    def wait(self) -> tuple[bool, int]:
        """Wait for the worker until the deadline: (timed out, processes left running when it ended)."""
        try:
            self.proc.wait(self.limits.deadline)
        except subprocess.TimeoutExpired:
            timed_out = not self.stopped.is_set()
            # collect the tree while the worker still holds it together, then kill it all
            sweep(self.token, {self.proc.pid}, self.cgroups, str(self.base))
            self.proc.wait()
            return timed_out, 0
        return False, sweep(self.token, set(), self.cgroups, str(self.base), grace=GRACE)

    def end(self) -> list[dict] | None:
        """Kill what is left, free the cgroups and folders; the worker's verdicts."""
        if self.proc is not None and self.proc.poll() is None:
            proc.stop_tree([self.proc.pid], group=self.proc.pid)
            self.proc.wait()
        sweep(self.token, set(), self.cgroups, str(self.base))
        if self.out is not None:
            self.out.thread.join(10)
        self.events = self.cgroups.events()     # before the cgroups go: did a limit refuse something?
        self.cgroups.remove()
        verdicts = _read_verdicts(self.result)
        _remove_tree(self.base)
        _remove_tree(self.private)
        return verdicts


def run_check(exercise: str, source: Path, relative: str, limits: Limits, on_start=None,
              checker: str = "") -> Outcome:
    """Grade ``source``, copied to ``relative`` (e.g. ``05_allreduce/allreduce.py``) in a fresh folder, with the
    checker of ``exercise`` (or the module ``checker``); ``on_start(kill)`` gets what stops it at once (Ctrl-C)."""
    check = _Check(limits)
    start = time.monotonic()
    try:
        check.start(exercise, source, relative, checker)
        if on_start is not None:
            on_start(check.kill)
        timed_out, leftovers = check.wait()
    finally:
        verdicts = check.end()
    return Outcome(verdicts, check.proc.returncode, timed_out, time.monotonic() - start, check.out.text(),
                   check.out.total, leftovers, check.cgroups.kind, events=check.events)
