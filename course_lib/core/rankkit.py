"""The toolkit a rank process uses: markers for the checker, where the learner's code is, deadlines,
guards on torch.distributed, and which rank this process is.

A checker runs its worker as ranks (``course_lib.core.launch``); the worker talks back through markers,
one JSON object per line after ``@@ `` (``emit`` here, ``parse`` in the checker). torch is imported
inside the functions that need it, so the checker side can import this module cheaply.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from typing import Callable, NamedTuple

PREFIX = "@@ "


# ---- markers ---------------------------------------------------------------------------------------------

def emit(event: str, **fields) -> None:
    """Print ``@@ {"ev": event, ...}`` and flush, so the checker sees it even if the rank dies next."""
    print(PREFIX + json.dumps({"ev": event, **fields}), flush=True)


def parse(line: str) -> dict | None:
    """The marker ``emit`` printed on ``line``; None for any other line (the learner's own output)."""
    if not line.startswith(PREFIX):
        return None
    try:
        event = json.loads(line[len(PREFIX):])
    except ValueError:
        return None
    return event if isinstance(event, dict) and "ev" in event else None


# ---- where in the learner's file ----------------------------------------------------------------------------

def worker_failed(nprocs: int, result, lines: dict) -> dict:
    """The verdict of a check run whose worker itself failed (an import error, a crash): the launch's summary and
    the last 8 lines the ranks printed that are not protocol lines (``lines``: rank -> its lines)."""
    tail = [line for r in sorted(lines) for line in lines[r] if parse(line) is None][-8:]
    return {"case": "worker", "item": None, "rank": 0, "ok": False,
            "message": f"the check run on {nprocs} ranks failed: {result.summary()}\n" + "\n".join(tail)}


def learner_frame(frames, path: str) -> traceback.FrameSummary | None:
    """The innermost frame of ``frames`` that is in the learner's file ``path``; None when none is."""
    real = os.path.realpath(path)
    mine = [f for f in frames if os.path.realpath(f.filename) == real]
    return mine[-1] if mine else None


def learner_line(frames, path: str) -> str:
    """'allreduce.py:42 in ring_allreduce: dist.send(x, 1)' for the innermost frame in the learner's file."""
    f = learner_frame(frames, path)
    if f is None:
        return ""
    return f"{os.path.basename(path)}:{f.lineno} in {f.name}: {(f.line or '').strip()}"


def error_where(exc: BaseException, path: str) -> str:
    """``learner_line`` for an exception; a SyntaxError has no frame there, only its line: 'file.py:LINE: text'."""
    if isinstance(exc, SyntaxError):
        return f"{os.path.basename(path)}:{exc.lineno}: {(exc.text or '').strip()}"
    return learner_line(traceback.extract_tb(exc.__traceback__), path)


def explain(exc: BaseException, path: str, shown: str) -> str:
    """One line for an exception the learner's code raised, pointing at their file (named ``shown``) when it can."""
    frame = learner_frame(traceback.extract_tb(exc.__traceback__), path)
    where = f" ({shown} line {frame.lineno}, in {frame.name})" if frame else ""
    if isinstance(exc, NotImplementedError):
        return f"not written yet: NotImplementedError{where}"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}{where}"


