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
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

STALL_AFTER = float(os.environ.get("COURSE_STALL_AFTER", "240"))
DUMPS = 2
TFD = re.compile(r"tfd:\s*(\d+)")              # an epoll set's watched fds, in /proc/PID/fdinfo
EVENTFD_COUNT = re.compile(r"eventfd-count:\s*(\d+)")
OUT = Path(__file__).resolve().parent.parent / "out" / "stalls"
# what the papermill guard (course_lib/instructor/papermill_guard.py) handed over in this run: shown at the end
WAKEUPS = Path(os.environ.setdefault("COURSE_WAKEUP_LOG", str(OUT / "wakeups.log")))
_WAKEUPS_BEFORE = WAKEUPS.stat().st_size if WAKEUPS.is_file() else 0


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
    stack = ""
    if spy and "python" in (p.name() or ""):
        stack = "\n" + _run([spy, "dump", "--pid", str(p.pid)]).split("\n\nCaused by")[0]
    return f"{head}\n   wchan {wchan}{_connections(p)}{_kernel_says(p)}{stack}"


def _wakeups(pid: int) -> str:
    """Which of the process's eventfds (a zmq socket's mailbox is one) hold a signal, and which fds each epoll
    set watches. A zmq.asyncio socket whose mailbox holds a signal but is in no epoll set has lost its wake-up:
    its messages have arrived and nothing will read them (what a stalled notebook client showed by hand once). A
    sign, not a proof: a zmq socket used without asyncio also keeps its signal until its next call."""
    fds, pending, watched = Path(f"/proc/{pid}/fd"), [], []
    try:
        listed = sorted(fds.iterdir(), key=lambda f: int(f.name))
    except OSError as e:
        return f"\n   fds: {e}"
    for fd in listed:
        try:
            target = os.readlink(fd)
            info = Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text()
        except OSError:
            continue      # closed since the listing (the listing's own fd, for one)
        if target == "anon_inode:[eventfd]":
            count = EVENTFD_COUNT.search(info)
            pending += [fd.name] if count and count[1] != "0" else []
        elif target == "anon_inode:[eventpoll]":
            watched.append((fd.name, re.findall(TFD, info)))
    lost = [fd for fd in pending if not any(fd in targets for _, targets in watched)]
    sets = "; ".join(f"{fd}: {' '.join(targets)}" for fd, targets in watched)
    return (f"\n   eventfds holding a signal: {' '.join(pending) or 'none'}; of those in no epoll set: "
            f"{' '.join(lost) or 'none'}\n   epoll sets (fd: watched fds): {sets or 'none'}")


def _connections(p: psutil.Process) -> str:
    """Its TCP sockets: a kernel's channels (a client socket connected to itself, or one never connected, would
    show here as the reason a reply never comes)."""
    try:
        conns = p.net_connections(kind="tcp")
    except (psutil.Error, OSError) as e:
        return f"\n   tcp: {e}"
    rows = [f"{c.laddr.port}->{c.raddr.port if c.raddr else '-'} {c.status}" for c in conns if c.laddr]
    return "\n   tcp: " + (", ".join(sorted(rows)) if rows else "none")


def _kernel_says(p: psutil.Process) -> str:
    """For a Jupyter kernel: what it has run, asked on a connection of our own (20 s at most). A kernel whose last
    input is the cell the client still waits for ran it, and the reply was lost on the client's side."""
    argv = p.cmdline()
    if "ipykernel_launcher" not in " ".join(argv) or "-f" not in argv:
        return ""
    from jupyter_client import BlockingKernelClient

    kc = BlockingKernelClient(connection_file=argv[argv.index("-f") + 1])
    try:
        kc.load_connection_file()
        kc.start_channels()
        msg_id = kc.execute("print('RAN', get_ipython().execution_count - 1, 'cells; last:', repr(In[-1][:120]))",
                            store_history=False)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                return "\n   kernel: " + msg["content"]["text"].strip()
        return "\n   kernel: no answer in 20 s"
    except Exception as e:  # noqa: BLE001 - evidence only: say why there is none
        return f"\n   kernel: not asked ({type(e).__name__}: {e})"
    finally:
        kc.stop_channels()


