"""One rank of the gloo-on-CUDA item: DDP with the gloo backend on CUDA tensors, every rank on GPU 0.

With a single GPU, NCCL cannot run two ranks (it refuses two ranks on one device), but gloo can: it copies
CUDA tensors through host memory. Each rank trains the course's CNN for a few steps on its own random
batch; afterwards every rank's parameters must be equal (DDP averaged the gradients) and an all-reduce of
CUDA tensors must give the sum. Rank 0 prints ``gloo_cuda ok ...``. Run with course_lib.core.launch.
"""
from __future__ import annotations

import gc
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.core.rankkit import rank_env
from course_lib.model import Net

STEPS = 5
CPU_FLAG = "COURSE_SELFTEST_CPU"


def main() -> int:
    env = rank_env()
    if os.environ.get(CPU_FLAG) == "1":   # the tests run this worker's logic on CPU
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", env.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group("gloo", rank=env.rank, world_size=env.world_size)
    torch.manual_seed(0)                                  # the same start; DDP broadcasts rank 0's anyway
    model = DDP(Net().to(device), device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator(device="cpu").manual_seed(100 + env.rank)   # each rank its own data
    for _ in range(STEPS):
        x = torch.randn(32, 1, 28, 28, generator=gen).to(device)
        y = torch.randint(0, 10, (32,), generator=gen).to(device)
        opt.zero_grad()
        F.nll_loss(model(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    copies = [torch.empty_like(flat) for _ in range(env.world_size)]
    dist.all_gather(copies, flat)                          # CUDA tensors through gloo
    spread = max((c - flat).abs().max().item() for c in copies)
    ones = torch.full((1000,), float(env.rank + 1), device=device)
    dist.all_reduce(ones)
    want = env.world_size * (env.world_size + 1) / 2
    ok = spread == 0.0 and bool((ones == want).all())
    if env.rank == 0:
        print(f"gloo_cuda {'ok' if ok else 'WRONG'} ranks={env.world_size} device={device} "
              f"param_spread={spread:.3g} allreduce={ones[0].item():g} (want {want:g})", flush=True)
    del model, opt                 # drop DDP before the group (see DESIGN: gloo + DDP shutdown)
    gc.collect()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