def main_thread_frames() -> list[traceback.FrameSummary]:
    """Where the main thread is now, outermost first (from another thread: a watchdog's)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    return traceback.extract_stack(frame) if frame is not None else []


# ---- deadlines ------------------------------------------------------------------------------------------------

def exit_now(code: int = 0) -> None:
    """Flush, then leave at once: an orderly shutdown with torch loaded is slow, and a learner's unfinished
    send or a stuck collective could make it hang."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Watchdog:
    """A deadline for one piece of work: if it is not over in time, ``on_fire`` says where the main thread
    waits (it gets ``main_thread_frames()`` and the arguments of ``arm``), then the process exits.

    The deadline is kept on a clock of a core's fair share (``core_share``): while the machine's load is above
    its cores, it runs slower, by at most SLOWEST, so work that is only slow because the machine is busy (a room
    of learners on one node, CI) is not called stuck. A real hang waits on an idle machine as on a
    busy one: it fires, later on a busy one. The launch's own deadline still bounds the whole run."""

    TICK = 0.1
    SLOWEST = 0.25

    def __init__(self, seconds: float, on_fire: Callable[..., None], exit_code: int = 3):
        self.seconds, self.on_fire, self.exit_code = seconds, on_fire, exit_code
        self._stop: threading.Event | None = None

    def arm(self, *args) -> None:
        self.disarm()
        self._stop = threading.Event()
        threading.Thread(target=self._count, args=(self._stop, args), daemon=True).start()

    def disarm(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def _count(self, stop: threading.Event, args) -> None:
        # the time that really passed, not TICK: on a busy machine this thread wakes late, and counting ticks made
        # each rank's clock as slow as its own wake-ups; two ranks of one deadlock then fired seconds apart, and
        # the first to exit had the launcher stop the other before it said where it waited (CI, four workers)
        left, last = self.seconds, time.monotonic()
        while left > 0:
            if stop.wait(self.TICK):
                return
            now = time.monotonic()
            left -= (now - last) * max(self.SLOWEST, core_share())
            last = now
        self._fire(*args)

    def _fire(self, *args) -> None:
        try:
            self.on_fire(main_thread_frames(), *args)
        finally:   # the main thread is stuck: whatever on_fire did, this process ends here
            exit_now(self.exit_code)


def core_share() -> float:
    """The share of a core a runnable process gets: cores / the 1-minute load average, at most 1 (1 where the
    load cannot be read). A smooth figure that every rank of a launch reads alike, so that their watchdogs
    fire together (one that fired first would end its rank, and its peers would see a closed connection)."""
    try:
        load = os.getloadavg()[0]
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    except OSError:
        return 1.0
    return min(1.0, cores / load) if load > 0 else 1.0


# ---- guards on torch.distributed ------------------------------------------------------------------------------

class ForbiddenCollective(Exception):
    """A guarded function was called in "forbid" mode; ``str()`` is 'dist.NAME', as messages quote it (a
    collective reached another way, through a ProcessGroup object, the functional collectives or torch.ops, says so)."""

    def __init__(self, name: str, other_way: bool = False):
        super().__init__(f"{name} (through a ProcessGroup object, functional collectives or torch.ops, not dist.{name})"
                         if other_way else f"dist.{name}")
        self.name = name


# The other ways to a collective: the methods of a ProcessGroup object (dist.group.WORLD, _get_default_group())
# and of its backends, and the functional collectives. Each is caught by its torch.distributed name.
GROUP_METHODS = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce_coalesced", "allgather": "all_gather",
    "allgather_coalesced": "all_gather_coalesced", "allgather_into_tensor_coalesced": "all_gather_into_tensor",
    "_allgather_base": "all_gather_into_tensor", "all_gather_single": "all_gather_into_tensor", "reduce": "reduce",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor", "reduce_scatter_single": "reduce_scatter_tensor",
    "broadcast": "broadcast", "barrier": "barrier", "monitored_barrier": "monitored_barrier",
    "alltoall": "all_to_all", "alltoall_base": "all_to_all_single", "all_to_all_single": "all_to_all_single",
    "scatter": "scatter", "gather": "gather"}
FUNCTIONAL_PREFIXES = {"all_reduce": "all_reduce", "all_gather": "all_gather_into_tensor", "reduce_scatter":
                       "reduce_scatter_tensor", "all_to_all": "all_to_all_single", "broadcast": "broadcast",
                       "permute_tensor": "all_to_all_single"}
