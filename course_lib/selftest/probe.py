"""What this machine offers the GPU self-check, asked once: CUDA, how many GPUs, bf16, nvidia-smi, Slurm.

The items decide from a ``Probe`` whether they can run (``Probe`` is a plain record so that unit tests
can hand the items a made-up machine).
"""
from __future__ import annotations

import platform
import shutil
from dataclasses import asdict, dataclass, field


@dataclass
class Probe:
    torch: str = ""                  # torch.__version__, "" when torch does not import
    cuda: bool = False               # torch.cuda.is_available()
    cuda_version: str = ""           # torch.version.cuda: the CUDA the wheel was built for
    gpus: int = 0
    names: list = field(default_factory=list)
    bf16: bool = False               # torch.cuda.is_bf16_supported() (Ampere and newer)
    nccl: bool = False               # torch.distributed.is_nccl_available()
    nccl_version: str = ""
    nvidia_smi: str = ""             # its path, "" when not on PATH
    sbatch: str = ""                 # its path, "" when not on PATH
    python: str = platform.python_version()

    def as_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        if not self.torch:
            return "torch does not import"
        gpus = f"{self.gpus} GPU(s): {', '.join(self.names)}" if self.gpus else "no CUDA GPU"
        return (f"torch {self.torch} (CUDA {self.cuda_version or 'none'}), {gpus}; NCCL "
                f"{self.nccl_version or 'no'}; nvidia-smi {'yes' if self.nvidia_smi else 'no'}; "
                f"Slurm {'yes' if self.sbatch else 'no'}; Python {self.python}")


def probe() -> Probe:
    """This machine, as the items see it."""
    p = Probe(nvidia_smi=shutil.which("nvidia-smi") or "", sbatch=shutil.which("sbatch") or "")
    try:
        import torch
    except ImportError:
        return p
    p.torch, p.cuda_version = torch.__version__, torch.version.cuda or ""
    p.cuda = torch.cuda.is_available()
    if p.cuda:
        p.gpus = torch.cuda.device_count()
        p.names = [torch.cuda.get_device_name(i) for i in range(p.gpus)]
        p.bf16 = torch.cuda.is_bf16_supported()
    import torch.distributed as dist

    p.nccl = dist.is_available() and dist.is_nccl_available()
    if p.nccl and p.cuda:
        p.nccl_version = ".".join(map(str, torch.cuda.nccl.version()))
    return p