def _clients() -> str:
    """This process's notebook clients (nbclient), channel by channel: whether zmq holds a message for it now
    (EVENTS, read on the plain socket so that reading it schedules nothing), who waits on it (pyzmq's recv futures
    and io state), whether asyncio's selector maps its fd and whether that loop's epoll watches it; then the loop
    (running, callbacks ready and timed) and its tasks, each with where it waits. A message waiting, a future
    waiting, the fd watched and its eventfd holding no signal: a lost wake-up. A message waiting and nobody
    waiting: the client's code is stuck elsewhere (its task stacks say where)."""
    import asyncio
    import gc
    import warnings

    import zmq
    from nbclient import NotebookClient

    rows = []
    with warnings.catch_warnings():   # isinstance on every object touches deprecated ones (torch's reduce_op)
        warnings.simplefilter("ignore")
        clients = [o for o in gc.get_objects() if isinstance(o, NotebookClient)]
    for client in clients:
        kc = getattr(client, "kc", None)
        if kc is None:
            rows.append(f"   client {id(client):x}: no kernel client (ended)")
            continue
        loop = None
        for name in ("shell", "iopub", "stdin", "control"):
            sock = getattr(getattr(kc, f"{name}_channel", None), "socket", None)
            try:
                rows.append(f"   client {id(client):x} {name}: {_socket_state(sock, zmq)}")
                loop = loop or getattr(sock, "_current_loop", None)
            except Exception as e:  # noqa: BLE001 - evidence only: say why there is none
                rows.append(f"   client {id(client):x} {name}: {type(e).__name__}: {e}")
        if loop is not None:
            rows.append(f"   its loop: running {loop.is_running()}, ready callbacks {len(loop._ready)}, timers "
                        f"{len(loop._scheduled)}")
            for task in _tasks(asyncio, loop):
                where = " < ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in task.get_stack(limit=6))
                rows.append(f"     task {task.get_name()} {task.get_coro().__qualname__}: {where or 'no frame'}")
    return "\n" + "\n".join(rows) if rows else "\n   no notebook client in this process"


def _socket_state(sock, zmq) -> str:
    fd, events = sock.FD, sock._shadow_sock.get(zmq.EVENTS)
    selector = getattr(getattr(sock, "_current_loop", None), "_selector", None)
    mapped = fd in selector.get_map() if selector is not None else "?"
    epoll = selector._selector.fileno() if hasattr(selector, "_selector") else None
    in_epoll = (str(fd) in re.findall(TFD, Path(f"/proc/self/fdinfo/{epoll}").read_text())
                if epoll is not None else "?")
    waiting = [f"{e.kind}{' (done)' if e.future.done() else ''}" for e in list(sock._recv_futures)]
    return (f"fd {fd}, message waiting {bool(events & zmq.POLLIN)}; waiting on it: {', '.join(waiting) or 'none'} "
            f"(io state {sock._state}); in its loop's selector {mapped}, in that epoll (fd {epoll}) {in_epoll}")


def _tasks(asyncio, loop) -> list:
    for _ in range(5):      # the set may change while we read it from this thread
        try:
            return list(asyncio.all_tasks(loop))
        except RuntimeError:
            time.sleep(0.01)
    return []


def dump(nodeid: str, seconds: float) -> Path:
    """Write the evidence for one test now; returns the file."""
    beside = Path(sys.executable).with_name("py-spy")     # the venv's, when its bin is not on PATH
    spy = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
    me = psutil.Process()
    parts = [f"{nodeid}: still running after {seconds:.0f} s; load {os.getloadavg()}",
             "py-spy: " + (spy or "not installed (pip install py-spy for Python stacks)")]
    parts += [f"== pytest worker {me.pid} (a notebook's client){_connections(me)}{_wakeups(me.pid)}{_clients()}"]
    if spy:
        parts.append(_run([spy, "dump", "--nonblocking", "--pid", str(me.pid)]).split("\n\nCaused by")[0])
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


def pytest_terminal_summary(terminalreporter):
    """The missed wake-ups the papermill guard handed over in this run (each one a notebook run it saved)."""
    if hasattr(terminalreporter.config, "workerinput") or not WAKEUPS.is_file():
        return
    with WAKEUPS.open(encoding="utf-8") as f:
        f.seek(_WAKEUPS_BEFORE)
        lines = f.read().splitlines()
    if lines:
        terminalreporter.write_sep("=", f"papermill guard: {len(lines)} missed wake-up(s) handed over ({WAKEUPS})")
        for line in lines:
            terminalreporter.write_line(line)
