"""The CPU time of each test, with every process it started (loaded by tests/conftest.py).

On a 2-core CI machine the run is CPU-bound: a test's wall time says more about what ran beside it than about the
test. So each pytest process (each xdist worker) joins a cgroup v1 ``cpuacct`` group of its own, which every
process it starts inherits (kernels, ranks, fork servers, the Slurm and hub daemons a fixture starts there), and a
test's CPU time is that group's usage from its setup to its teardown. The end of the run prints the total and the
tests that used most (as --durations does for wall time). Root and a v1 cpuacct mount are needed (CI has both);
elsewhere, or with COURSE_TEST_CPU=0, nothing is measured and the run says why once. Only the accounting group
changes: no limit is set, and the grader's pids and memory cgroups are other hierarchies.

Beside it, whether the run kept the cores busy: the machine's idle core-seconds from the start to the end (from
/proc/stat; a CPU-bound run shows few), when each worker's last test ended and when each xdist group ran, so that a
run that ends on one worker's waits (a group's tests one after another) tells itself from one short of CPU.
"""
from __future__ import annotations

import collections
import contextlib
import os
import time
from pathlib import Path

import pytest

MOUNT = Path("/sys/fs/cgroup/cpuacct")
SHOWN = 15
_group: Path | None = None
_why_not = ""
_start: dict = {}
_measured: dict = {}   # on the controller: node id -> CPU seconds
_began: tuple = ()     # on the controller: (monotonic seconds, the machine's idle seconds) at the start
_ended: dict = {}      # on the controller: a worker's or a group's name -> (first, last) report, seconds into the run


def _idle_s() -> float:
    """The machine's idle and iowait seconds since boot, all cores summed (/proc/stat's first line)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")


def pytest_configure(config):
    global _group, _why_not, _began
    _began = (time.monotonic(), _idle_s())
    if os.environ.get("COURSE_TEST_CPU") == "0":
        _why_not = "COURSE_TEST_CPU=0"
    elif not (MOUNT / "cpuacct.usage").is_file() or not os.access(MOUNT, os.W_OK):
        _why_not = f"needs root and a cgroup v1 cpuacct mount at {MOUNT}"
    else:
        name = os.environ.get("PYTEST_XDIST_WORKER", "main")
        group = MOUNT / f"course-tests-{os.getpid()}-{name}"
        try:
            group.mkdir()
            (group / "cgroup.procs").write_text(str(os.getpid()))
            _group = group
        except OSError as e:
            _why_not = f"could not join a cpuacct group ({e})"


def pytest_unconfigure(config):
    if _group is None:
        return
    try:   # this process and what still runs of it (a kept fork server ends at exit) back to the root group
        for pid in [str(os.getpid()), *(_group / "cgroup.procs").read_text().split()]:
            with contextlib.suppress(OSError):   # gone meanwhile
                (MOUNT / "cgroup.procs").write_text(pid)
        _group.rmdir()
    except OSError as e:
        print(f"cpu_time: {_group} not removed: {e}")


def _usage() -> float:
    return int((_group / "cpuacct.usage").read_text()) / 1e9


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    if _group is not None:
        _start[item.nodeid] = _usage()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if _group is not None and call.when == "teardown" and item.nodeid in _start:
        outcome.get_result().user_properties.append(("cpu_s", round(_usage() - _start.pop(item.nodeid), 2)))


def pytest_runtest_logreport(report):
    for key, value in getattr(report, "user_properties", ()):
        if key == "cpu_s":   # on the controller too: xdist sends each worker's reports there
            _measured[report.nodeid] = value
    node = getattr(report, "node", None)   # the worker that ran it (xdist sets it on the controller)
    if node is not None:
        at = time.monotonic() - _began[0]
        for name in (node.gateway.id, *report.nodeid.split("@")[1:]):
            first = _ended.get(name, (at - report.duration,))[0]   # a setup's report comes first
            _ended[name] = (first, at)


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput"):
        return
    write = terminalreporter.write_line
    if _ended:
        wall = time.monotonic() - _began[0]
        idle = _idle_s() - _began[1]
        terminalreporter.section("How busy the cores were")
        write(f"idle {idle:.0f} of {wall * os.cpu_count():.0f} core-s ({100 * idle / wall / os.cpu_count():.0f}%) "
              f"in {wall:.0f} s on {os.cpu_count()} cores")
        for name, (first, last) in sorted(_ended.items(), key=lambda kv: kv[1][1]):
            write(f"{'worker' if name.startswith('gw') else 'group'} {name}: {first:.0f}-{last:.0f} s")
    if not _measured:
        terminalreporter.section("CPU time per test")
        write(f"not measured: {_why_not or 'no test reported it'}")
        return
    terminalreporter.section(f"CPU time per test: {sum(_measured.values()):.0f} CPU-s in all, the {SHOWN} largest")
    for node, cpu in sorted(_measured.items(), key=lambda kv: -kv[1])[:SHOWN]:
        write(f"{cpu:8.1f} CPU-s  {node}")
    files: collections.Counter = collections.Counter()
    for node, cpu in _measured.items():
        files[node.split("::")[0]] += cpu
    write(f"by file, the {SHOWN // 2} largest:")
    for path, cpu in files.most_common(SHOWN // 2):
        write(f"{cpu:8.1f} CPU-s  {path}")
