"""Run a script many times as W ranks, each rank forked from this interpreter after it imported torch once.

``python forked_runs.py RUNS WORLD TIMEOUT OUTDIR SCRIPT [ARGS...]``: run ``i`` is W processes in
``OUTDIR/run-i``, each with the environment srun gives a task (``course_lib.core.launch.srun_env``) and its
output in ``rank-R.log``. Unlike a rank of the course's fork server, which ends with ``os._exit``, a rank here
runs the script in a fresh ``__main__`` at the top level of this file and then falls off its end: the
interpreter's own way out (module teardown, garbage collection, atexit, then C's ``exit()`` with its static
destructors), which is where an exit abort happens. Only the start-up is shared: what this file imported is
frozen out of the collector's sight before the first fork (``gc.freeze``, as the fork server does), so a rank's
collections, the last one at exit included, walk the objects the script made, not the pages of torch's objects.
Prints a JSON line per run: the exit codes by rank (None: killed at the run's TIMEOUT) and the output of each rank.
"""
import builtins
import gc
import json
import os
import signal
import sys
import time
import types

import torch  # noqa: F401  what a cold rank spends its first seconds on, done once
import torch._dynamo  # noqa: F401  DistributedDataParallel.__init__ imports it
import torch.distributed  # noqa: F401
import torch.nn.parallel  # noqa: F401

from course_lib import data, metrics, model  # noqa: F401
from course_lib.core.launch import reserve_port, srun_env


def _wait(pids: dict, timeout: float) -> dict:
    """Exit code of each rank; a rank still running at the deadline is killed and gets None."""
    codes, deadline = {}, time.monotonic() + timeout
    while len(codes) < len(pids):
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            codes[pids[pid]] = os.waitstatus_to_exitcode(status)
        elif time.monotonic() > deadline:
            for p, rank in pids.items():
                if rank not in codes:
                    os.kill(p, signal.SIGKILL)
                    os.waitpid(p, 0)
            return {r: codes.get(r) for r in pids.values()}
        else:
            time.sleep(0.02)
    return codes


def parent(runs: int, world: int, timeout: float, outdir: str):
    """Fork the ranks run by run; returns (rank, env, folder) in a forked rank, None in this process."""
    if len(os.listdir("/proc/self/task")) != 1:
        sys.exit("forked_runs: a thread was started at import (set OMP_NUM_THREADS=1): fork would lose it")
    gc.collect()
    gc.freeze()   # else each rank's collections copy every page of torch's objects: half its CPU (measured)
    for i in range(runs):
        folder = os.path.join(outdir, f"run-{i}")
        os.makedirs(folder)
        held = reserve_port()
        pids = {}
        for rank in range(world):
            env = srun_env(rank, world, held.getsockname()[1])
            pid = os.fork()
            if pid == 0:
                held.close()
                return rank, env, folder
            pids[pid] = rank
        codes = _wait(pids, timeout)
        held.close()
        logs = {r: open(os.path.join(folder, f"rank-{r}.log"), errors="replace").read() for r in range(world)}
        print(json.dumps({"run": i, "codes": codes, "logs": logs}), flush=True)
    return None


def rank_main(rank: int, env: dict, folder: str, script: str, args: list) -> types.ModuleType:
    """Become ``python SCRIPT ARGS`` of task ``rank`` (up to running the script)."""
    log = os.open(os.path.join(folder, f"rank-{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(folder)
    sys.argv, sys.path[0] = [script, *args], os.path.dirname(script)
    main = types.ModuleType("__main__")
    main.__file__, main.__builtins__ = script, builtins
    sys.modules["__main__"] = main
    return main


if __name__ == "__main__":
    _runs, _world, _timeout, _outdir, _script, *_args = sys.argv[1:]
    _script = os.path.abspath(_script)
    _me = parent(int(_runs), int(_world), float(_timeout), _outdir)
    if _me is None:
        sys.exit(0)
    _main = rank_main(*_me, _script, _args)
    with open(_script) as _f:
        _code = compile(_f.read(), _script, "exec")
    del _f, _me
    exec(_code, _main.__dict__)   # then the interpreter ends as after `python SCRIPT`
