"""Process trees, through psutil (which checks a process's start time before it signals it, so a reused pid is
never hit): what a process started, stopping all of it, waiting until it is gone. Zombies count as gone."""
import contextlib
import json
import os
import select
import signal
import subprocess
import time
from typing import Iterable

import psutil


class Started:
    """A process launch() started (a rank, or torchrun's agent): its pid, its output pipe and its exit code once
    known, from its Popen (a cold start) or from the fork server's message on ``conn`` (a forked rank is the
    server's child, not ours: course_lib.runtime.warm)."""

    def __init__(self, pid: int, stdout=None, popen: subprocess.Popen | None = None, conn=None):
        self.pid, self.stdout, self.popen, self.conn = pid, stdout, popen, conn
        self.code: int | None = None

    def exit_code(self, timeout: float = 0.0) -> int | None:
        """Its exit code, waiting up to ``timeout`` seconds for it; None while it runs."""
        if self.code is None and self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.code = self.popen.wait(timeout)
        elif self.code is None and select.select([self.conn], [], [], timeout)[0]:
            msg = self.conn.recv(4096)
            self.conn.close()
            self.code = json.loads(msg)["code"] if msg else -signal.SIGKILL
            if not msg:   # the server is gone without a word: make sure the rank is too
                stop_tree([], group=self.pid)
        return self.code

    def stop(self, grace: float = 3.0) -> None:
        """TERM its process group (it leads its own session) and all it started, then KILL what is left
        (``stop_tree``), and wait for its exit code. Its pid counts only while it runs: a reused pid is not it."""
        stop_tree([self.pid] if self.exit_code() is None else [], group=self.pid, grace=grace)
        self.exit_code(5)


def signal_all(procs: Iterable[psutil.Process], sig: int) -> int:
    """Send ``sig`` to each process; those already gone (or not ours) are skipped. How many got it."""
    sent = 0
    for p in procs:
        try:
            p.send_signal(sig)
            sent += 1
        except psutil.Error:
            pass
    return sent


def freeze(roots: Iterable, group: int | None = None) -> list[psutil.Process]:
    """SIGSTOP ``roots`` (pids or psutil processes; one whose pid went to another process is left out), the process
    group ``group`` and every descendant, again until no new descendant shows: then none can fork, leave its group
    (setsid) or orphan a child, so the list returned (the live roots, then their descendants) is all of them. A
    snapshot taken while they run misses a child forked after it into a session of its own (tests/test_launch.py).
    Stopped, they act on a signal (TERM) only once continued (SIGCONT)."""
    family: dict[int, psutil.Process] = {}
    for root in roots:
        with contextlib.suppress(psutil.Error):
            p = root if isinstance(root, psutil.Process) else psutil.Process(root)
            if p.is_running():
                family[p.pid] = p
    new = list(family.values())
    for _ in range(50):   # rounds at most: a fork bomb does not keep it looking for ever
        _send(new, group, signal.SIGSTOP)
        _stopped(new)
        new = [c for pid, c in below(family).items() if pid not in family]
        if not new:
            break
        family.update((c.pid, c) for c in new)
    return list(family.values())


def stop_tree(roots: Iterable, group: int | None = None, grace: float = 0.0, more=tuple) -> list[psutil.Process]:
    """Stop everything that ``roots`` (pids or psutil processes) and the process group ``group`` are and started:
    the one way the course ends what it started. All are frozen first (``freeze``: nothing forks or leaves its group
    meanwhile); with ``grace`` they get TERM and up to ``grace`` seconds for the roots to end; then whatever is left,
    with what it started meanwhile, gets KILL (also when this is interrupted: none stays stopped). ``more()``: pids
    to stop with them at each look (a cgroup's members, the backstop where one exists). The family found."""
    family: list = []
    try:
        family = freeze([*roots, *more()], group)
        if grace > 0 and family:
            _send(family, group, signal.SIGTERM)
            _send(family, group, signal.SIGCONT)   # stopped, they act on TERM once continued
            wait_gone([p for p in family if _pid(p) in {_pid(r) for r in roots}], grace)
    finally:
        family = freeze([*(family or roots), *more()], group)
        _send(family, group, signal.SIGKILL)
    return family


def _send(family: list, group: int | None, sig: int) -> None:
    signal_all(family, sig)
    if group is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)


def _stopped(procs: list) -> None:
    """Wait until each of ``procs`` has stopped (or ended): a signal is delivered after kill() returns, and a
    process still running for that moment could fork a child that a look at the tree made now would miss."""
    deadline = time.monotonic() + 2.0
    for p in procs:
        while time.monotonic() < deadline:
            try:
                if p.status() in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                    break
            except psutil.Error:
                break
            time.sleep(0.001)


def below(pids, procs=None) -> dict[int, psutil.Process]:
    """Every process below ``pids``, from one look at all parent links (not one per pid: a family can be
    thousands): those of ``procs`` (psutil processes whose ``.info`` has "ppid"), or of every process now."""
    children: dict[int, list] = {}
    for p in psutil.process_iter(["ppid"]) if procs is None else procs:
        children.setdefault(p.info["ppid"], []).append(p)
    found, todo = {}, list(pids)
    while todo:
        for c in children.get(todo.pop(), ()):
            if c.pid not in found:
                found[c.pid] = c
                todo.append(c.pid)
    return found


def _pid(p) -> int:
    return p.pid if isinstance(p, psutil.Process) else int(p)


def _running(p) -> bool:
    try:
        proc = p if isinstance(p, psutil.Process) else psutil.Process(p)
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def alive(pids: Iterable) -> list[int]:
    """The pids (or psutil.Process objects) of ``pids`` that are running and not zombies."""
    return [_pid(p) for p in pids if _running(p)]


def wait_gone(pids: Iterable, timeout: float) -> list[int]:
    """Wait up to ``timeout`` seconds for all of ``pids`` to be gone; the pids still alive then. Not
    psutil.wait_procs: it would reap a child of ours, taking its exit code away from its Popen."""
    todo = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        todo = [p for p in todo if _running(p)]
        if not todo or time.monotonic() >= deadline:
            return [_pid(p) for p in todo]
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def live(attrs: Iterable[str] = ("cmdline",)) -> list[psutil.Process]:
    """Every live, non-zombie process, each with ``.info`` holding ``attrs`` (None where not readable)."""
    return [p for p in psutil.process_iter([*attrs, "status"], ad_value=None)
            if p.info["status"] != psutil.STATUS_ZOMBIE]
