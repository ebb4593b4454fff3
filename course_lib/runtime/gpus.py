"""Where ranks started on this machine compute when it has fewer GPUs than ranks: the local engine's one decision.

A rank would ``set_device(LOCAL_RANK)`` past the last GPU, NCCL refuses two ranks on one GPU, and one process group
has one backend: so with fewer GPUs than ranks (but some) every GPU is hidden (``CUDA_VISIBLE_DEVICES=""``) and all
ranks run on CPU with gloo, said in one line; enough GPUs, none, or GPUs the caller chose: nothing changes.
``$COURSE_LOCAL_GPUS`` replaces the count of this machine's GPUs (tests simulate a one-GPU machine on CPU).
"""
import os
import sys
from pathlib import Path

COUNT_VAR = "COURSE_LOCAL_GPUS"
HIDE = "CUDA_VISIBLE_DEVICES"


def count() -> int:
    """The GPUs that ranks started here could use: ``$COURSE_LOCAL_GPUS`` when set, else torch's count."""
    named = os.environ.get(COUNT_VAR, "").strip()
    if named:
        return int(named)
    if "torch" not in sys.modules and not _device_files():
        return 0             # no GPU device here: spare a launcher that never imported torch its seconds
    import torch  # deferred: seconds to import, and only a machine with a GPU needs it

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _device_files() -> bool:
    """Whether /dev shows a GPU: NVIDIA's, AMD's (ROCm) or WSL's."""
    dev = Path("/dev")
    return any(dev.glob("nvidia[0-9]*")) or (dev / "kfd").exists() or (dev / "dxg").exists()


def place(nprocs: int, gpus: int, env: dict | None = None) -> tuple[dict | None, str]:
    """(the ranks' variables, what to say) for ``nprocs`` ranks on ``gpus`` GPUs; ``env``: the caller's
    variables for the ranks (returned as they are, or with the GPUs hidden). "" says nothing changed."""
    if gpus <= 0 or gpus >= nprocs or HIDE in (env or {}):
        return env, ""
    return {**(env or {}), HIDE: ""}, (
        f"{nprocs} ranks but {gpus} GPU(s) here: GPUs hidden ({HIDE}=''), all {nprocs} ranks run on CPU with "
        f"gloo (one process group has one backend; a GPU per rank needs {nprocs} GPUs)")


def placed(nprocs: int, env: dict | None = None, say=lambda note: print(note, flush=True)) -> dict | None:
    """``place`` on this machine's GPUs, saying what it changed in one line (``say``); the ranks' variables.
    One rank, or GPUs the caller chose, need no count (torch is not imported for them)."""
    if nprocs < 2 or HIDE in (env or {}):
        return env
    env, note = place(nprocs, count(), env)
    if note:
        say(note)
    return env
