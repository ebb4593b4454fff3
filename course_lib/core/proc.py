"""Process trees, through psutil: what a process started, stopping all of it, and waiting until it is gone.

psutil checks a process's start time before it signals it, so a pid the system reused for another
process is never hit. Zombies (exited, not yet reaped by their parent) count as gone everywhere here.
"""
from __future__ import annotations

import signal
import time
from typing import Iterable

import psutil


def descendants(pid: int) -> list[psutil.Process]:
    """Every live process below ``pid`` (children, theirs, ...), found through parent links.

    A child that left the session or process group (setsid) is still found, as long as its parent lives:
    collect them before killing the parents.
    """
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


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


def kill_tree(pid: int, sig: int = signal.SIGKILL, include_self: bool = True) -> int:
    """Signal ``pid``'s descendants (and ``pid`` itself unless ``include_self`` is False): how many got it.

    The tree is collected before any signal, so no child escapes by being orphaned on the way.
    """
    family = descendants(pid)
    if include_self:
        try:
            family.insert(0, psutil.Process(pid))
        except psutil.Error:
            pass
    return signal_all(family, sig)


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
    """Wait up to ``timeout`` seconds for all of ``pids`` to be gone; the pids still alive then."""
    todo = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        todo = [p for p in todo if _running(p)]
        if not todo or time.monotonic() >= deadline:
            return [_pid(p) for p in todo]
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def live(attrs: Iterable[str] = ("cmdline",)) -> list[psutil.Process]:
    """Every live, non-zombie process, each with ``.info`` holding ``attrs`` (None where not readable)."""
    found = []
    for p in psutil.process_iter([*attrs, "status"], ad_value=None):
        if p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found
