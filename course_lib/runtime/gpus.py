"""Where ranks started on this machine compute when it has fewer GPUs than ranks: the local engine's one decision.

The course's scripts give each rank ``cuda:LOCAL_RANK`` when CUDA is there, and join NCCL. On a machine with
fewer GPUs than ranks (the likeliest case: one GPU, two ranks) rank 1 would call ``set_device(1)`` and crash,
and NCCL refuses two ranks on one GPU. Some ranks on a GPU with NCCL and the rest on CPU with gloo cannot work
either: all ranks of a process group use one backend. So:

- as many GPUs as ranks or more: nothing changes, each rank uses a GPU of its own (``cuda:LOCAL_RANK``);
- fewer GPUs than ranks (but some): every GPU is hidden (``CUDA_VISIBLE_DEVICES=""``), all ranks run on CPU
  with gloo, and one line says so;
- no GPU, or the caller chose the GPUs itself (``CUDA_VISIBLE_DEVICES`` in its variables): nothing changes.

``$COURSE_LOCAL_GPUS`` replaces the count of this machine's GPUs (tests simulate a one-GPU machine on CPU).
"""
from __future__ import annotations

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


def placed(nprocs: int, env: dict | None = None) -> dict | None:
    """``place`` on this machine's GPUs, saying what it changed in one printed line; the ranks' variables.
    One rank, or GPUs the caller chose, need no count (torch is not imported for them)."""
    if nprocs < 2 or HIDE in (env or {}):
        return env
    env, note = place(nprocs, count(), env)
    if note:
        print(note, flush=True)
    return env
