"""Bug hunt 1: a metric all-reduced for the log, and the training goes on (2 ranks, gloo)."""
import torch
import torch.distributed as dist
from course_lib.bughunt import setup, teardown

rank, world, _ = setup()
device = "cuda" if dist.get_backend() == "nccl" else "cpu"
loss = torch.tensor([1.0 + rank], device=device)
### BEGIN SOLUTION
# STUB: if rank == 0:                    # the mean loss, for the log
# STUB:     dist.all_reduce(loss)
# STUB:     print(f"mean loss {loss.item() / world:.2f}", flush=True)
dist.all_reduce(loss)                  # a collective: every rank calls it, even if only rank 0 prints
if rank == 0:
    print(f"mean loss {loss.item() / world:.2f}", flush=True)
### END SOLUTION
dist.barrier()                         # (stands for the next step's collectives)
print(f"rank {rank}: step done", flush=True)
teardown()
