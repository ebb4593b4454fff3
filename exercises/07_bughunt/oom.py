"""Bug hunt 4: each rank evaluates its share of the data, then the ranks average the accuracy (2 ranks, gloo).

Each rank's memory is capped at what it holds now plus BUG_MEMORY_MB (default 256 MiB), as a GPU's memory is
fixed: an allocation beyond it fails as a GPU's would ("CUDA out of memory" there, "can't allocate memory" here).
"""
import os
import resource

import psutil
import torch
import torch.distributed as dist
from course_lib.bughunt import setup, teardown

rank, world, _ = setup()
budget = int(os.environ.get("BUG_MEMORY_MB", "256")) * 2**20
used = psutil.Process().memory_info().vms
resource.setrlimit(resource.RLIMIT_AS, (used + budget, resource.RLIM_INFINITY))
rows = 1000 if rank == 0 else 1_000_000    # this rank's share
x = torch.ones(rows, 784)                        # this rank's inputs
acc = torch.tensor([x.mean().item()])
dist.all_reduce(acc)
print(f"rank {rank}: mean accuracy {acc.item() / world:.2f}", flush=True)
teardown()
