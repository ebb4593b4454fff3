"""The items of the GPU self-check, in the order they run, each with what it needs of the machine.

``needs(probe)`` returns why the item cannot run here ("" when it can); ``run(ctx)`` returns its Outcome.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from course_lib.selftest import comm, jobnb, train
from course_lib.selftest.probe import Probe


@dataclass(frozen=True)
class Item:
    name: str
    what: str
    needs: Callable[[Probe], str]
    run: Callable
    timeout: float = 300.0     # seconds; scaled by --timeout-scale


def gpus(n: int, why: str = "") -> Callable[[Probe], str]:
    """Needs CUDA and at least ``n`` GPUs (and NCCL for n >= 2)."""
    def need(p: Probe) -> str:
        if not p.torch:
            return "torch does not import"
        if not p.cuda:
            return f"no CUDA GPU (torch {p.torch}, CUDA build: {p.cuda_version or 'no'})"
        if p.gpus < n:
            return f"{p.gpus} GPU(s) here; this needs {n}" + (f" ({why})" if why else "")
        if n >= 2 and not p.nccl:
            return "this torch has no NCCL"
        return ""
    return need


def bf16(p: Probe) -> str:
    return gpus(1)(p) or ("" if p.bf16 else "this GPU has no bf16 (Ampere or newer has)")


def nvidia_smi(p: Probe) -> str:
    return gpus(1)(p) or ("" if p.nvidia_smi else "nvidia-smi is not on PATH")


def nccl(p: Probe) -> str:
    return gpus(1)(p) or ("" if p.nccl else "this torch has no NCCL")


NB = {"00": "00_welcome", "01": "01_serial_mnist", "02": "02_ddp_six_steps"}
ITEMS = [
    Item("serial-fp32", "serial solution on cuda, fp32: images/s", gpus(1), train.serial([])),
    Item("serial-bf16", "serial solution on cuda, bf16 autocast", bf16, train.serial(["--amp", "bf16"])),
    Item("serial-fp16", "serial solution on cuda, fp16 autocast + GradScaler", gpus(1),
         train.serial(["--amp", "fp16"])),
    Item("serial-compile", "serial solution on cuda, torch.compile", gpus(1), train.serial(["--compile"]), 600),
    Item("ddp-nccl", "DDP solution, NCCL, one rank per GPU (W = GPU count)", nccl, train.ddp_nccl),
    Item("ddp-gloo-cuda", "DDP with gloo on CUDA tensors, 2 ranks sharing GPU 0", gpus(1), train.gloo_cuda),
    Item("check-ddp-gpu", "course check ddp on the solution, Step 4 in GPU mode",
         gpus(2, "the checker runs 2 ranks and judges GPU placement only with a GPU each"), train.check_ddp, 600),
    Item("allreduce-nccl", "all-reduce benchmark, NCCL baseline (1M, 16M, 256M)", nccl, comm.allreduce_baseline),
    Item("nccl-algo", "NCCL_ALGO=Ring, then Tree (notebook 05's experiment)",
         gpus(2, "ring and tree differ only with 2+ ranks"), comm.nccl_algo),
    Item("tp-nccl", "tensor-parallel MLP of the solution over NCCL vs the serial MLP",
         gpus(2, "tensor parallelism splits over 2+ GPUs"), comm.tp_nccl),
    Item("job-monitor", "local-engine GPU job with the template's nvidia-smi dmon lines; log parsed",
         nvidia_smi, jobnb.job_monitor),
    *[Item(f"notebook-{n}", f"notebooks/{stem}.ipynb via papermill on solutions/ (QUICK)", gpus(1),
           jobnb.notebook(stem), 600) for n, stem in NB.items()],
]
BY_NAME = {item.name: item for item in ITEMS}
