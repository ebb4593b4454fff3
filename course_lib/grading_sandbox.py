"""Run one checker on one learner's file in a sandbox: ``run_check(exercise, file, limits)``.

The grader runs learners' code, so each check is a worker process (``python -m course_lib.grading_sandbox``)
that is given:
- a fresh temporary copy of the file, as its working directory, HOME and TMPDIR (the submissions are never
  written);
- a deadline for the whole check, after which everything it started is killed;
- bounded output: the pipe is drained all the time, only its first and last few KB are kept;
- limits: a pids cgroup (processes and threads) and a memory cgroup when this machine lets the grader create
  cgroups (cgroup v1, as root); otherwise RLIMIT_NPROC for a non-root user (root ignores it); always
  RLIMIT_FSIZE (largest file written) and no core files;
- a sweep after the check: every process of the check's cgroup, every descendant of the worker and every
  process that still carries the check's token in its environment is stopped, then killed. The checkers'
  ranks run in sessions of their own (course_lib.launch), so a process-group kill alone would miss them.

It is not a security boundary: the learner's code runs as the grader's user and can read (and write)
whatever that user can outside the copy. Grade as an unprivileged user, or in a container or a batch job.
"""
from __future__ import annotations

import json
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

TOKEN_VAR = "COURSE_GRADE_TOKEN"
CGROUPS_VAR = "COURSE_GRADE_CGROUPS"


@dataclass
class Limits:
    deadline: float = 600.0          # seconds for the whole check
    run_timeout: float | None = None  # passed to the checker (each multi-process run); None: its default
    max_processes: int = 512         # processes + threads (pids cgroup) or processes (RLIMIT_NPROC)
    memory_mb: int = 4096            # memory cgroup only
    max_file_mb: int = 256           # RLIMIT_FSIZE: largest file the check may write
    keep_output_kb: int = 32         # output kept: first 8 KB and the last keep_output_kb KB
    cgroups: bool = True             # False: rlimits and the sweep only (as where cgroups are not allowed)


@dataclass
class Outcome:
    verdicts: list[dict] | None      # the checker's rows (item, result, message); None: it gave none
    returncode: int | None
    timed_out: bool
    seconds: float
    output: str                      # head and tail of what the check printed
    output_bytes: int                # everything it printed
    leftovers: int = 0               # processes still there after the worker ended (killed by the sweep)
    isolation: str = ""              # "cgroup" or "sweep"
    notes: list[str] = field(default_factory=list)

    def last_lines(self, n: int = 8, width: int = 200) -> str:
        lines = [line[:width] for line in self.output.splitlines() if line.strip()]
        return "\n".join(lines[-n:])


# ---------------------------------------------------------------- cgroups (v1: pids, memory)

def _cgroup_v1_dirs() -> dict[str, Path]:
    """{controller: this process's cgroup folder} for the v1 pids and memory controllers that are mounted."""
    mounts = {}
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                _, where, kind, opts, *_ = line.split()
                if kind == "cgroup":
                    for ctl in ("pids", "memory"):
                        if ctl in opts.split(","):
                            mounts[ctl] = Path(where)
        with open("/proc/self/cgroup") as f:
            own = {}
            for line in f:
                _, ctls, path = line.rstrip("\n").split(":", 2)
                for ctl in ctls.split(","):
                    own[ctl] = path.lstrip("/")
    except (OSError, ValueError):
        return {}
    return {ctl: mounts[ctl] / own.get(ctl, "") for ctl in mounts}


class Cgroups:
    """One pids cgroup (and a memory cgroup where possible) for one check; empty when not allowed here."""

    def __init__(self, limits: Limits | None = None):
        self.dirs: list[Path] = []
        if limits is None or not limits.cgroups or not sys.platform.startswith("linux"):
            return
        name = f"course-grade-{os.getpid()}-{secrets.token_hex(4)}"
        made = []
        for ctl, parent in sorted(_cgroup_v1_dirs().items(), reverse=True):   # pids first
            d = parent / name
            try:
                d.mkdir()
            except OSError:
                continue
            try:
                if ctl == "pids":
                    (d / "pids.max").write_text(str(limits.max_processes))
                else:
                    (d / "memory.limit_in_bytes").write_text(str(limits.memory_mb * 2**20))
                self.dirs.append(d)
                made.append(ctl)
            except OSError:
                _rmdir(d)
        if "pids" not in made:
            self.remove()   # without a pids limit the cgroups buy little: rlimits and the sweep instead

    def pids(self) -> set[int]:
        found = set()
        for d in self.dirs:
            try:
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                pass
        return found

    def remove(self) -> None:
        for d in self.dirs:
            _rmdir(d)
        self.dirs = []


