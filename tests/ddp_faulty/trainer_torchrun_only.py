"""DDP script for torchrun only, in a Trainer-class style: it reads only torchrun's variables (init from env://).
Under srun there is no RANK or WORLD_SIZE, so init_process_group fails; under torchrun all is well. It passes
Step 6 (a script for one launcher), except with strict_launchers.
"""
import argparse
import gc
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from course_lib.data import load_dataset
from course_lib.model import Net


def local_slot():
    return int(os.environ.get("LOCAL_RANK", 0))


class Trainer:
    def __init__(self, opts):
        self.opts = opts
        self.gpu_slot = local_slot()
        on_gpu = torch.cuda.is_available()
        if on_gpu:
            torch.cuda.set_device(self.gpu_slot)
        dist.init_process_group(backend="nccl" if on_gpu else "gloo")  # RANK, WORLD_SIZE from torchrun
        self.global_rank, self.n_workers = dist.get_rank(), dist.get_world_size()
        self.dev = torch.device("cuda", self.gpu_slot) if on_gpu else torch.device("cpu")
        train_data, self.test_data = load_dataset(opts.dataset)
        self.shard = DistributedSampler(train_data, num_replicas=self.n_workers, rank=self.global_rank, shuffle=True)
        self.batches = DataLoader(train_data, batch_size=opts.batch_size, sampler=self.shard)
        net = Net().to(self.dev)
        self.net = DistributedDataParallel(net, device_ids=[self.gpu_slot] if on_gpu else None)
        self.opt = torch.optim.Adadelta(self.net.parameters(), lr=opts.lr)

    def run_epoch(self, e):
        self.shard.set_epoch(e)
        self.net.train()
        for images, labels in self.batches:
            images, labels = images.to(self.dev), labels.to(self.dev)
            self.opt.zero_grad()
            F.nll_loss(self.net(images), labels).backward()
            self.opt.step()
        if self.global_rank == 0:
            print(f"epoch {e} done", flush=True)

    def finish(self, save):
        if save and self.global_rank == 0:
            torch.save(self.net.module.state_dict(), "mnist_cnn.pt")
        del self.net, self.opt
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--dataset", default="auto")
    p.add_argument("--save-model", action="store_true")
    opts, _ = p.parse_known_args()
    t = Trainer(opts)
    for epoch in range(opts.epochs):
        t.run_epoch(epoch)
    t.finish(opts.save_model)
