"""Faulty DDP script in the mp.spawn style of older tutorials: it starts its own worker processes.
Under srun or torchrun the launcher already starts one process per rank, so each of them spawns more.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from course_lib.data import load_dataset
from course_lib.model import Net


def worker(rank, world_size, args):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    train_set, _ = load_dataset(args.dataset)
    sampler = DistributedSampler(train_set)
    model = DDP(Net())
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(train_set, batch_size=64, sampler=sampler):
            opt.zero_grad()
            F.nll_loss(model(x), y).backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--dataset", default="auto")
    p.add_argument("--save-model", action="store_true")
    args, _ = p.parse_known_args()
    world_size = 2
    mp.spawn(worker, args=(world_size, args), nprocs=world_size)
