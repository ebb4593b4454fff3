"""Limits for one check through cgroup v1: a pids cgroup (processes and threads) and, where possible, a memory
cgroup. Only where this machine lets the grader create them (root, v1 controllers mounted); elsewhere
``Cgroups(...).dirs`` is empty and the sandbox relies on rlimits and its sweep.
"""
from __future__ import annotations

import os
import secrets
import sys
import time
from pathlib import Path

import psutil


def _cgroup_v1_dirs() -> dict[str, Path]:
    """{controller: this process's cgroup folder} for the v1 pids and memory controllers that are mounted."""
    mounts = {}
    try:
        for part in psutil.disk_partitions(all=True):
            if part.fstype == "cgroup":
                for ctl in ("pids", "memory"):
                    if ctl in part.opts.split(","):
                        mounts[ctl] = Path(part.mountpoint)
        # which cgroup this process is in: the kernel says so only here (psutil has no call for it)
        with open("/proc/self/cgroup") as f:
            own = {}
            for line in f:
                _, ctls, path = line.rstrip("\n").split(":", 2)
                for ctl in ctls.split(","):
                    own[ctl] = path.lstrip("/")
    except (OSError, ValueError, psutil.Error):
        return {}
    return {ctl: mounts[ctl] / own.get(ctl, "") for ctl in mounts}


class Cgroups:
    """One pids cgroup (and a memory cgroup where possible) for one check; empty when not allowed here.

    ``limits``: a course_lib.grading.sandbox.Limits (cgroups, max_processes, memory_mb), or None for none.
    """

    def __init__(self, limits=None):
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
