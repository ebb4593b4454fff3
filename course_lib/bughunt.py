"""What notebook 07's bug-hunt scripts (exercises/07_bughunt/) share: the rank as srun or torchrun gave it,
a process group with a deadline, and a stack dump of every thread after a while (what ``py-spy dump`` shows,
from the rank itself).

``python -m course_lib.bughunt`` is bug 5 where GPUs are: each rank sees only its own GPU, as
``--gpus-per-task=1`` arranges it (``BUG_GPUS_PER_TASK=1``), and picks ``cuda:LOCAL_RANK`` as the course's
DDP script does.
"""
import datetime
import faulthandler
import os

import torch
import torch.distributed as dist


def rank_world() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's variables, else srun's."""
    env = os.environ
    if "RANK" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"])
    return int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env["SLURM_LOCALID"])


def setup(backend: str = os.environ.get("BUG_BACKEND", "gloo")) -> tuple[int, int, int]:
    """Join the group; a collective that waits longer than BUG_TIMEOUT seconds raises instead of hanging."""
    rank, world, local = rank_world()
    dump_after = float(os.environ.get("BUG_DUMP_AFTER", "0"))
    if dump_after:     # where is each rank after this long? (py-spy dump --pid, without py-spy)
        faulthandler.dump_traceback_later(dump_after, repeat=False, exit=False)
    timeout = datetime.timedelta(seconds=float(os.environ.get("BUG_TIMEOUT", "20")))
    if backend == "nccl":
        torch.cuda.set_device(local)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
    return rank, world, local


def teardown() -> None:
    faulthandler.cancel_dump_traceback_later()
    dist.destroy_process_group()


def device_demo() -> None:
    rank, _, local = rank_world()
    if os.environ.get("BUG_GPUS_PER_TASK") == "1":   # each task sees its own GPU only, before CUDA starts
        os.environ["CUDA_VISIBLE_DEVICES"] = str(local)
    print(f"rank {rank}: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')} "
          f"device_count={torch.cuda.device_count()}", flush=True)
    device = torch.device(f"cuda:{local}")
    torch.zeros(1, device=device)
    print(f"rank {rank}: tensor on {device}", flush=True)


if __name__ == "__main__":
    device_demo()
