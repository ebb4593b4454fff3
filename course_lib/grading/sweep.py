"""Finding every process of one check, and killing them all (through psutil: course_lib.runtime.proc).

A check's processes are found three ways, since each alone misses some: they carry the check's token in
their environment, or work in its folder (one that cleared its environment), or descend from one of them
or from the check's worker (found through parent links, whatever session or process group they joined).
Where the check has cgroups, their members are added, with what descends from them.
"""
from __future__ import annotations

import os

import psutil

from course_lib.runtime import proc


def _marked(p: psutil.Process, token: str, folder: str) -> bool:
    """``p`` carries ``token`` in its environment, or works in ``folder`` (or below it)."""
    env, cwd = p.info["environ"] or {}, p.info["cwd"] or ""
    return any(token in v for v in env.values()) or cwd == folder or cwd.startswith(folder + os.sep)


def scan(token: str, roots: set[int], folder: str = "\0") -> dict[int, psutil.Process]:
    """Live processes that carry ``token`` in their environment, work in ``folder``, are one of ``roots`` or
    descend from one of those (this process left out)."""
    every = {p.pid: p for p in proc.live(("ppid", "environ", "cwd")) if p.pid != os.getpid()}
    found = {pid for pid, p in every.items() if pid in roots or _marked(p, token, folder)}
    found |= proc.below(found, every.values()).keys()
    return {pid: every[pid] for pid in found}


def sweep(token: str, roots: set[int], cgroups, folder: str = "\0", grace: float = 0.0) -> int:
    """Stop, then kill, every process of the check; returns how many were running (leftovers).

    SIGSTOP first so that nothing forks or re-parents while the tree is collected; then SIGKILL.
    ``grace``: seconds given to those found first to end by themselves before they count: processes the
    checker has just killed are still exiting, they are not leftovers.
    """
    def found():
        return scan(token, roots | cgroups.pids(), folder).values()   # the cgroups' members and their children
    first = list(found())
    if grace and first:
        first = [p for p in first if p.pid in set(proc.wait_gone(first, grace))]
    return len(proc.stop_tree(first, more=found)) if first else 0
