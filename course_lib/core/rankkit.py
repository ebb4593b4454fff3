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
    waits (it gets ``main_thread_frames()`` and the arguments of ``arm``), then the process exits."""

    def __init__(self, seconds: float, on_fire: Callable[..., None], exit_code: int = 3):
        self.seconds, self.on_fire, self.exit_code = seconds, on_fire, exit_code
        self.timer: threading.Timer | None = None

    def arm(self, *args) -> None:
        self.disarm()
        self.timer = threading.Timer(self.seconds, self._fire, args=args)
        self.timer.daemon = True
        self.timer.start()

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fire(self, *args) -> None:
        try:
            self.on_fire(main_thread_frames(), *args)
        finally:   # the main thread is stuck: whatever on_fire did, this process ends here
            exit_now(self.exit_code)


# ---- guards on torch.distributed ------------------------------------------------------------------------------

class ForbiddenCollective(Exception):
    """A guarded function was called in "forbid" mode; ``str()`` is 'dist.NAME', as messages quote it."""

    def __init__(self, name: str):
        super().__init__(f"dist.{name}")
        self.name = name


class CollectiveGuard:
    """While active, the named functions of torch.distributed (and distributed_c10d) are replaced.

    mode "forbid": a call is recorded in ``.used`` and raises ``ForbiddenCollective``; "count": a call
    adds 1 to ``.counts[name]`` and runs the real function (a call made from inside another guarded one,
    torch's own, is not counted). Activate it before the learner's file is imported, so that a
    ``from torch.distributed import all_reduce`` there binds the replacement too.
    """

    def __init__(self, names, mode: str = "forbid"):
        if mode not in ("forbid", "count"):
            raise ValueError(f"mode must be 'forbid' or 'count', not {mode!r}")
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        self.mode = mode
        self.used: list[str] = []
        self.counts: dict[str, int] = {}
        self._depth = threading.local()
        self._originals = {(m, name): getattr(m, name) for m in (dist, c10d) for name in names if hasattr(m, name)}
        self._replacements = {key: self._wrap(key[1], fn) for key, fn in self._originals.items()}

    def _wrap(self, name: str, fn):
        def forbidden(*args, **kwargs):
            self.used.append(name)
            raise ForbiddenCollective(name)

        def counted(*args, **kwargs):
            depth = getattr(self._depth, "n", 0)
            if depth == 0:
                self.counts[name] = self.counts.get(name, 0) + 1
            self._depth.n = depth + 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth.n = depth

        wrapper = forbidden if self.mode == "forbid" else counted
        wrapper.__name__, wrapper.__wrapped__ = name, fn
        return wrapper

    def __enter__(self) -> CollectiveGuard:
        for (module, name), wrapper in self._replacements.items():
            setattr(module, name, wrapper)
        return self

    def __exit__(self, *exc) -> bool:
        for (module, name), fn in self._originals.items():
            setattr(module, name, fn)
        return False

    def original(self, name: str):
        """The real function, to call from the checker's own code while the guard is active."""
        for (_module, n), fn in self._originals.items():
            if n == name:
                return fn
        raise KeyError(name)

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