def _rmdir(d: Path) -> None:
    for _ in range(50):       # a killed task leaves its cgroup a moment after it died
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


# ---------------------------------------------------------------- finding and killing a check's processes

def _scan(token: bytes, roots: set[int], folder: str = "\0") -> set[int]:
    """Live processes that carry ``token`` in their environment, work in ``folder`` or descend from ``roots``."""
    me = os.getpid()
    children: dict[int, list[int]] = {}
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] in ("Z", "X"):
                continue
            children.setdefault(int(fields[1]), []).append(pid)
            with open(f"/proc/{pid}/environ", "rb") as f:
                if token in f.read():
                    found.add(pid)
                    continue
            cwd = os.readlink(f"/proc/{pid}/cwd")
            if cwd == folder or cwd.startswith(folder + os.sep):
                found.add(pid)   # a process that cleared its environment still works in the copy
        except (OSError, ValueError, IndexError):
            continue
    todo = list(found | roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found - {me}


def sweep(token: bytes, roots: set[int], cgroups: Cgroups, folder: str = "\0", rounds: int = 20) -> int:
    """Stop, then kill, every process of the check; returns how many were alive (not already being killed).

    SIGSTOP first so that nothing forks or re-parents while the tree is collected; then SIGKILL.
    """
    seen: set[int] = set()
    found_alive = 0
    for _ in range(rounds):
        live = (_scan(token, roots | seen, folder) if os.path.isdir("/proc") else set()) | cgroups.pids()
        live.discard(os.getpid())
        if not live:
            break
        found_alive += sum(1 for pid in live - seen if not _dying(pid))
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in live:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        seen |= live
        time.sleep(0.05)
    return found_alive


def _dying(pid: int) -> bool:
    """True when ``pid`` has a SIGKILL pending: someone (the checker) already stopped it, it is exiting."""
    try:
        with open(f"/proc/{pid}/status") as f:
            pending = [int(line.split()[1], 16) for line in f if line.startswith(("SigPnd:", "ShdPnd:"))]
    except (OSError, ValueError, IndexError):
        return True
    return any(mask & (1 << (signal.SIGKILL - 1)) for mask in pending)


# ---------------------------------------------------------------- bounded output

class BoundedOutput:
    """Drains a pipe in a thread; keeps the first 8 KB and the last ``tail_kb`` KB."""

    HEAD = 8192

    def __init__(self, stream, tail_kb: int):
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_len, self.tail_max, self.total = 0, tail_kb * 1024, 0
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream):
        for chunk in iter(lambda: stream.read1(65536), b""):
            self.total += len(chunk)
            room = self.HEAD - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            if chunk:
                self.tail.append(chunk)
                self.tail_len += len(chunk)
                while self.tail_len - len(self.tail[0]) >= self.tail_max:
                    self.tail_len -= len(self.tail.popleft())
        stream.close()

    def text(self) -> str:
        tail = b"".join(self.tail)[-self.tail_max:]
        cut = self.total - len(self.head) - len(tail)
        middle = f"\n[... {cut} bytes not kept ...]\n".encode() if cut > 0 else b""
        return (bytes(self.head) + middle + tail).decode("utf-8", "replace")


# ---------------------------------------------------------------- one check

def _remove_tree(path: Path) -> None:
    def retry(func, p, _exc):
        try:
            os.chmod(p, 0o700)
            os.chmod(os.path.dirname(p), 0o700)
            func(p)
        except OSError:
            pass
    shutil.rmtree(path, onerror=retry)


