"""The items of the GPU self-check in run order: ``needs(probe)`` says why one cannot run here ("" when it can),
``estimate`` is a guess of its seconds on one H100 (``--budget`` plans with it; docs/gpu-check.md).
"""
from dataclasses import dataclass
from typing import Callable

from course_lib.selftest import comm, forkcheck, jobnb, speed, train
from course_lib.selftest.probe import Probe, cuda_torch

ONE_GPU_PLAN_S = 420      # the default plan on one H100 fits 7 minutes (estimates)

# What "fp32" means on an NVIDIA GPU since Ampere: PyTorch runs cuDNN convolutions in TF32 by default
# (torch.backends.cudnn.allow_tf32 = True) and matmuls in full fp32 (torch.backends.cuda.matmul.allow_tf32 = False).
# NVIDIA_TF32_OVERRIDE=0 makes cuBLAS and cuDNN use no TF32 at all, whatever the script sets.
TF32_DEFAULT = "fp32 weights; TF32 in cuDNN convolutions (PyTorch's default), matmuls fp32"
TF32_OFF = "fp32 strict: NVIDIA_TF32_OVERRIDE=0 (no TF32 in cuBLAS or cuDNN)"


@dataclass(frozen=True)
class Item:
    name: str
    what: str
    needs: Callable[[Probe], str]
    run: Callable
    timeout: float = 300.0     # seconds; scaled by --timeout-scale, cut to what is left of --budget
    estimate: float = 30.0     # seconds on one H100 (a guess until measured); --budget plans with it
    default: bool = True       # in the plan run without --only / --all
    precision: str = ""        # the numeric formats the GPU computes in ("" where no training is timed)
    floor: float = 0.0         # the least deadline in which it can judge anything (--budget: else NOT RUN)


def gpus(n: int, why: str = "", also: str = "", lacking: str = "") -> Callable[[Probe], str]:
    """Needs CUDA and at least ``n`` GPUs (and NCCL for n >= 2), and the probe's field ``also`` (else ``lacking``)."""
    def need(p: Probe) -> str:
        if not p.torch:
            return p.error or "torch does not import"
        if not p.cuda:
            return f"no CUDA GPU (torch {p.torch}, CUDA build: {p.cuda_version or 'no'})"
        if p.gpus < n:
            return f"{p.gpus} GPU(s) here; this needs {n}" + (f" ({why})" if why else "")
        if n >= 2 and not p.nccl:
            return "this torch has no NCCL"
        return lacking if also and not getattr(p, also) else ""
    return need


nccl = gpus(1, also="nccl", lacking="this torch has no NCCL")
bf16 = gpus(1, also="bf16", lacking="this GPU has no bf16 (Ampere or newer has)")
nvidia_smi = gpus(1, also="nvidia_smi", lacking="nvidia-smi is not on PATH")


# a machine with one GPU and everything else an item may need: what "runs on one GPU" is judged against
ONE_GPU = Probe(torch="any", cuda=True, cuda_version="any", gpus=1, names=["any"], bf16=True, nccl=True,
                nccl_version="any", nvidia_smi="nvidia-smi")


def runs_on_one_gpu(item: Item) -> bool:
    return not item.needs(ONE_GPU)


def smi_only(p: Probe) -> str:
    """The cuda-torch item needs nvidia-smi alone: it is what tells a torch without CUDA on a GPU machine."""
    return "" if p.nvidia_smi else "nvidia-smi is not on PATH (no NVIDIA driver here)"