# The dispatcher's own ops, callable from Python as torch.ops.NAMESPACE.OP (ProcessGroup methods reach them in C++,
# the functional collectives from Python: both are caught above, so the ops are only seen when called directly).
OPS = {"c10d": {"allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce_coalesced", "allgather_": "all_gather",
                "allgather_coalesced_": "all_gather_coalesced", "allgather_into_tensor_coalesced_":
                "all_gather_into_tensor", "_allgather_base_": "all_gather_into_tensor", "reduce_": "reduce",
                "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter_tensor",
                "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor", "broadcast_": "broadcast",
                "barrier": "barrier", "monitored_barrier_": "monitored_barrier", "alltoall_": "all_to_all",
                "alltoall_base_": "all_to_all_single", "scatter_": "scatter", "gather_": "gather"},
       "_c10d_functional": {"all_reduce": "all_reduce", "all_reduce_": "all_reduce",
                            "all_reduce_coalesced": "all_reduce", "all_reduce_coalesced_": "all_reduce",
                            "all_gather_into_tensor": "all_gather_into_tensor",
                            "all_gather_into_tensor_out": "all_gather_into_tensor",
                            "all_gather_into_tensor_coalesced": "all_gather_into_tensor",
                            "reduce_scatter_tensor": "reduce_scatter_tensor",
                            "reduce_scatter_tensor_out": "reduce_scatter_tensor",
                            "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
                            "all_to_all_single": "all_to_all_single", "broadcast": "broadcast",
                            "broadcast_": "broadcast"}}


def _other_ways():
    """(owner, attribute, torch.distributed name) of every other way to a collective that exists here."""
    import torch
    import torch._C._distributed_c10d as c
    import torch.distributed._functional_collectives as funcol
    out = [(cls, m, name) for cls in (c.ProcessGroup, c.Backend) for m, name in GROUP_METHODS.items()
           if m in vars(cls)]
    for attr, fn in vars(funcol).items():
        prefix = next((p for p in FUNCTIONAL_PREFIXES if attr.startswith(p)), None)
        if prefix and callable(fn) and not attr.endswith(("_backward", "_setup_context", "_meta")):
            out.append((funcol, attr, FUNCTIONAL_PREFIXES[prefix]))
    for namespace, ops in OPS.items():
        owner = getattr(torch.ops, namespace)
        for op, name in ops.items():
            if hasattr(owner, op):   # looked up once, so that it is an attribute of the namespace from now on
                out.append((owner, op, name))
    return out


