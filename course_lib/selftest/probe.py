"""What this machine offers the GPU self-check, asked once (a plain record: tests hand the items a made-up one)."""
import os
import platform
import shutil
import threading
from dataclasses import dataclass, field

from course_lib.selftest.pick import smi_gpus
from course_lib.selftest.runs import FAIL, NOT_POSSIBLE, PASS, Outcome


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
    error: str = ""                  # why torch could not be asked (it raised, or did not answer in time)

    def summary(self) -> str:
        if not self.torch:
            return self.error or "torch does not import"
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


PROBE_S = 120.0      # seconds for import torch and the CUDA queries (a loaded machine imports torch in tens)


def probe_within(timeout: float = PROBE_S) -> Probe:
    """``probe()`` within ``timeout`` seconds: a driver that hangs on the first CUDA call must not hang the check.
    Without an answer (or when it raises), a Probe without torch that says why: every item is then NOT POSSIBLE
    with that reason, and cuda-torch FAILs where nvidia-smi lists GPUs."""
    box: list = []

    def ask():
        try:
            box.append(probe())
        except Exception as e:  # noqa: BLE001 - the error is the finding
            box.append(f"{type(e).__name__}: {e}")

    asking = threading.Thread(target=ask, daemon=True, name="selftest-probe")   # daemon: a hung one does not
    asking.start()                                                                # keep the check alive
    asking.join(timeout)
    found = box[0] if box else f"no answer from torch (import torch, torch.cuda) within {timeout:g} s"
    if isinstance(found, Probe):
        return found
    return Probe(nvidia_smi=shutil.which("nvidia-smi") or "", sbatch=shutil.which("sbatch") or "",
                 error=f"probe failed: {found}")


def cuda_torch(ctx):
    """The item: does this python's torch see the GPUs that ``nvidia-smi -L`` lists? A torch without CUDA on a
    GPU machine would make every other item NOT POSSIBLE: a check that reads as green and tested nothing."""
    return compare(*smi_gpus(timeout=ctx.timeout), ctx.probe)


def compare(listed: int, said: str, p: Probe):
    """The cuda-torch verdict from what nvidia-smi listed (``listed`` GPUs, its output ``said``) and the probe."""
    if listed == 0:
        return Outcome(NOT_POSSIBLE, f"nvidia-smi lists no GPU ({said.splitlines()[0] if said else 'no output'})")
    if not p.cuda:
        torch = f"torch {p.torch} (CUDA build: {p.cuda_version or 'none'})" if p.torch else "torch does not import"
        return Outcome(FAIL, f"nvidia-smi lists {listed} GPU(s) but this python ({p.python}) has {torch}: every "
                             "GPU item would be NOT POSSIBLE. Start the check with a python whose torch has CUDA "
                             "(GPU_CHECK_PYTHON=..., docs/gpu-check.md)", {"smi_gpus": listed, "torch_gpus": 0})
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    figures = {"smi_gpus": listed, "torch_gpus": p.gpus}
    if p.gpus == listed or (visible is not None and 0 < p.gpus < listed):
        hidden = f" (CUDA_VISIBLE_DEVICES={visible})" if p.gpus != listed else ""
        return Outcome(PASS, f"nvidia-smi lists {listed}, torch {p.torch} uses {p.gpus}{hidden}: "
                             f"{', '.join(p.names)}", figures)
    return Outcome(FAIL, f"nvidia-smi lists {listed} GPU(s), torch sees {p.gpus}:\n{said}", figures)
