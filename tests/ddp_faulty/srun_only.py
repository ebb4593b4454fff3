"""DDP script for srun only, functional style with other names: it reads only srun's SLURM_* variables.
Under torchrun there is no SLURM_PROCID: it crashes before joining the group. It passes Step 6 (a script for
one launcher), except with strict_launchers.
"""
import argparse
import gc
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from course_lib.data import load_dataset
from course_lib.model import Net


def setup():
    task = int(os.environ["SLURM_PROCID"])
    ntasks = int(os.environ["SLURM_NTASKS"])
    slot = int(os.environ["SLURM_LOCALID"])
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=task, world_size=ntasks)
    dev = torch.device(f"cuda:{slot}") if torch.cuda.is_available() else torch.device("cpu")
    return task, dev


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--dataset", default="auto")
    p.add_argument("--save-model", action="store_true")
    a, _ = p.parse_known_args()
    task, dev = setup()
    train_set, _ = load_dataset(a.dataset)
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=64, sampler=sampler)
    ddp_net = DDP(Net().to(dev))
    opt = torch.optim.Adadelta(ddp_net.parameters(), lr=1.0)
    for ep in range(a.epochs):
        sampler.set_epoch(ep)
        for x, y in loader:
            opt.zero_grad()
            F.nll_loss(ddp_net(x.to(dev)), y.to(dev)).backward()
            opt.step()
    if a.save_model and task == 0:
        torch.save(ddp_net.module.state_dict(), "mnist_cnn.pt")
    del ddp_net, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