class CollectiveGuard:
    """While active, the named functions of torch.distributed (and distributed_c10d) are replaced.

    mode "forbid": a call is recorded in ``.used`` and raises ``ForbiddenCollective``; "count": a call
    adds 1 to ``.counts[name]`` and runs the real function (a call made from inside another guarded one,
    torch's own, is not counted). Activate it before the learner's file is imported, so that a
    ``from torch.distributed import all_reduce`` there binds the replacement too. A collective reached
    another way (``dist.group.WORLD.allreduce``, ``_get_default_group()``, the functional collectives, the ops
    ``torch.ops.c10d.*``) is
    caught where it meets the process group (``_other_ways``): in "forbid" mode any collective, in "count" mode
    those named.
    """

    def __init__(self, names, mode: str = "forbid"):
        if mode not in ("forbid", "count"):
            raise ValueError(f"mode must be 'forbid' or 'count', not {mode!r}")
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        self.mode, self.names = mode, set(names)
        self.used: list[str] = []
        self.counts: dict[str, int] = {}
        self._depth = threading.local()
        self._originals = {(m, name): getattr(m, name) for m in (dist, c10d) for name in names if hasattr(m, name)}
        self._replacements = {key: self._wrap(key[1], fn) for key, fn in self._originals.items()}
        for owner, attr, name in _other_ways():
            fn = vars(owner)[attr]
            self._originals[(owner, attr)] = fn
            self._replacements[(owner, attr)] = self._wrap_other(name, fn)

    def _wrap(self, name: str, fn):
        def forbidden(*args, **kwargs):
            self.used.append(name)
            raise ForbiddenCollective(name)

        def counted(*args, **kwargs):
            if getattr(self._depth, "n", 0) == 0:
                self.counts[name] = self.counts.get(name, 0) + 1
            return self._inside(fn, args, kwargs)

        wrapper = forbidden if self.mode == "forbid" else counted
        wrapper.__name__, wrapper.__wrapped__ = name, fn
        return wrapper

    def _wrap_other(self, name: str, fn):
        """A collective reached another way: forbidden, or counted when it is one of ``names``."""
        def other(*args, **kwargs):
            if getattr(self._depth, "n", 0) == 0:
                if self.mode == "forbid":
                    self.used.append(name)
                    raise ForbiddenCollective(name, other_way=True)
                if name in self.names:
                    self.counts[name] = self.counts.get(name, 0) + 1
            return self._inside(fn, args, kwargs)
        other.__name__, other.__wrapped__ = getattr(fn, "__name__", name), fn
        return other

    def _inside(self, fn, args, kwargs):
        """Call ``fn`` as seen already: the collectives it reaches by the other ways are not seen again."""
        depth = getattr(self._depth, "n", 0)
        self._depth.n = depth + 1
        try:
            return fn(*args, **kwargs)
        finally:
            self._depth.n = depth

    def __enter__(self) -> CollectiveGuard:
        for (module, name), wrapper in self._replacements.items():
            setattr(module, name, wrapper)
        return self

    def __exit__(self, *exc) -> bool:
        for (module, name), fn in self._originals.items():
            setattr(module, name, fn)
        return False

    def original(self, name: str):
        """The real function, to call from the checker's own code while the guard is active (``__wrapped__``
        is the function itself)."""
        modules = ("torch.distributed", "torch.distributed.distributed_c10d")
        for (module, n), fn in self._originals.items():
            if n == name and getattr(module, "__name__", "") in modules:
                return self._passing(fn)
        raise KeyError(name)

    def _passing(self, fn):
        def passed(*args, **kwargs):
            return self._inside(fn, args, kwargs)
        passed.__wrapped__ = fn
        return passed

    def take(self) -> dict[str, int]:
        """The counts so far, and start again from none."""
        counts, self.counts = self.counts, {}
        return counts


# ---- which rank -----------------------------------------------------------------------------------------------

class RankEnvError(ValueError):
    pass


class RankEnv(NamedTuple):
    rank: int
    local_rank: int
    world_size: int
    launcher: str          # "torchrun" or "srun"


LAUNCHERS = (  # launcher, (rank, local rank, world size) variables; torchrun first: under torchrun in a
    # Slurm job, srun's variables are inherited and describe the one torchrun task, not this rank
    ("torchrun", ("RANK", "LOCAL_RANK", "WORLD_SIZE")),
    ("srun", ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS")),
)


def rank_env(env=None) -> RankEnv:
    """This process's rank, local rank and world size, from torchrun's variables or else srun's."""
    env = os.environ if env is None else env
    for launcher, names in LAUNCHERS:
        if names[0] not in env:
            continue
        rank, world = _int(env, names[0], launcher), _int(env, names[2], launcher)
        local = _int(env, names[1], launcher) if names[1] in env else rank
        if not 0 <= rank < world:
            raise RankEnvError(f"{names[0]}={rank} is not a rank of {names[2]}={world} ({launcher})")
        return RankEnv(rank, local, world, launcher)
    raise RankEnvError("no rank in the environment: run this as one rank of srun (SLURM_PROCID, SLURM_LOCALID, "
                       "SLURM_NTASKS) or torchrun (RANK, LOCAL_RANK, WORLD_SIZE), e.g. with course_lib.core.launch")


def _int(env, name: str, launcher: str) -> int:
    value = env.get(name)
    if value is None:
        raise RankEnvError(f"{name} is not set, but {launcher}'s other variables are")
    try:
        return int(value)
    except ValueError:
        raise RankEnvError(f"{name}={value!r} is not a whole number ({launcher} sets it)") from None
