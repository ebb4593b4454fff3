"""One rank of the TP-on-NCCL item: the solution's tensor-parallel MLP on GPUs, against the serial MLP.

Every rank builds the same serial MLP (fc1, GELU, fc2) on its GPU, copies its shards into the solution's
ColumnParallelLinear and RowParallelLinear, runs the same batch forward and backward over an NCCL group,
and compares output, input gradient and its weight-gradient shards with the serial ones. Rank 0 prints
``tp_nccl ok ...``. Usage (as ranks of course_lib.core.launch): ``python -m course_lib.selftest.tp_nccl TP_PY``.
"""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib.core.loader import import_path
from course_lib.core.rankkit import rank_env

HIDDEN, FFN, BATCH = 64, 256, 8
TOL = 1e-4
CPU_FLAG = "COURSE_SELFTEST_CPU"


def _shard_like_serial(tp, fc1, fc2, rank, world, device):
    col = tp.ColumnParallelLinear(HIDDEN, FFN).to(device)
    row = tp.RowParallelLinear(FFN, HIDDEN).to(device)
    part = FFN // world
    with torch.no_grad():
        col.weight.copy_(fc1.weight[rank * part:(rank + 1) * part])
        col.bias.copy_(fc1.bias[rank * part:(rank + 1) * part])
        row.weight.copy_(fc2.weight[:, rank * part:(rank + 1) * part])
        row.bias.copy_(fc2.bias)
    return col, row, part


def main(argv: list[str]) -> int:
    env = rank_env()
    tp = import_path(argv[0], "tp_under_check")
    if os.environ.get(CPU_FLAG) == "1":   # the tests run this worker's logic on CPU, over gloo
        device, backend = torch.device("cpu"), "gloo"
    else:
        device, backend = torch.device("cuda", env.local_rank), "nccl"
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=env.rank, world_size=env.world_size,
                            device_id=device if backend == "nccl" else None)
    torch.manual_seed(0)   # the same serial MLP and batch on every rank
    fc1 = torch.nn.Linear(HIDDEN, FFN).to(device)
    fc2 = torch.nn.Linear(FFN, HIDDEN).to(device)
    x = torch.randn(BATCH, HIDDEN, device=device, requires_grad=True)
    F.gelu(fc2(F.gelu(fc1(x)))).square().sum().backward()
    col, row, part = _shard_like_serial(tp, fc1, fc2, env.rank, env.world_size, device)
    xp = x.detach().clone().requires_grad_(True)
    out = row(F.gelu(col(xp)))
    F.gelu(out).square().sum().backward()
    serial_out = fc2(F.gelu(fc1(x)))
    s = slice(env.rank * part, (env.rank + 1) * part)
    errors = {"output": (out - serial_out).abs().max().item(),
              "input grad": (xp.grad - x.grad).abs().max().item(),
              "fc1 grad shard": (col.weight.grad - fc1.weight.grad[s]).abs().max().item(),
              "fc2 grad shard": (row.weight.grad - fc2.weight.grad[:, s]).abs().max().item()}
    worst = torch.tensor([max(errors.values())], device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)          # NCCL on a CUDA tensor
    ok = worst.item() <= TOL
    if env.rank == 0:
        shown = ", ".join(f"{k} {v:.2g}" for k, v in errors.items())
        print(f"tp_{backend} {'ok' if ok else 'WRONG'} ranks={env.world_size} max_error={worst.item():.3g} "
              f"(rank 0: {shown})", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
