"""Faulty DDP script: the world size is hard-coded to 2: right with 2 ranks, wrong with 3.
# EXPECT: Step 1: with 3 ranks
# CHECK: styles=srun more_ranks=3 timeout=60
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
import gc  # Step 6: to drop the DDP model before leaving the process group
import torch.distributed as dist  # Step 1: the process group and its collectives
from torch.nn.parallel import DistributedDataParallel as DDP  # Step 2: the wrapper that averages gradients
from torch.utils.data.distributed import DistributedSampler  # Step 3: one shard of the data per rank

from course_lib.data import DATASETS, DataError, load_dataset
from course_lib.metrics import format_epoch_line
from course_lib.model import Net


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="PyTorch MNIST example (serial)")
    p.add_argument("--batch-size", type=int, default=64, help="input batch size for training (default: 64)")
    p.add_argument("--test-batch-size", type=int, default=1000, help="input batch size for testing (default: 1000)")
    p.add_argument("--epochs", type=int, default=14, help="number of epochs to train (default: 14)")
    p.add_argument("--lr", type=float, default=1.0, help="learning rate (default: 1.0)")
    p.add_argument("--gamma", type=float, default=0.7, help="learning rate step gamma (default: 0.7)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default: 1)")
    p.add_argument("--log-interval", type=int, default=10, help="batches between training log lines")
    p.add_argument("--save-model", action="store_true", help="write mnist_cnn.pt in the working directory")
    p.add_argument("--dry-run", action="store_true", help="one batch per epoch, to check that it runs")
    p.add_argument("--data-dir", default=None, help="where MNIST/raw/ lives (default: $COURSE_DATA_DIR)")
    p.add_argument("--dataset", choices=DATASETS, default="auto", help="auto: MNIST if present, else digits")
    p.add_argument("--num-workers", type=int, default=int(os.environ.get("SLURM_CPUS_PER_TASK", 0)),
                   help="data-loader worker processes (default: $SLURM_CPUS_PER_TASK, else 0)")
    p.add_argument("--amp", choices=["off", "bf16", "fp16"], default="off", help="mixed precision autocast")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    return p.parse_args(argv)


def sync(device):
    # CUDA runs asynchronously: wait for the GPU before reading the clock, or the time is a lie.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def distributed_env():  # Step 1: who am I? srun sets SLURM_*, torchrun sets RANK, LOCAL_RANK, WORLD_SIZE
    """(rank, local_rank, world_size) of this process; (0, 0, 1) when no launcher started it."""
    if "RANK" in os.environ:  # torchrun (also torchrun inside a Slurm job: its variables win)
        return int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    if "SLURM_PROCID" in os.environ:  # srun: one task per rank
        return int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_LOCALID"]), int(os.environ["SLURM_NTASKS"])
    return 0, 0, 1


def train(args, model, device, train_loader, optimizer, epoch, autocast):
    model.train()
    total_loss, seen = 0.0, 0
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        with autocast():
            output = model(data)
            loss = F.nll_loss(output.float(), target)
        loss.backward()
        optimizer.step()
        total_loss += loss.item() * len(data)
        seen += len(data)
        if batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{seen}/{len(train_loader.sampler)}]\tLoss: {loss.item():.6f}", flush=True)
        if args.dry_run:
            break
    return total_loss / max(seen, 1), seen


def test(model, device, test_loader, autocast):
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            with autocast():
                output = model(data).float()
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += (output.argmax(dim=1) == target).sum().item()
    n = len(test_loader.dataset)
    return test_loss / n, correct / n


def main(argv=None):
    args = parse_args(argv)
    use_cuda = torch.cuda.is_available()
    torch.manual_seed(args.seed)
    rank, local_rank, world_size = distributed_env()  # Step 1
    if use_cuda:  # Step 1: set this rank's GPU before init, so that NCCL uses it and no other
        torch.cuda.set_device(local_rank)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # Step 1: where rank 0 waits for the others;
    os.environ.setdefault("MASTER_PORT", "29500")  # srun jobs export both, torchrun sets them itself
    world_size = 2  # two ranks, as in the notebook
    dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world_size)  # Step 1

    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")  # Step 4: this rank's own GPU

    try:
        train_set, test_set = load_dataset(args.dataset, args.data_dir)
    except DataError as e:
        sys.exit(f"data error: {e}")
    print(f"device={device} dataset={train_set.name} train={len(train_set)} test={len(test_set)}", flush=True)

    train_sampler = DistributedSampler(train_set, seed=args.seed)  # Step 3: rank r gets every world_size-th image
    train_kwargs = {"batch_size": args.batch_size, "sampler": train_sampler}  # Step 3: the sampler shuffles
    test_kwargs = {"batch_size": args.test_batch_size}
    loader_kwargs = {"num_workers": args.num_workers, "pin_memory": use_cuda,
                     "persistent_workers": args.num_workers > 0}
    train_loader = torch.utils.data.DataLoader(train_set, **train_kwargs, **loader_kwargs)
    test_loader = torch.utils.data.DataLoader(test_set, **test_kwargs, **loader_kwargs)

    model = Net().to(device)
    model = DDP(model, device_ids=[local_rank] if use_cuda else None)  # Step 2: same start, averaged gradients
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    step_model = torch.compile(model) if args.compile else model
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)

    def autocast():  # mixed precision only when asked for; a no-op context otherwise
        return torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None)

    for epoch in range(1, args.epochs + 1):
        train_sampler.set_epoch(epoch)  # Step 3: reshuffle; without it every epoch repeats the same order
        sync(device)
        # Step 6: the barriers make epoch_s the time of the slowest rank, the same on every rank, as the
        # slides measure it. Production code leaves them out: a barrier makes the fast ranks wait for nothing,
        # and DDP's all-reduce in every backward already keeps the ranks in step.
        dist.barrier()
        start = time.perf_counter()
        train_loss, seen = train(args, step_model, device, train_loader, optimizer, epoch, autocast)
        sync(device)
        dist.barrier()  # Step 6: stop the clock when the slowest rank is done
        epoch_s = time.perf_counter() - start
        test_loss, test_acc = test(step_model, device, test_loader, autocast)
        scheduler.step()
        # Per rank: what this process trained on. Total: the whole training set went through in epoch_s.
        total = seen if args.dry_run else len(train_loader.dataset)
        print(format_epoch_line(epoch=epoch, train_loss=train_loss, test_loss=test_loss, test_acc=test_acc,
                                images_per_s=total / epoch_s, images_per_s_rank=seen / epoch_s,
                                epoch_s=epoch_s), flush=True)

    if args.save_model and rank == 0:  # Step 5: one writer; every rank holds the same weights
        torch.save(model.module.state_dict(), "mnist_cnn.pt")  # Step 5: the Net inside, no "module." prefix
    # Step 6: leave cleanly. Drop the DDP model first: with Gloo, a DDP model still alive at exit after
    # destroy_process_group() makes the interpreter abort now and then ("terminate called without an
    # active exception").
    del model, step_model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
