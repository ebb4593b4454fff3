"""One rank of the nccl-1rank item: NCCL's process group on the GPU of one rank, and its collectives.

What one GPU can show of NCCL: ``init_process_group("nccl", device_id=...)`` binds the rank to its GPU (the
course's DDP solution joins so), the communicator is built, and all-reduce, broadcast and barrier return the
right values on CUDA tensors. What it cannot show: with one rank nothing crosses between GPUs (no NVLink, no
PCIe, no network; the all-reduce of one rank is a copy), so neither bandwidth nor a hang between ranks is
tested. Rank 0 prints ``nccl_one ok ...``. ``COURSE_SELFTEST_CPU=1``: gloo on CPU (the tests run the logic so).
"""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from course_lib.core.rankkit import rank_env

CPU_FLAG = "COURSE_SELFTEST_CPU"
ELEMENTS = 1 << 20        # 4 MiB of fp32: a real kernel, not a launch of nothing


def main() -> int:
    env = rank_env()
    cpu = os.environ.get(CPU_FLAG) == "1"
    device = torch.device("cpu") if cpu else torch.device("cuda", env.local_rank)
    if not cpu:
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if cpu else "nccl", rank=env.rank, world_size=env.world_size,
                            device_id=None if cpu else device)
    x = torch.full((ELEMENTS,), float(env.rank + 1), device=device)
    dist.all_reduce(x)
    b = torch.arange(8, dtype=torch.float32, device=device) * (1 if env.rank == 0 else 0)
    dist.broadcast(b, src=0)
    dist.barrier()             # with device_id bound, NCCL's barrier needs no guess of the rank's GPU
    want = env.world_size * (env.world_size + 1) / 2
    ok = bool((x == want).all()) and b.tolist() == list(map(float, range(8)))
    version = "" if cpu else ".".join(map(str, torch.cuda.nccl.version()))
    if env.rank == 0:
        print(f"nccl_one {'ok' if ok else 'WRONG'} backend={dist.get_backend()} ranks={env.world_size} "
              f"device={device} nccl={version or 'n/a'} allreduce={x[0].item():g} (want {want:g}) "
              f"broadcast={'ok' if b[7].item() == 7 else 'WRONG'}", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
