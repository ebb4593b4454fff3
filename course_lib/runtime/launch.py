"""Run a script as N processes on this machine, as srun (SLURM_PROCID, ..., MASTER_ADDR/PORT as the course's job
script exports them) or the real ``torchrun --standalone`` would on one node, under one deadline: the first rank
that fails stops the others after ``grace`` seconds, every process runs in its own session and is stopped with all
it started (``proc.stop_tree``), output comes live with a ``[rank N]`` prefix, long lines cut, the last ones kept.
Not torch.multiprocessing.spawn: it runs a function in ranks of its own, not a learner's script as srun or
torchrun start it.
"""
import contextlib
import os
import queue
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Sequence

from course_lib.core.result import LaunchResult, RankResult  # noqa: F401 - importable from here as before
from course_lib.runtime import proc
from course_lib.runtime import warm as warm_start
from course_lib.runtime.rank_env import base_env, srun_env  # noqa: F401 - importable from here as before
from course_lib.runtime.scope import bounded
from course_lib.runtime.warm_rank import SOCKET_VAR

MAX_LINE = 2000          # characters kept of one output line
TORCHRUN_PREFIX_ANY = re.compile(r"\[default(\d+)\]:")


def free_port() -> int:
    """A TCP port that is free now (the OS picks it, so two launches at once get different ones)."""
    with reserve_port() as s:
        return s.getsockname()[1]


