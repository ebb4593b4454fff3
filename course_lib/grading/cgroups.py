"""Limits for one check: pids (processes and threads) and memory, through the first of a delegated cgroup v2
subtree, a transient systemd scope, cgroup v1, or a Slurm job's own cgroup that this machine allows, chosen at run
time (docs/grading.md, "Isolation"); else rlimits and the sweep. ``describe`` names the one in force.
"""
import contextlib
import os
import secrets
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

DELEGATED_VAR = "COURSE_GRADE_CGROUP"


@dataclass
class Host:
    """What this machine offers: v1 controller mounts, the v2 mount, this process's cgroups, systemd."""
    v1: dict[str, Path] = field(default_factory=dict)      # controller -> this process's v1 cgroup folder
    v2: Path | None = None                                  # this process's v2 cgroup folder
    systemd: bool = False                                   # systemd is the init system, systemd-run is here
    slurm_cgroup: str = ""                                  # the Slurm job's cgroup this process is in

    @classmethod
    def probe(cls) -> "Host":
        try:
            parts = psutil.disk_partitions(all=True)
            with open("/proc/self/cgroup") as f:   # the kernel says so only here (psutil has no call for it)
                text = f.read()
        except (OSError, psutil.Error):
            return cls()
        return cls.parse([(p.fstype, p.mountpoint, p.opts) for p in parts], text,
                         os.path.isdir("/run/systemd/system") and shutil.which("systemd-run") is not None)

    @classmethod
    def parse(cls, mounts: list[tuple[str, str, str]], proc_cgroup: str, systemd: bool) -> "Host":
        """From (fstype, mountpoint, options) mounts and /proc/self/cgroup's text."""
        own, v2_own = {}, None
        for line in proc_cgroup.splitlines():
            hid, ctls, path = line.split(":", 2)
            if hid == "0" and not ctls:
                v2_own = path.lstrip("/")
            for ctl in filter(None, ctls.split(",")):
                own[ctl] = path.lstrip("/")
        host = cls(systemd=systemd)
        for fstype, mountpoint, opts in mounts:
            if fstype == "cgroup":
                for ctl in ("pids", "memory"):
                    if ctl in opts.split(","):
                        host.v1[ctl] = Path(mountpoint) / own.get(ctl, "")
            elif fstype == "cgroup2" and v2_own is not None:
                host.v2 = Path(mountpoint) / v2_own
        paths = list(own.values()) + [v2_own or ""]
        host.slurm_cgroup = next((p for p in paths if "slurm" in p and "job_" in p), "")
        return host


def _v2_parent(host: Host) -> tuple[Path | None, list[str]]:
    """The v2 folder to make check cgroups in (the delegated one, or the grader's own, when pids is offered and it
    is writable), and which of pids and memory are on for its children once asked for."""
    delegated = os.environ.get(DELEGATED_VAR)
    for parent in ([Path(delegated)] if delegated else []) + ([host.v2] if host.v2 else []):
        ctl_file = parent / "cgroup.subtree_control"
        try:
            offered = (parent / "cgroup.controllers").read_text().split()
        except OSError:
            continue
        if "pids" not in offered or not os.access(parent, os.W_OK):
            continue
        for ctl in ("pids", "memory"):
            try:
                if ctl in offered and ctl not in ctl_file.read_text().split():
                    ctl_file.write_text(f"+{ctl}")
            except OSError:
                pass      # e.g. EBUSY: the parent holds processes itself (v2's "no internal processes" rule)
        try:
            return parent, [c for c in ("pids", "memory") if c in ctl_file.read_text().split()]
        except OSError:
            return parent, []
    return None, []


def _mkdir_with(d: Path, files: dict[str, str]) -> bool:
    """Make cgroup ``d`` and write its limit files; False (and ``d`` removed) when any write fails."""
    try:
        d.mkdir()
    except OSError:
        return False
    try:
        for name, value in files.items():
            (d / name).write_text(value)
    except OSError:
        _rmdir(d)
        return False
    return True


