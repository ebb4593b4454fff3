"""Finding every process of one check, and killing them all (through psutil: course_lib.core.proc).

A check's processes are found three ways, since each alone misses some: they carry the check's token in
their environment, or work in its folder (one that cleared its environment), or descend from one of them
or from the check's worker (found through parent links, whatever session or process group they joined).
Where the check has cgroups, their members are added.
"""
from __future__ import annotations

import os
import signal
import time

import psutil

from course_lib.core import proc


def _marked(p: psutil.Process, token: str, folder: str) -> bool:
    """``p`` carries ``token`` in its environment, or works in ``folder`` (or below it)."""
    env, cwd = p.info["environ"] or {}, p.info["cwd"] or ""
    return any(token in v for v in env.values()) or cwd == folder or cwd.startswith(folder + os.sep)


def scan(token: str, roots: set[int], folder: str = "\0") -> dict[int, psutil.Process]:
    """Live processes that carry ``token`` in their environment, work in ``folder`` or descend from ``roots``
    (the roots themselves are not included)."""
    me = os.getpid()
    every: dict[int, psutil.Process] = {}
    children: dict[int, list[int]] = {}
    found = set()
    for p in proc.live(("ppid", "environ", "cwd")):
        if p.pid == me:
            continue
        every[p.pid] = p
        children.setdefault(p.info["ppid"], []).append(p.pid)
        if _marked(p, token, folder):
            found.add(p.pid)
    todo = list(found | roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return {pid: every[pid] for pid in found}


def _members(cgroups) -> dict[int, psutil.Process]:
    """The live members of the check's cgroups (none where it has none)."""
    found = {}
    for pid in cgroups.pids() - {os.getpid()}:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                found[pid] = p
        except psutil.Error:
            pass
    return found


def sweep(token: str, roots: set[int], cgroups, folder: str = "\0", rounds: int = 20, grace: float = 0.0) -> int:
    """Stop, then kill, every process of the check; returns how many were running (leftovers).

    SIGSTOP first so that nothing forks or re-parents while the tree is collected; then SIGKILL.
    ``grace``: seconds given to those found first to end by themselves before they count: processes the
    checker has just killed are still exiting, they are not leftovers.
    """
    seen: set[int] = set()
    found_alive = 0
    for n in range(rounds):
        live = {**scan(token, roots | seen, folder), **_members(cgroups)}
        if n == 0 and grace and live:
            still = set(proc.wait_gone(live.values(), grace))
            live = {pid: p for pid, p in live.items() if pid in still}
        if not live:
            break
        found_alive += len(live.keys() - seen)
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            proc.signal_all(live.values(), sig)
        seen |= live.keys()
        time.sleep(0.05)
    return found_alive