def reserve_port() -> socket.socket:
    """A socket that holds a free port (``.getsockname()[1]``) for rank 0's store until the launch ends: a port let
    go at once could go to another run's socket before rank 0 binds it, and EADDRINUSE reads as two rank 0s. While
    a socket bound with SO_REUSEADDR holds it, Linux gives it to no bind(0) or connect() (tests/test_launch.py),
    and c10d's TCPStore, which sets SO_REUSEADDR too, may still listen on it (socket(7))."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


def _reader(stream, rank, q, closed):
    """Forward lines of one pipe to the queue; cuts very long lines instead of buffering them. ``closed``: rank ->
    when its pipe closed (as its process ended), which tells the first rank to fail from one that followed."""
    for raw in iter(lambda: stream.readline(MAX_LINE), b""):
        q.put((rank, raw.decode("utf-8", "replace").rstrip("\r\n")))
    closed[rank] = time.monotonic()
    q.put((rank, None))


def kill_group(popen: subprocess.Popen, grace: float = 3.0) -> None:
    """Stop ``popen`` (it leads its own session) with all it started, and reap it (``proc.Started.stop``)."""
    proc.Started(popen.pid, popen=popen).stop(grace)


def default_printer(rank: int, line: str) -> None:
    print(f"[rank {rank}] {line}" if rank >= 0 else f"[torchrun] {line}", flush=True)


def launch(script_args: Sequence[str], nprocs: int = 2, style: str = "srun", timeout: float = 120,
           env: dict | None = None, cwd: str | os.PathLike | None = None,
           on_line: Callable[[int, str], None] | None = default_printer, grace: float = 2.0,
           torchrun_args: Sequence[str] = (), stop: threading.Event | None = None, warm: bool | None = None,
           on_start: Callable[[int], None] | None = None) -> LaunchResult:
    """Run ``python *script_args`` as ``nprocs`` ranks on this machine; see the module docstring for the guarantees.
    (``course_lib.runs.launch`` runs them where the site says: here, or as a Slurm job.)

    ``script_args`` is what follows ``python``: a script and its arguments, or ``["-m", "module", ...]``.
    ``on_line(rank, line)`` sees each line as it comes (None: silent). ``torchrun_args`` go to torchrun itself
    (``["--max-restarts", "1"]``); the lines of every attempt go to the same ranks. ``stop``: when another
    thread sets it, the ranks are stopped as at the deadline (a caller running launches side by side uses it
    on Ctrl-C). ``warm``: ranks are forked from a server that imported torch once (``course_lib.runtime.warm``;
    under torchrun, its agent and each rank): None uses the server of an open ``warm.session()`` if any, True
    also without one (a kept server or a new one, kept after), False (or ``COURSE_WARM=0``) starts fresh ones.
    ``on_start(pid)`` is told each process started (a rank, or torchrun's agent), cold or warm. Inside a
    ``course_lib.runtime.scope.scope(seconds)`` (a check) the deadline is min(``timeout``, what is left of the scope's).
    """
    if style not in ("srun", "torchrun"):
        raise ValueError(f"style must be 'srun' or 'torchrun', not {style!r}")
    if torchrun_args and style != "torchrun":
        raise ValueError("torchrun_args need style='torchrun'")
    timeout, cutting = bounded(timeout)
    result = LaunchResult(style, nprocs, [RankResult(r) for r in range(nprocs)], timed_out=timeout <= 0)
    if result.timed_out:      # the enclosing check's deadline has passed: start nothing
        return _cut(result, cutting)
    base = base_env(env)
    q: queue.Queue = queue.Queue()
    procs: list[proc.Started] = []
    log_dir = held = None
    server, own_server = warm_start.for_launch(warm, base, script_args, within=timeout)
    start = time.monotonic()
    try:
        if style == "srun":
            held = reserve_port()
            port = held.getsockname()[1]
            for rank in range(nprocs):
                procs.append(_start(script_args, srun_env(rank, nprocs, port, base), cwd, server))
        else:
            log_dir = tempfile.TemporaryDirectory(prefix="torchrun-logs-")
            procs.append(_start_torchrun(script_args, nprocs, log_dir.name, torchrun_args, base, cwd, server))
        for p in procs if on_start else ():
            on_start(p.pid)
        closed: dict = {}
        for i, p in enumerate(procs):
            threading.Thread(target=_reader, args=(p.stdout, i, q, closed), daemon=True).start()
        _supervise(result, procs, q, start + timeout, grace, on_line, stop, closed)
    finally:
        for p in procs:
            p.stop()
        result.elapsed = time.monotonic() - start
        if held is not None:
            held.close()
        if own_server:
            warm_start.keep(server)
        if log_dir is not None:
            log_dir.cleanup()
    return _cut(result, cutting)


def _cut(result: LaunchResult, cutting: list) -> LaunchResult:
    """Mark the scopes whose deadline ended ``result``."""
    if result.timed_out:
        for s in cutting:
            s.cut = True
    return result


def _start_torchrun(script_args, nprocs: int, log_dir: str, torchrun_args, base: dict, cwd, server) -> proc.Started:
    """torchrun's agent for ``nprocs`` ranks; warm, the server forks the agent (warm_agent), whose worker for each
    rank (warm_rank) has the agent start the rank, its child, forked ahead."""
    args = ["--standalone", f"--nproc_per_node={nprocs}", "--tee=3", f"--log-dir={log_dir}", *torchrun_args]
    agent = ["-m", "course_lib.runtime.warm_agent", *args, "-m", "course_lib.runtime.warm_rank", *script_args]
    return _start(["-m", "torch.distributed.run", *args, *script_args], base, cwd, server,
                  (agent, {**base, SOCKET_VAR: server and server.path}))


def _start(argv: list, env: dict, cwd, server, warm: tuple | None = None) -> proc.Started:
    """``python *argv``, forked by the warm server if there is one (``warm``: the (argv, env) it gets there instead),
    else, or when the server says why it cannot (then the next ones start cold too), a fresh interpreter."""
    if server is not None and not server.broken:
        with contextlib.suppress(OSError):
            return server.spawn(*(warm or (argv, env)), cwd)
    p = subprocess.Popen([sys.executable, *argv], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    return proc.Started(p.pid, p.stdout, p)


def _route(result: LaunchResult, style: str, stream_idx: int, line: str) -> list[tuple[int, str]]:
    """Which rank printed ``line``: the stream's own for srun-style, torchrun's [defaultN]: prefix otherwise."""
    if style != "torchrun":
        return [(stream_idx, line)]
    whole = rejoin_tee(line, result.partial)
    return [(-1, line)] if whole is None else whole   # None: torchrun's own messages


def rejoin_tee(line: str, partial: dict, key=lambda rank: rank) -> list[tuple[int, str]] | None:
    """The whole lines in a line of torchrun's --tee output, as ``(key(rank), text)``; None if it is not one.

    --tee copies each rank's log file to stdout as it grows, so a line the rank wrote in two pieces (print's
    text, then its newline, unbuffered) can come out as "[default0]:text[default0]:" or cut by another rank's
    "[default1]:...": the pieces wait in ``partial`` (per key) and a line is given once it is whole. What is
    left in ``partial`` at the end are last pieces whose newline never came."""
    pieces = TORCHRUN_PREFIX_ANY.split(line)   # "", rank, text, rank, text, ...
    if len(pieces) == 1 or pieces[0]:
        return None
    segments = list(zip(map(int, pieces[1::2]), pieces[2::2]))
    whole = []
    for i, (rank, text) in enumerate(segments):
        text = partial.pop(key(rank), "") + text
        if i < len(segments) - 1:
            partial[key(rank)] = text   # cut short by the next prefix: the rest comes later
        else:
            whole.append((key(rank), text))
    return whole


def _supervise(result, procs, q, deadline, grace, on_line, stop, closed):
    open_streams = len(procs)
    stop_at = None   # set when a rank failed: the others get `grace` seconds
    while True:
        now = time.monotonic()
        limit = min(deadline, stop_at) if stop_at else deadline
        try:
            idx, line = q.get(timeout=max(0.0, min(0.2, limit - now)))
            if line is None:
                open_streams -= 1
            else:
                for rank, text in _route(result, result.style, idx, line):
                    result.deliver(rank, text, on_line)
        except queue.Empty:
            pass
        _collect_exit_codes(result, procs, closed)
        if stop_at is None and _failed(result):   # (a named failed rank is one of these)
            stop_at = time.monotonic() + grace
        if all(p.exit_code() is not None for p in procs) and open_streams == 0:
            break
        now = time.monotonic()
        if now >= deadline:
            result.timed_out = True
            break
        if (stop_at and now >= stop_at) or (stop is not None and stop.is_set()):
            break
    for rank, text in sorted(result.partial.items()):   # a last piece whose newline never came
        result.deliver(rank, text, on_line)
    result.partial.clear()
    _collect_exit_codes(result, procs, closed, final=True)
    if result.style == "torchrun":
        _torchrun_codes(result, procs[0])


def _collect_exit_codes(result, procs, closed, final=False):
    """Exit codes of the ranks that ended. The first to fail, of those seen failed in one look, is the one whose
    pipe closed first (``closed``), not the lowest rank: under load the supervisor looks late, and rank 1 that ran
    out of memory and rank 0 that lost its connection to it are both gone by then."""
    if result.style != "srun":
        return
    for rank, p in enumerate(procs):
        result.ranks[rank].returncode = p.exit_code()   # None until it ends; then kept by p
    failed = _failed(result)
    # wait (a few ms) for the pipes of the failed ranks to close, unless this is the last look
    if failed and result.failed_rank is None and (final or all(r in closed for r in failed)):
        result.failed_rank = min(failed, key=lambda r: (closed.get(r, float("inf")), r))


def _failed(result) -> list[int]:
    return [r.rank for r in result.ranks if r.returncode not in (None, 0)]


FAILURE_ROW = re.compile(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def _torchrun_codes(result, leader):
    """torchrun reports only its own exit code; read the failed ranks from its failure summary."""
    result.returncode = leader.exit_code()
    if result.returncode is None:
        return   # still running: deadline or stopped, per-rank codes stay unknown
    if result.returncode == 0:
        for r in result.ranks:
            r.returncode = 0
        return
    text = "\n".join(result.launcher_lines)
    failed = {int(rk): int(code) for rk, code in FAILURE_ROW.findall(text)}
    for r in result.ranks:
        r.returncode = failed.get(r.rank, r.returncode)
    if failed:
        result.failed_rank = min(failed)
    else:
        result.failed_rank = 0
        result.ranks[0].returncode = result.returncode
