"""The fork server of ``course_lib.runtime.warm`` (its own process; it imports only the standard library, torch,
psutil and setproctitle, so it has no thread to lose at fork). Not multiprocessing's forkserver: that one runs a
Python function in a child it owns, not a learner's script with its own argv, environment, cwd, output and exit.
A forked rank leaves as ``python script.py`` does: ``serve()`` returns in the child, whose ``-c`` code
(``warm.SERVE``) runs the script at its top level, so Python itself prints what it raises, joins its threads, runs
atexit, tears down (where an exit abort shows) and dies of SIGINT after a KeyboardInterrupt."""
import builtins
import gc
import importlib
import io
import json
import os
import runpy
import select
import shutil
import socket
import sys
import types
from contextlib import suppress

from course_lib.runtime.proc import stop_tree

MAX_MSG = 1 << 20


def serve():
    """Serve until stdin's EOF, then end the server (``os._exit``: no teardown of torch, most of a second).
    Returns only in a forked rank: what ``run()`` needs. ``python -c SERVE PATH MODULE...``: the socket's path, and
    more modules to import before the first fork."""
    # deferred: the point of the server, torch imported once here, before any fork (not by whoever imports this)
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    for name in [*sys.argv[2:], "setproctitle"]:
        try:
            importlib.import_module(name)
        except ImportError:
            pass   # the rank imports it itself (and says why it cannot)
    if not one_thread():
        print("threads", flush=True)   # fork would copy one thread of several: the launcher starts cold
        return 1
    # What is imported now lives as long as every rank: out of the collector's sight (the gc docs' advice for
    # fork without exec), a rank's collections no longer walk, and so copy, the pages of torch's objects.
    gc.collect()
    gc.freeze()
    path = sys.argv[1]
    listener = listen(path)
    print("ready", flush=True)
    rank = serve_forks(listener, 0, _fork)
    if rank is None:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)   # the private dir the launcher made for us
        os._exit(0)
    return rank


def one_thread() -> bool:
    """Whether this process has one thread, so that a fork copies all of it (locks held by no one)."""
    return len(os.listdir("/proc/self/task")) == 1


