"""Bug hunt 2: each rank prints the samples it trains on, two epochs (2 ranks, no process group needed)."""
import torch
from course_lib.bughunt import rank_world
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

rank, world, _ = rank_world()
data = TensorDataset(torch.arange(8))
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=4, sampler=sampler)
for epoch in range(2):
    # this epoch's batches
    seen = [int(i) for (batch,) in loader for i in batch]
    print(f"rank {rank} epoch {epoch}: {seen}", flush=True)
