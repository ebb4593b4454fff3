"""Evidence from a test that runs far past its usual time (loaded by tests/conftest.py).

A test that pytest-timeout stops keeps only the stack of pytest itself; when the test waits on a kernel, a rank or
a job, what that process was doing is lost. So every STALL_AFTER seconds of one test's call (twice at most,
before pytest-timeout's 600 s) this writes the process tree below the pytest worker, with each process's state
and the Python stack of each one (py-spy, where installed), to out/stalls/<test>-<seconds>s.txt and prints
where. A normal test never reaches the first dump: the slowest take about 180 s on a loaded 2-core machine.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

STALL_AFTER = float(os.environ.get("COURSE_STALL_AFTER", "240"))
DUMPS = 2
OUT = Path(__file__).resolve().parent.parent / "out" / "stalls"


def _run(argv: list[str], timeout: float = 30.0) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, "RUST_BACKTRACE": "0"})
        return (p.stdout + p.stderr).rstrip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"({' '.join(argv[:3])}: {e})"


def _describe(p: psutil.Process, spy: str | None) -> str:
    try:
        with p.oneshot():
            head = (f"== pid {p.pid} ppid {p.ppid()} {p.status()} cpu {sum(p.cpu_times()[:2]):.1f}s "
                    f"age {time.time() - p.create_time():.0f}s threads {p.num_threads()}\n"
                    f"   {' '.join(p.cmdline())[:300]}")
        wchan = Path(f"/proc/{p.pid}/wchan").read_text() if Path(f"/proc/{p.pid}/wchan").exists() else "?"
    except (psutil.Error, OSError) as e:
        return f"== pid {p.pid}: {e}"
    stack = _connections(p)
    if spy and "python" in (p.name() or ""):
        stack = "\n" + _run([spy, "dump", "--pid", str(p.pid)]).split("\n\nCaused by")[0]
    return f"{head}\n   wchan {wchan}{stack}"


def _connections(p: psutil.Process) -> str:
    """Its TCP sockets: a kernel's channels (a client socket connected to itself, or one never connected, would
    show here as the reason a reply never comes)."""
    try:
        conns = p.net_connections(kind="tcp")
    except (psutil.Error, OSError) as e:
        return f"\n   tcp: {e}"
    rows = [f"{c.laddr.port}->{c.raddr.port if c.raddr else '-'} {c.status}" for c in conns if c.laddr]
    return "\n   tcp: " + (", ".join(sorted(rows)) if rows else "none")


def dump(nodeid: str, seconds: float) -> Path:
    """Write the evidence for one test now; returns the file."""
    spy = shutil.which("py-spy") or (str(Path(os.sys.executable).with_name("py-spy"))
                                     if Path(os.sys.executable).with_name("py-spy").exists() else None)
    me = psutil.Process()
    parts = [f"{nodeid}: still running after {seconds:.0f} s; load {os.getloadavg()}",
             "py-spy: " + (spy or "not installed (pip install py-spy for Python stacks)")]
    parts += [f"== pytest worker {me.pid}{_connections(me)}"]
    parts += [_describe(p, spy) for p in me.children(recursive=True)]
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', nodeid)[-150:]}-{seconds:.0f}s.txt"
    path.write_text("\n".join(parts) + "\n")
    return path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    done = threading.Event()

    def watch():
        start = time.monotonic()
        for n in range(1, DUMPS + 1):
            if done.wait(STALL_AFTER * n - (time.monotonic() - start)):
                return
            path = dump(item.nodeid, time.monotonic() - start)
            print(f"\n[stall_dump] {item.nodeid} still running: its processes and their stacks are in {path}",
                  flush=True)
            print(path.read_text()[-8000:], flush=True)

    if STALL_AFTER > 0:
        threading.Thread(target=watch, name="stall-dump", daemon=True).start()
    try:
        yield
    finally:
        done.set()