NB = {"00": ("00_welcome", 60), "01": ("01_serial_mnist", 120), "02": ("02_ddp_six_steps", 180)}
ITEMS = [
    Item("cuda-torch", "nvidia-smi -L against torch.cuda: this python's torch sees the GPUs the driver sees",
         smi_only, cuda_torch, 60, 5),
    Item("warm-fork-cuda", "ranks forked by the warm fork server use CUDA; a fork after CUDA init is detected",
         gpus(1), forkcheck.warm_fork_cuda, 120, 20),
    Item("nccl-1rank", f"NCCL group bound to cuda:0 (device_id), all-reduce, broadcast, barrier; {comm.ONE_RANK}",
         nccl, comm.nccl_one_rank, 120, 15),
    Item("ddp-nccl", "DDP solution, NCCL, one rank per GPU (W = GPU count; with one GPU W=1: DDP's all-reduce has "
         "no peer, no traffic between GPUs)", nccl, train.ddp_nccl, 240, 40, precision=TF32_DEFAULT),
    Item("throughput", "the course CNN on 60,000 synthetic 28x28 images made on the GPU: fp32 strict, fp32, "
         "TF32, bf16, fp16, compiled; images/s and speedups vs fp32 strict (compile time apart)",
         gpus(1), speed.throughput, 240, 90, precision="each variant named in its figures"),
    Item("serial-fp32", "serial solution on cuda, fp32: runs and learns", gpus(1), train.serial([]), 180, 25,
         precision=TF32_DEFAULT),
    Item("serial-fp32-strict", "serial solution on cuda, fp32 with TF32 off", gpus(1),
         train.serial([], {"NVIDIA_TF32_OVERRIDE": "0"}), 180, 25, precision=TF32_OFF),
    Item("serial-bf16", "serial solution on cuda, bf16 autocast", bf16, train.serial(["--amp", "bf16"]), 180, 25,
         precision="bf16 autocast; what autocast leaves in fp32 as serial-fp32"),
    Item("serial-fp16", "serial solution on cuda, fp16 autocast + GradScaler", gpus(1),
         train.serial(["--amp", "fp16"]), 180, 25, precision="fp16 autocast + GradScaler; the rest as serial-fp32"),
    Item("serial-compile", "serial solution on cuda, torch.compile", gpus(1), train.serial(["--compile"]), 300, 70,
         precision=TF32_DEFAULT),
    Item("ddp-gloo-cuda", "DDP with gloo on CUDA tensors, 2 ranks sharing GPU 0", gpus(1), comm.gloo_cuda, 180, 30,
         precision=TF32_DEFAULT),
    Item("check-ddp-gpu", "course check ddp on the solution, Step 4 in GPU mode",
         gpus(2, "the checker runs 2 ranks and judges GPU placement only with a GPU each"), train.check_ddp, 600,
         120),
    Item("allreduce-nccl", "all-reduce benchmark, NCCL baseline (1M, 16M, 256M): bus bandwidth",
         gpus(2, comm.BUSBW_NEEDS), comm.allreduce_baseline, 180, 30),
    Item("nccl-algo", "NCCL_ALGO=Ring, then Tree (notebook 05's experiment)",
         gpus(2, "ring and tree differ only with 2+ ranks"), comm.nccl_algo, 240, 50),
    Item("tp-nccl", "tensor-parallel MLP of the solution over NCCL vs the serial MLP",
         gpus(2, "tensor parallelism splits over 2+ GPUs"), comm.tp_nccl, 180, 30),
    Item("job-monitor", "local-engine GPU job with the template's nvidia-smi dmon lines: SM use > 0 while the job "
         "trains on cuda", nvidia_smi, jobnb.job_monitor, 240, 40, precision=TF32_DEFAULT,
         floor=jobnb.LEAST_S),
    *[Item(f"notebook-{n}", f"notebooks/{stem}.ipynb via papermill on solutions/ (QUICK)", gpus(1),
           jobnb.notebook(stem), 600, est, default=False) for n, (stem, est) in NB.items()],
]
BY_NAME = {item.name: item for item in ITEMS}


def plan_seconds(items, machine: Probe) -> float:
    """The estimated seconds of ``items`` on ``machine`` (items not possible there cost nothing)."""
    return sum(i.estimate for i in items if not i.needs(machine))