def listen(path: str) -> socket.socket:
    """The Unix socket a launcher (or torchrun's worker) sends its requests to."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    return listener


def serve_forks(listener, end: int, start):
    """Start a rank for each request on ``listener`` (``start(req, fds, inherited)``: its pid, and in a child forked
    there, (0, what ``run()`` needs)), report each one's exit code, until ``end`` (a descriptor) reads EOF; then stop
    what still runs. Returns None, or in a forked rank what ``run()`` needs."""
    conns: dict = {}      # connection -> its child's pid (None until started)
    children: dict = {}   # pid -> connection to report its exit code on (None: the launcher left)
    server = os.getpid()
    try:
        return _loop(listener, conns, children, end, start)
    finally:
        if os.getpid() == server:   # not a forked rank on its way to run()
            for pid in children:   # the launcher is gone: nothing of ours stays (each rank leads its own group)
                stop_tree([pid], group=pid)
            _reap(children)


def _loop(listener, conns, children, end, start):
    """None when the server is to end; in a forked rank, its request (``run()``)."""
    while True:
        ready, _, _ = select.select([end, listener, *conns], [], [], 0.05)
        if end in ready and not os.read(end, 4096):
            return None
        if listener in ready:
            conn, _ = listener.accept()
            conns[conn] = None
        for conn in [c for c in ready if c in conns]:
            if conns[conn] is None:
                rank = _request(conn, listener, conns, children, start)
                if rank is not None:
                    return rank
            elif not conn.recv(16):   # the launcher left: a child still running must not outlive it
                pid = conns.pop(conn)
                conn.close()
                if pid in children:
                    children[pid] = None
                    stop_tree([pid], group=pid)
        _reap(children)


def _request(conn, listener, conns, children, start):
    """Start the rank a request asks for; returns only in a child forked here: what ``run()`` needs."""
    fds: list = []
    try:
        msg, fds, _, _ = socket.recv_fds(conn, MAX_MSG, 2)
        pid, rank = start(json.loads(msg), fds, [listener, *conns])
    except (OSError, ValueError, IndexError) as e:
        for fd in fds:
            os.close(fd)
        conns.pop(conn)
        with suppress(OSError):
            conn.send(json.dumps({"error": str(e) or type(e).__name__}).encode())
        conn.close()
        return None
    if pid == 0:
        return rank
    for fd in fds:
        os.close(fd)
    conns[conn], children[pid] = pid, conn
    with suppress(OSError):
        conn.send(json.dumps({"pid": pid}).encode())
    return None


def _fork(req, fds, inherited):
    """The server's start: a fork; the parent waits until the child leads its own session (the launcher may kill
    its group then)."""
    started_r, started_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        for c in inherited:
            c.close()
        os.close(started_r)
        return 0, (req, fds, started_w)
    os.close(started_w)
    os.read(started_r, 1)   # EOF once the child has called setsid()
    os.close(started_r)
    return pid, None


def _reap(children) -> None:
    """Report the exit of each child that ended (by pid: under torchrun the process has children of its own)."""
    for pid in list(children):
        with suppress(ChildProcessError):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == 0:
                continue
            conn = children.pop(pid)
            if conn is not None:
                with suppress(OSError):
                    conn.send(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode())


# ----- in the forked child -----

def run(rank) -> None:
    """Set the process up as ``python *argv`` would be, then run the script (``rank``: what ``serve()`` returned).
    ``fds``: the rank's stdout and stderr, or one descriptor for both."""
    req, fds, started = rank
    os.setsid()
    os.close(started)   # the launcher may kill the rank's group now
    title(req["argv"])
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
    _run(req["argv"])


def script_frames(tb):
    """The traceback of what a rank raised as ``python script.py`` prints it: from the script's first frame (not
    the server's ``-c`` code, runpy or this package: under torchrun, warm_agent too)."""
    tb = tb and tb.tb_next   # the -c code's own frame
    while tb is not None and (tb.tb_frame.f_code.co_filename in (runpy.__file__, "<frozen runpy>")
                              or os.path.dirname(tb.tb_frame.f_code.co_filename) == os.path.dirname(__file__)):
        tb = tb.tb_next
    return tb


def title(argv: list) -> None:
    """Show the rank's own command line in ps, top and /proc/PID/cmdline (a forked rank would show the
    server's). setproctitle writes it over the memory of the server's argv and environment, before the rank's
    environment is set."""
    try:
        from setproctitle import setproctitle  # deferred: optional, and imported by the server before fork
    except ImportError:
        return   # the rank runs the same; ps shows the server's command line
    setproctitle(" ".join([sys.executable, *argv]))


def _stream(fd: int, line_buffered: bool, errors: str):
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors=errors,
                            line_buffering=line_buffered, write_through=line_buffered)


def _run(argv: list) -> None:
    """Run the script as ``python *argv`` would, in a fresh ``__main__``; what it raises goes up to the server's
    ``-c`` code."""
    main = sys.modules["__main__"] = types.ModuleType("__main__")
    main.__builtins__ = builtins
    if argv[0] == "-m":
        sys.argv, sys.path[0] = list(argv[1:]), os.getcwd()
        runpy._run_module_as_main(argv[1])   # what ``python -m`` itself calls (Modules/main.c)
        return
    if argv[0] == "-c":
        sys.argv, sys.path[0], code = ["-c", *argv[2:]], "", compile(argv[1], "<string>", "exec")
    else:
        sys.argv, sys.path[0], main.__file__ = list(argv), os.path.dirname(os.path.realpath(argv[0])), argv[0]
        with open(argv[0], "rb") as f:
            code = compile(f.read(), argv[0], "exec")
    exec(code, main.__dict__)
