"""Run a training script for the DDP = serial equivalence test (tests/test_ddp_solution.py).

    python ddp_equivalence_driver.py OUT SCRIPT [ARGS...]

Dropout is switched off (its random masks differ between ranks and runs), the ``digits`` data is cut to
``$EQUIV_TRAIN`` training images, and the parameters after every optimizer step go to OUT/params-<rank>.pt.
With ``EQUIV_SERIAL=1`` the serial script's shuffling is replaced by the order DistributedSampler uses:
``randperm(n)`` seeded with ``$EQUIV_SEED + epoch``, epochs counted from 1 as the DDP script's set_epoch does.
"""
import os
import runpy
import sys
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

import course_lib.data as data

out, script, args = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
rank = int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", 0)))
history = []

torch.nn.Dropout.forward = lambda self, x: x

full = data.load_digits_split
limits = {"train": int(os.environ["EQUIV_TRAIN"]), "test": 50}


def small_digits(split):
    ds = full(split)
    n = limits[split]
    return data.InMemoryDataset(ds.images[:n], ds.targets[:n], ds.name, split)


data.load_digits_split = small_digits

if os.environ.get("EQUIV_SERIAL") == "1":
    epoch = [0]

    def distributed_order(self):
        epoch[0] += 1
        g = torch.Generator()
        g.manual_seed(int(os.environ["EQUIV_SEED"]) + epoch[0])
        yield from torch.randperm(len(self.data_source), generator=g).tolist()

    torch.utils.data.RandomSampler.__iter__ = distributed_order


def record(optimizer, _args, _kwargs):
    with torch.no_grad():
        history.append(torch.cat([p.detach().reshape(-1).clone() for g in optimizer.param_groups for p in g["params"]]))


register_optimizer_step_post_hook(record)
sys.argv = [script, *args]
try:
    runpy.run_path(script, run_name="__main__")
finally:
    torch.save(history, out / f"params-{rank}.pt")
