"""Warm start: ranks forked from a server (``course_lib.runtime.forkserver``) that imported torch once, so a rank
costs a fork instead of an interpreter's start and torch's import (seconds of CPU each).

A request on the server's Unix socket carries argv, env, cwd and the rank's output pipe; the reply is the pid, and
later, on the same connection, the exit code (a forked rank is the server's child, not the launcher's). Under
torchrun the server forks torchrun's agent (``course_lib.runtime.warm_agent``), which forks its ranks, its children as
under torchrun, and hands each to the worker (``course_lib.runtime.warm_rank``) that asks for one.
A session's server is kept ``COURSE_WARM_KEEP`` seconds (default 120) for the next check with the same start-up
variables (IMPORT_TIME) and preloads; it ends at its stdin's EOF. ``COURSE_WARM=0``: every rank a fresh python.
Not multiprocessing's forkserver: course_lib.runtime.forkserver says why.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

from course_lib.runtime.proc import Started
from course_lib.runtime.rank_env import base_env

# Not KMP_*: those are Intel OpenMP's, and torch's wheels load GNU OpenMP (torch/lib/libgomp.so.1); scikit-learn
# sets two of them when imported (a checker that loads the digits would otherwise start every rank cold).
IMPORT_TIME = ("PYTHON", "TORCH", "PYTORCH", "OMP_", "MKL_", "OPENBLAS", "GOTO", "CUDA", "LD_")
READY_TIMEOUT = 300.0     # a loaded machine can take minutes to import torch
SOCKET_PATH_MAX = 107     # bytes of a Unix socket's path (sun_path holds 108 with the closing NUL: unix(7))
# what a DDP rank imports after torch, for a server to import once: DistributedDataParallel() imports torch._dynamo
# (1.5-2 s of CPU per rank on this machine's cores)
DDP_IMPORTS = ("torch._dynamo",)
KEEP_DEFAULT = 120.0     # seconds an idle server waits for the next session (COURSE_WARM_KEEP)
# the server's code: serve() returns only in a forked rank, which then runs the script here, at the top, and leaves
# through the interpreter's own exit (course_lib.runtime.forkserver)
SERVE = ("from course_lib.runtime import forkserver\nrank = forkserver.serve()\ntry:\n    forkserver.run(rank)\n"
         "except BaseException as e:\n    e.__traceback__ = forkserver.script_frames(e.__traceback__)\n    raise\n")
MAX_IDLE = 4             # idle servers kept at most (one per kind of check: a few hundred MB each)
_active: Server | None = None
_idle: list[Server] = []
_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get("COURSE_WARM", "1").strip().lower() not in ("0", "no", "false", "off")


def supported(argv) -> bool:
    """Only what follows ``python`` as a script, ``-m module`` or ``-c code`` (other flags: start cold)."""
    argv = list(argv)
    return bool(argv) and (argv[0] in ("-m", "-c") and len(argv) >= 2 or not argv[0].startswith("-"))


def _socket_dir() -> str:
    """A private folder (0700) for the server's socket: in TMPDIR, unless the socket's path would be longer than
    the 107 bytes a Unix socket address holds (a deep TMPDIR, such as the grader gives each sandbox: the server
    could not listen and every rank started cold); then in /tmp."""
    folder = tempfile.mkdtemp(prefix="course-warm-")
    if len(os.fsencode(os.path.join(folder, "sock"))) <= SOCKET_PATH_MAX:
        return folder
    os.rmdir(folder)
    return tempfile.mkdtemp(prefix="course-warm-", dir="/tmp")


def _keep_s() -> float:
    try:
        return max(0.0, float(os.environ.get("COURSE_WARM_KEEP", KEEP_DEFAULT)))
    except ValueError:
        return KEEP_DEFAULT


# ----- the launcher's side -----

class Server:
    """One fork server (started here, ready when first used); ``close()`` ends it and removes its dir."""

    def __init__(self, env: dict, preload=()):
        self.env, self.preload = dict(env), tuple(preload)
        self.idle_since: float | None = None
        self.dir = _socket_dir()
        self.path = os.path.join(self.dir, "sock")
        self.broken = False
        self._ready: bool | None = None
        self._lock = threading.Lock()
        # os._exit: an orderly shutdown of an interpreter with torch loaded takes most of a second, and the
        # check waits for the server to be gone (it has flushed all it says)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, self.path, *preload],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=self.dir,
            env=self.env, start_new_session=True)

    def ready(self, within: float = READY_TIMEOUT) -> bool:
        """Waits at most ``within`` seconds for the server's first line (launches side by side: one reads it, the
        others wait). Not there by then: False for this launch, whose deadline that was; a later one may wait again."""
        with self._lock:
            if self._ready is None:
                ok, _, _ = select.select([self.proc.stdout], [], [], max(0.0, min(within, READY_TIMEOUT)))
                if not ok and self.proc.poll() is None:
                    return False
                self._ready = bool(ok) and self.proc.stdout.readline().strip() == b"ready"
        return self._ready and not self.broken

    def starts_like(self, env: dict) -> bool:
        """A process with ``env`` would import torch as this server did (the same IMPORT_TIME variables)."""
        return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME)} == {
            k: v for k, v in self.env.items() if k.startswith(IMPORT_TIME)}

    def alive(self) -> bool:
        """Running, and its socket still there once it listens (a test or sandbox may have removed TMPDIR)."""
        return (not self.broken and self.proc.poll() is None
                and (self._ready is None or bool(self._ready) and os.path.exists(self.path)))

    def spawn(self, argv, env: dict, cwd) -> Started:
        """Fork one rank; OSError when the server cannot (the caller starts that rank cold)."""
        r, w = os.pipe()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.settimeout(60)
            conn.connect(self.path)
            # absolute: the server's own working folder is its socket's, where a relative path would point
            req = {"argv": list(argv), "env": dict(env), "cwd": os.path.abspath(cwd or os.getcwd())}
            socket.send_fds(conn, [json.dumps(req).encode()], [w])
            reply = json.loads(conn.recv(4096) or b'{"error": "server gone"}')
            if "pid" not in reply:
                raise OSError(reply.get("error", "no pid"))
            conn.settimeout(None)
            return Started(reply["pid"], os.fdopen(r, "rb"), conn=conn)
        except (OSError, ValueError) as e:
            self.broken = True
            conn.close()
            os.close(r)
            raise OSError(f"warm start failed: {e}") from e
        finally:
            os.close(w)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        server = Started(self.proc.pid, popen=self.proc)
        if server.exit_code(10) is None:
            server.stop(grace=0)   # with all it started: the ranks it did not get to end
        self.proc.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def session(env: dict | None = None, preload=()):
    """One server for every launch inside (all threads); None when COURSE_WARM=0 or inside another session
    (that one serves). ``env``: as launch(env=...) gets it; ``preload``: modules the ranks would import after
    torch, imported once by the server instead. The server is an idle one kept from an earlier session with the
    same start-up variables and preloads if there is one; on the way out it is kept for the next (``_keep_s``)."""
    global _active
    base = base_env(env)
    with _lock:
        if not enabled() or _active is not None:
            server = None
        else:
            server = _active = _take_idle(base, tuple(preload)) or Server(base, preload)
    try:
        yield server
    finally:
        if server is not None:
            with _lock:
                _active = None
            keep(server)


def _take_idle(env: dict, preload: tuple) -> Server | None:
    """(Under _lock.) A kept server that can serve this session, taken out of the idle list."""
    for server in list(_idle):
        if server.preload == preload and server.starts_like(env) and server.alive():
            _idle.remove(server)
            server.idle_since = None
            return server
    return None


def keep(server: Server) -> None:
    """Keep the server (a session's, or a launch's own) for the next session (ended after ``_keep_s()`` idle
    seconds), or end it now."""
    keep = _keep_s()
    if keep <= 0 or not server.alive():
        server.close()
        return
    with _lock:
        server.idle_since = since = time.monotonic()
        _idle.append(server)
        evicted = _idle[:-MAX_IDLE]
        del _idle[:-MAX_IDLE]
    for old in evicted:
        old.close()
    timer = threading.Timer(keep, _expire, (server, since))
    timer.daemon = True
    timer.start()


def _expire(server: Server, since: float) -> None:
    with _lock:
        if server.idle_since != since or server not in _idle:
            return   # taken by a session meanwhile (and maybe kept again, with a timer of its own)
        _idle.remove(server)
    server.close()


@atexit.register
def close_idle() -> None:
    """End every kept server now (also at exit; a process killed outright ends them by their stdin's EOF)."""
    with _lock:
        servers = list(_idle)
        _idle.clear()
    for server in servers:
        server.close()


def socket_dirs(procs) -> list[str]:
    """The folders of the fork servers among ``procs`` (psutil processes, read while they live). A server removes its
    own on the way out; one killed outright cannot: its killer removes them after the kill."""
    dirs = []
    for p in procs:
        with contextlib.suppress(Exception):   # psutil.Error (gone, not ours to read); ValueError: not a server
            argv = p.cmdline()
            folder = os.path.dirname(argv[argv.index(SERVE) + 1])
            if os.path.basename(folder).startswith("course-warm-"):
                dirs.append(folder)
    return dirs


def for_launch(warm: bool | None, base: dict, argv, within: float = READY_TIMEOUT) -> tuple[Server | None, bool]:
    """The server a launch uses and whether the launch owns it: the session's when there is one (warm None
    or True); for ``warm=True`` outside a session, one of its own, as a session of one launch gets it (a kept
    server, else a new one) and hands it on (``keep``); none for False or COURSE_WARM=0."""
    if warm is False or not enabled() or not supported(argv):
        return None, False
    server, own = _active, _active is None and bool(warm)
    if own:   # a launch of its own is a training run (a notebook's): its ranks build DDP
        with _lock:
            server = _take_idle(base, DDP_IMPORTS) or Server(base, DDP_IMPORTS)
    if server is not None and server.starts_like(base) and server.ready(within):
        return server, own
    if own:
        server.close()
    return None, False