class Cgroups:
    """The cgroup(s) of one check (``dirs``, which the worker joins), or a systemd scope for it (``prefix``, the
    command the worker is started through), or nothing; ``kind`` says which (or "sweep")."""

    def __init__(self, limits, host: Host | None = None):
        self.dirs: list[Path] = []
        self.controllers: list[str] = []   # v1: the controllers with a cgroup for this check
        self.prefix: list[str] = []
        self.kind = "sweep"
        self.limits = limits
        if not limits.cgroups or not sys.platform.startswith("linux"):
            return
        host = host or Host.probe()
        name = f"course-grade-{os.getpid()}-{secrets.token_hex(4)}"
        if self._v2(host, name, limits):
            self.kind = "cgroup v2"
        elif host.v2 is not None and host.systemd:
            self.kind = "systemd scope"
            self.prefix = ["systemd-run", "--scope", "--quiet", "--collect"] + ([] if os.getuid() == 0 else ["--user"])
            self.prefix += ["-p", f"TasksMax={limits.max_processes}", "-p", f"MemoryMax={limits.memory_mb}M", "--"]
        elif self._v1(host, name, limits):
            self.kind = "cgroup v1"
        elif host.slurm_cgroup:
            self.kind = "slurm cgroup"

    def _v2(self, host: Host, name: str, limits) -> bool:
        parent, on = _v2_parent(host)
        if "pids" not in on:
            return False
        files = {"pids.max": str(limits.max_processes)}
        if "memory" in on:
            files["memory.max"] = str(limits.memory_mb * 2**20)
        if _mkdir_with(parent / name, files):
            self.dirs.append(parent / name)
            with contextlib.suppress(OSError):
                (parent / name / "memory.swap.max").write_text("0")   # a hog must not swap its way on
        return bool(self.dirs)

    def _v1(self, host: Host, name: str, limits) -> bool:
        for ctl, parent in sorted(host.v1.items(), reverse=True):   # pids first
            files = ({"pids.max": str(limits.max_processes)} if ctl == "pids"
                     else {"memory.limit_in_bytes": str(limits.memory_mb * 2**20)})
            if _mkdir_with(parent / name, files):
                self.dirs.append(parent / name)
                self.controllers.append(ctl)
            elif ctl == "pids":
                break
        if not any(d.parent == host.v1.get("pids") for d in self.dirs):
            self.remove()   # without a pids limit the cgroups buy little: rlimits and the sweep instead
        return bool(self.dirs)

    def describe(self) -> str:
        """One line for the report's header: the isolation in force."""
        lim = self.limits
        what = {"cgroup v2": f"cgroup v2 (a delegated subtree under {self.dirs[0].parent if self.dirs else '?'}",
                "systemd scope": "a transient systemd scope (systemd-run --scope",
                "cgroup v1": "cgroup v1 (" + " and ".join(self.controllers) + " controllers",
                }.get(self.kind)
        if what:
            return f"Isolation: {what}: at most {lim.max_processes} processes, {lim.memory_mb} MB per check)."
        if self.kind == "slurm cgroup":
            return "Isolation: the Slurm job's own cgroup (task/cgroup plugin); rlimits and the sweep per check."
        return ("Isolation: no cgroup could be made here: rlimits (RLIMIT_NPROC, not for root) and the sweep only; "
                "grade as root on cgroup v1, in a delegated cgroup v2 subtree ($COURSE_GRADE_CGROUP) or under "
                "systemd for pids and memory limits.")

    def pids(self) -> set[int]:
        found = set()
        for d in self.dirs:
            try:
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                pass
        return found

    def events(self) -> dict[str, int]:
        """What the limits refused so far: {"pids": forks refused at pids.max, "oom": processes the memory limit
        killed}, from pids.events and memory.events (v2) or memory.oom_control (v1); {} where none is readable."""
        found: dict[str, int] = {}
        for d in self.dirs:
            for name, key, field_name in (("pids.events", "pids", "max"), ("memory.events", "oom", "oom_kill"),
                                          ("memory.oom_control", "oom", "oom_kill")):
                try:
                    lines = (d / name).read_text().splitlines()
                except OSError:
                    continue
                for line in lines:
                    word, _, value = line.partition(" ")
                    if word == field_name and value.strip().isdigit():
                        found[key] = found.get(key, 0) + int(value)
        return found

    def remove(self) -> None:
        for d in self.dirs:
            _rmdir(d)
        self.dirs = []


def describe(limits) -> str:
    """The isolation a check gets here with ``limits`` (made and removed at once to find out)."""
    probe = Cgroups(limits)
    try:
        return probe.describe()
    finally:
        probe.remove()


def _rmdir(d: Path) -> None:
    for _ in range(50):       # a killed task leaves its cgroup a moment after it died
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
