"""What every bug-hunt script shares: its rank as srun or torchrun gave it, a process group with a deadline,
and a stack dump of every thread after a while (what ``py-spy dump`` shows, from the rank itself)."""
import datetime
import faulthandler
import os

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
        import torch
        torch.cuda.set_device(local)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
    return rank, world, local


def teardown() -> None:
    faulthandler.cancel_dump_traceback_later()
    dist.destroy_process_group()
