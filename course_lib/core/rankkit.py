"""What every rank process needs: markers to the process that launched it, a quick exit, and which rank it is.

A launcher's caller reads a rank's markers, one JSON object per line after ``@@ `` (``emit`` here, ``parse`` on
the reading side). The checking harness (``course_lib.checking``) builds its protocol on these.
"""
import json
import os
import sys
from typing import NamedTuple

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


def exit_now(code: int = 0) -> None:
    """Flush, then leave at once: an orderly shutdown with torch loaded is slow, and a learner's unfinished
    send or a stuck collective could make it hang."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


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
                       "SLURM_NTASKS) or torchrun (RANK, LOCAL_RANK, WORLD_SIZE), e.g. with course_lib.runtime.launch")


def _int(env, name: str, launcher: str) -> int:
    value = env.get(name)
    if value is None:
        raise RankEnvError(f"{name} is not set, but {launcher}'s other variables are")
    try:
        return int(value)
    except ValueError:
        raise RankEnvError(f"{name}={value!r} is not a whole number ({launcher} sets it)") from None

