"""Faulty DDP script: copied from a single-process example, every process joins a group of one.
"""
import argparse
import gc

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from course_lib.data import load_dataset
from course_lib.model import Net

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--dataset", default="auto")
    p.add_argument("--save-model", action="store_true")
    args, _ = p.parse_known_args()
    dist.init_process_group("gloo", rank=0, world_size=1)
    train_set, _ = load_dataset(args.dataset)
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=64, sampler=sampler)
    model = DDP(Net())
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            F.nll_loss(model(x), y).backward()
            opt.step()
    if args.save_model and dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "mnist_cnn.pt")
    del model, opt
    gc.collect()
    dist.destroy_process_group()
