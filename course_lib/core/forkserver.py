"""The fork server of ``course_lib.core.warm`` (runs in its own process; imports only the standard library,
torch and setproctitle, so it has no thread to lose at fork). ``serve(path)``: see warm's docstring for the
protocol.

A rank ends with ``os._exit`` after atexit and a flush: an interpreter with torch loaded takes most of a second
to tear down. With ``COURSE_WARM_EXIT=python`` in its environment it leaves as ``python script.py`` does instead
(module teardown, garbage collection, atexit, then C's ``exit()`` with its static destructors), which is where
an exit abort ("terminate called without an active exception") shows. The tests run the DDP solution so."""
from __future__ import annotations

import atexit
import builtins
import gc
import io
import json
import os
import runpy
import select
import shutil
import signal
import socket
import sys
import threading
import types
from contextlib import suppress

MAX_MSG = 1 << 20
EXIT_VAR = "COURSE_WARM_EXIT"


def serve(path: str | None = None, preload=None) -> int:
    """``preload``: more modules to import before the first fork (``python -c ... PATH MODULE...``)."""
    import importlib

    import torch  # noqa: F401  the point of the server: imported once, before any fork
    import torch.distributed  # noqa: F401
    for name in [*(sys.argv[2:] if preload is None else preload), "setproctitle"]:
        try:
            importlib.import_module(name)
        except ImportError:
            pass   # the rank imports it itself (and says why it cannot)
    if len(os.listdir("/proc/self/task")) != 1:
        print("threads", flush=True)   # fork would copy one thread of several: the launcher starts cold
        return 1
    # What is imported now lives as long as every rank: out of the collector's sight (the gc docs' advice for
    # fork without exec), a rank's collections no longer walk, and so copy, the pages of torch's objects.
    gc.collect()
    gc.freeze()
    path = path or sys.argv[1]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    conns: dict = {}      # connection -> its child's pid (None until forked)
    children: dict = {}   # pid -> connection to report its exit code on (None: the launcher left)
    server = os.getpid()
    try:
        _loop(listener, conns, children)
    finally:
        if os.getpid() == server:   # not a rank leaving through the interpreter's exit (EXIT_VAR)
            for pid in children:   # the launcher is gone: nothing of ours stays
                _kill(pid)
            _reap(children)
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)   # the private dir the launcher made for us
    return 0


def _loop(listener, conns, children) -> None:
    while True:
        ready, _, _ = select.select([0, listener, *conns], [], [], 0.05)
        if 0 in ready and not os.read(0, 4096):
            return
        if listener in ready:
            conn, _ = listener.accept()
            conns[conn] = None
        for conn in [c for c in ready if c in conns]:
            if conns[conn] is None:
                _request(conn, listener, conns, children)
            elif not conn.recv(16):   # the launcher left: a child still running must not outlive it
                pid = conns.pop(conn)
                conn.close()
                if pid in children:
                    children[pid] = None
                    _kill(pid)
        _reap(children)


def _request(conn, listener, conns, children) -> None:
    fds: list = []
    try:
        msg, fds, _, _ = socket.recv_fds(conn, MAX_MSG, 2)
        req = json.loads(msg)
        started_r, started_w = os.pipe()
        pid = os.fork()
    except (OSError, ValueError) as e:
        for fd in fds:
            os.close(fd)
        conns.pop(conn)
        with suppress(OSError):
            conn.send(json.dumps({"error": str(e)}).encode())
        conn.close()
        return
    if pid == 0:
        for c in (listener, *conns):
            c.close()
        os.close(started_r)
        _child(req, fds, started_w)   # never returns
    for fd in fds:
        os.close(fd)
    os.close(started_w)
    os.read(started_r, 1)   # EOF once the child leads its own session: the launcher may kill its group now
    os.close(started_r)
    conns[conn], children[pid] = pid, conn
    with suppress(OSError):
        conn.send(json.dumps({"pid": pid}).encode())


def _kill(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        with suppress(OSError):
            kill(pid, signal.SIGKILL)


def _reap(children) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with suppress(OSError):
                conn.send(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode())


# ----- in the forked child -----

def _child(req: dict, fds: list, started: int) -> None:
    """``fds``: the rank's stdout and stderr, or one descriptor for both. Ends the process (module docstring)."""
    code, python_exit = 1, False
    try:
        os.setsid()
        os.close(started)
        _title(req["argv"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(fds[0], 1)
        os.dup2(fds[-1], 2)
        for fd in set(fds) - {1, 2}:
            os.close(fd)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        sys.stdout = sys.__stdout__ = _stream(1, unbuffered, "strict")
        sys.stderr = sys.__stderr__ = _stream(2, True, "backslashreplace")
        code = _run(req["argv"])
        python_exit = req["env"].get(EXIT_VAR) == "python" and code >= 0
        code = code if python_exit else _finish(code)
    finally:
        if not python_exit:
            os._exit(code)
    sys.exit(code)   # unwinds through serve(), which leaves the server's cleanup to the server


def _title(argv: list) -> None:
    """Show the rank's own command line in ps, top and /proc/PID/cmdline (a forked rank would show the
    server's). setproctitle writes it over the memory of the server's argv and environment, before the rank's
    environment is set."""
    try:
        from setproctitle import setproctitle
    except ImportError:
        return   # the rank runs the same; ps shows the server's command line
    setproctitle(" ".join([sys.executable, *argv]))


def _stream(fd: int, line_buffered: bool, errors: str):
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors=errors,
                            line_buffering=line_buffered, write_through=line_buffered)


def _run(argv: list) -> int:
    """Run the script as ``python *argv`` would; its exit code (SystemExit's, or 1 after a traceback)."""
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]     # runpy puts the module's file in argv[0]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            return 0
        # a script or -c: in a __main__ that lives until the process ends, as python's own does
        main = sys.modules["__main__"] = types.ModuleType("__main__")
        main.__builtins__ = builtins
        if argv[0] == "-c":
            sys.argv, sys.path[0], code = ["-c", *argv[2:]], "", compile(argv[1], "<string>", "exec")
        else:
            sys.argv, sys.path[0], main.__file__ = list(argv), os.path.dirname(os.path.realpath(argv[0])), argv[0]
            with open(argv[0], "rb") as f:
                code = compile(f.read(), argv[0], "exec")
        exec(code, main.__dict__)
        return 0
    except SystemExit as e:
        return _exit_code(e.code)
    except BaseException as e:
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__, "<frozen runpy>"):
            tb = tb.tb_next     # Python's own traceback starts at the script
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        return -signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _finish(code: int) -> int:
    """What the interpreter does on the way out: wait for non-daemon threads, atexit, flush."""
    try:
        threading._shutdown()
    except BaseException:
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120
    if code == -signal.SIGINT:   # as Python does: die of SIGINT after the traceback
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code