def run_check(exercise: str, source: Path, relative: str, limits: Limits, on_start=None,
              checker: str = "") -> Outcome:
    """Grade ``source`` (a learner's file) with the checker of ``exercise``, in a sandbox (module docstring).

    The copy sits at ``relative`` (e.g. ``05_allreduce/allreduce.py``) in a fresh folder, as in exercises/.
    ``on_start(kill)`` receives a function that stops the check at once (the grader calls it on Ctrl-C).
    ``checker``: a module with ``check(path, timeout=...) -> Report`` to use instead of the course's.
    """
    base = Path(tempfile.mkdtemp(prefix="course-grade-work-"))
    # nested, so that a file writing to its parent's parent (and one more) still writes into the sandbox
    work = base / "sandbox" / "learner"
    private = Path(tempfile.mkdtemp(prefix="course-grade-result-"))   # not the learner's folder
    result = private / "report.json"
    token = secrets.token_hex(16)
    cgroups = Cgroups(limits)
    isolation = "cgroup" if cgroups.dirs else "sweep"
    proc = out = None
    stopped = threading.Event()
    timed_out, leftovers, verdicts = False, 0, None
    start = time.monotonic()
    try:
        copy = work / relative
        copy.parent.mkdir(parents=True)
        shutil.copyfile(source, copy)
        env = dict(os.environ, **{
            TOKEN_VAR: token, CGROUPS_VAR: os.pathsep.join(map(str, cgroups.dirs)),
            "HOME": str(work), "TMPDIR": str(work), "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg",
            "PYTHONUNBUFFERED": "1",
        })
        cmd = [sys.executable, "-m", "course_lib.grading_sandbox", exercise, str(copy), str(result),
               "" if limits.run_timeout is None else str(limits.run_timeout),
               str(limits.max_processes), str(limits.max_file_mb), checker]
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        out = BoundedOutput(proc.stdout, limits.keep_output_kb)

        def kill():
            stopped.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

        if on_start is not None:
            on_start(kill)
        try:
            proc.wait(limits.deadline)
        except subprocess.TimeoutExpired:
            timed_out = not stopped.is_set()
            # collect the tree while the worker still holds it together, then kill it all
            sweep(token.encode(), {proc.pid}, cgroups, str(base))
            proc.wait()
        else:
            time.sleep(0.5)   # processes the checker has just killed are still exiting: not leftovers
            leftovers = sweep(token.encode(), set(), cgroups, str(base))
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        sweep(token.encode(), set(), cgroups, str(base))
        if out is not None:
            out.thread.join(10)
        cgroups.remove()
        try:
            data = json.loads(result.read_text(encoding="utf-8"))
            verdicts = [{"item": str(v["item"]), "result": str(v["result"]), "message": str(v.get("message", ""))}
                        for v in data["verdicts"]]
        except (OSError, ValueError, KeyError, TypeError):
            pass
        _remove_tree(base)
        _remove_tree(private)
    outcome = Outcome(verdicts, proc.returncode, timed_out, time.monotonic() - start, out.text(), out.total,
                      leftovers, isolation)
    if stopped.is_set():
        outcome.notes.append("stopped by the grader (interrupted)")
    return outcome


# ---------------------------------------------------------------- the worker (a separate process)

def _enter_limits(max_processes: int, max_file_mb: int) -> None:
    """Join the check's cgroups and set rlimits before any learner code runs; children inherit both."""
    for d in filter(None, os.environ.get(CGROUPS_VAR, "").split(os.pathsep)):
        with open(os.path.join(d, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    size = max_file_mb * 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    if os.getuid() != 0:
        # RLIMIT_NPROC counts all of this user's processes; give the check max_processes more than now
        mine = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit() and _owner(p) == os.getuid())
        cap = mine + max_processes
        soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_NPROC, (cap, cap if hard == resource.RLIM_INFINITY else hard))


def _owner(p: Path) -> int:
    try:
        return p.stat().st_uid
    except OSError:
        return -1


def worker(argv: list[str]) -> int:
    exercise, path, result, run_timeout, max_processes, max_file_mb, checker = argv
    _enter_limits(int(max_processes), int(max_file_mb))
    import importlib

    from course_lib.checks.cli import check
    from course_lib.checks.report import Report

    kwargs = {"timeout": float(run_timeout)} if run_timeout else {}
    start = time.monotonic()
    try:
        if checker:
            report = importlib.import_module(checker).check(path, **kwargs)
        else:
            report = check(exercise, path, **kwargs)
    except BaseException as e:   # the learner's code may raise SystemExit or worse at import time
        report = Report(exercise, path)
        report.add("check", False, f"the check itself stopped: {type(e).__name__}: {e}")
    data = {"exercise": exercise, "seconds": time.monotonic() - start,
            "verdicts": [{"item": v.item, "result": v.result, "message": v.message} for v in report.verdicts]}
    tmp = result + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, result)
    return 0


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1:]))
