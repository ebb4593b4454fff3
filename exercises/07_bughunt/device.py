"""Bug hunt 5, where GPUs are: what each rank of bug 5 does, with one GPU visible to each rank as
--gpus-per-task=1 arranges it (CUDA_VISIBLE_DEVICES set per rank by the notebook)."""
import os

import torch
from common import rank_world

rank, _, local = rank_world()
if os.environ.get("BUG_GPUS_PER_TASK") == "1":   # what --gpus-per-task=1 does: each task sees its own GPU only
    os.environ["CUDA_VISIBLE_DEVICES"] = str(local)
print(f"rank {rank}: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')} "
      f"device_count={torch.cuda.device_count()}", flush=True)
device = torch.device(f"cuda:{local}")
torch.zeros(1, device=device)
print(f"rank {rank}: tensor on {device}", flush=True)
