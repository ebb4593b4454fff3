"""The training loop of notebook 08: notebook 02's DDP training of the MNIST CNN, with the learner's
``save_snapshot`` and ``load_snapshot`` (none: never saves, the reference run).

A position is ``(epoch, step)``: ``step`` batches (0-based) of epoch ``epoch`` (1-based) are done. Rank 0 prints
``step=G epoch=E batch=B loss=L`` with L in full precision (the mean over ranks), so two runs compare exactly.
"""
import argparse
import gc
import os
import random
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, Sampler
from torch.utils.data.distributed import DistributedSampler

from course_lib import registry
from course_lib.core.rankkit import rank_env
from course_lib.model import Net


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="DDP MNIST training with snapshots (notebook 08)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--gamma", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--train-images", type=int, default=256, help="the first N digits images (0: all 1,438)")
    p.add_argument("--data", default=None, help="a file from prepare_data (default: digits from scikit-learn)")
    p.add_argument("--snapshot", default="snapshot.pt", help="the snapshot file (default: snapshot.pt)")
    p.add_argument("--every", type=int, default=3, help="save every N steps within an epoch (0: at epoch ends only)")
    p.add_argument("--snapshots", default=None, help="a file with save_snapshot/load_snapshot (none: never save)")
    p.add_argument("--kill-rank", type=int, default=1)
    p.add_argument("--kill-at", type=int, default=0, help="global step before which --kill-rank dies (SIGKILL, on the "
                   "first attempt only; 0: never)")
    p.add_argument("--stop-file", default=None, help="once it exists, every rank saves and the run ends (stopped)")
    p.add_argument("--step-seconds", type=float, default=0.0, help="each step lasts at least this (a job meets its "
                   "time limit)")
    return p.parse_args(argv)


class SkipSampler(Sampler):
    """The indices of ``sampler`` from position ``start`` on: the rest of an epoch that was cut short.

    DistributedSampler has no state of its own beyond ``set_epoch``: its order is a function of (seed, epoch),
    so (epoch, batches done) is the whole of its position."""

    def __init__(self, sampler, start: int = 0):
        self.sampler, self.start = sampler, start

    def __iter__(self):
        return iter(list(self.sampler)[self.start:])

    def __len__(self):
        return max(0, len(self.sampler) - self.start)


def attempt() -> int:
    """How many times this job was started again before: by torchrun (--max-restarts) or by Slurm (requeue)."""
    return sum(int(os.environ.get(v) or 0) for v in ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"))


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def digits_tensors(train_images: int = 256) -> dict:
    """The first ``train_images`` digits images (0: all) and 256 test images, as (images, targets) per split."""
    from course_lib.data import load_digits_split
    train, test = load_digits_split("train"), load_digits_split("test")
    n = train_images or len(train)
    return {"train": (train.images[:n].clone(), train.targets[:n].clone()),
            "test": (test.images[:256].clone(), test.targets[:256].clone())}


def prepare_data(path, train_images: int = 256) -> str:
    """``digits_tensors`` in one file for ``--data``: ranks that read it skip scikit-learn (seconds each)."""
    torch.save(digits_tensors(train_images), path)
    return str(path)


def load_data(args):
    from course_lib.data import InMemoryDataset
    tensors = torch.load(args.data, weights_only=True) if args.data else digits_tensors(args.train_images)
    return tuple(InMemoryDataset(*tensors[split], "digits", split) for split in ("train", "test"))


def load_snapshots(path):
    """The learner's module from its path (their save_snapshot and load_snapshot)."""
    from course_lib.core.loader import import_path
    module = import_path(os.path.abspath(path), "learner_snapshot")
    for name in ("save_snapshot", "load_snapshot"):
        if not callable(getattr(module, name, None)):
            sys.exit(f"{path} has no function {name}: see exercises/{registry.get('ckpt').file}")
    return module


def training_objects(lr: float = 1.0, gamma: float = 0.7):
    """The DDP-wrapped Net with Adadelta and StepLR (the checker's ranks build the same)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(Net())
    optimizer = torch.optim.Adadelta(model.parameters(), lr=lr)
    return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=gamma)


def build(args, rank: int, world: int):
    """Model (DDP), optimizer, scheduler, sampler and loaders, the same way on every rank and every attempt."""
    seed_all(args.seed)                      # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model, optimizer, scheduler = training_objects(args.lr, args.gamma)
    seed_all(args.seed + 1000 * rank)        # then each rank draws its own dropout masks: RNG state is per rank
    train_set, test_set = load_data(args)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, seed=args.seed)
    return model, optimizer, scheduler, sampler, train_set, test_set


def resume(args, snapshots, objects, steps_per_epoch: int, rank: int) -> tuple[int, int]:
    """(epoch, step) to start from: the snapshot's when there is one, else (1, 0)."""
    if snapshots is None or not os.path.exists(args.snapshot):
        return 1, 0
    model, optimizer, scheduler = objects
    position = snapshots.load_snapshot(args.snapshot, model, optimizer, scheduler)
    try:
        epoch, step = (int(v) for v in position)
    except (TypeError, ValueError):
        raise SystemExit(f"load_snapshot must return (epoch, step), two whole numbers; it returned {position!r}") \
            from None
    if not (1 <= epoch <= args.epochs + 1 and 0 <= step < steps_per_epoch):
        raise SystemExit(f"load_snapshot returned (epoch={epoch}, step={step}): not a position of this run "
                         f"({args.epochs} epochs of {steps_per_epoch} steps, step 0-based)")
    if rank == 0:
        print(f"resumed epoch={epoch} step={step} from {args.snapshot}", flush=True)
    return epoch, step


def stop_requested(path) -> bool:
    """True on every rank when the stop file exists on any (they must all stop at the same step)."""
    flag = torch.tensor([1.0 if path and os.path.exists(path) else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def train_step(model, optimizer, data, target, world: int) -> float:
    optimizer.zero_grad()
    loss = F.nll_loss(model(data), target)
    loss.backward()
    optimizer.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)                    # the curve is the mean loss over all ranks
    return (mean / world).item()


def evaluate(model, test_set) -> float:
    net = model.module                       # the plain Net: rank 0 alone evaluates, no collective may run
    net.eval()
    with torch.no_grad():
        correct = (net(test_set.images).argmax(1) == test_set.targets).sum().item()
    net.train()
    return correct / len(test_set)


def run_epoch(args, ctx, epoch: int, start: int) -> str | None:
    """Train one epoch from batch ``start``; "stopped" when a stop was requested (a snapshot is written)."""
    model, optimizer, scheduler, sampler, train_set, snapshots, rank, world, steps = ctx
    sampler.set_epoch(epoch)
    # its own generator: iterating a DataLoader draws a seed (for its workers) from the generator it is given,
    # by default torch's global one, and that draw would shift the dropout masks of a resumed run
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=SkipSampler(sampler, start * args.batch_size),
                        generator=torch.Generator().manual_seed(args.seed + epoch))
    for batch, (data, target) in enumerate(loader, start=start):
        step = (epoch - 1) * steps + batch + 1
        if args.kill_at == step and rank == args.kill_rank and attempt() == 0:
            print(f"rank {rank}: SIGKILL to myself before step {step} (epoch {epoch}, batch {batch})", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if args.stop_file and stop_requested(args.stop_file):
            save(args, ctx, epoch, batch)
            if rank == 0:
                print(f"stopped before step {step}: snapshot at epoch={epoch} step={batch}", flush=True)
            return "stopped"
        began = time.monotonic()
        loss = train_step(model, optimizer, data, target, world)
        if rank == 0:
            print(f"step={step} epoch={epoch} batch={batch} loss={loss!r}", flush=True)
        time.sleep(max(0.0, args.step_seconds - (time.monotonic() - began)))
        if args.every and (batch + 1) % args.every == 0 and batch + 1 < steps:
            save(args, ctx, epoch, batch + 1)
    return None


def save(args, ctx, epoch: int, step: int) -> None:
    model, optimizer, scheduler, _sampler, _train, snapshots, rank, _world, _steps = ctx
    if snapshots is None:
        return
    snapshots.save_snapshot(args.snapshot, model, optimizer, scheduler, epoch, step)
    if rank == 0:
        print(f"snapshot epoch={epoch} step={step}", flush=True)


def run(args, snapshots=None) -> str:
    """Train on every rank of an initialised process group; "done" or "stopped"."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optimizer, scheduler, sampler, train_set, test_set = build(args, rank, world)
    steps = -(-len(sampler) // args.batch_size)
    ctx = (model, optimizer, scheduler, sampler, train_set, snapshots, rank, world, steps)
    if rank == 0:
        print(f"attempt={attempt()} world_size={world} steps_per_epoch={steps}", flush=True)
    start_epoch, start = resume(args, snapshots, (model, optimizer, scheduler), steps, rank)
    outcome = "done"
    for epoch in range(start_epoch, args.epochs + 1):
        if run_epoch(args, ctx, epoch, start if epoch == start_epoch else 0) == "stopped":
            outcome = "stopped"
            break
        scheduler.step()
        if rank == 0:
            print(f"epoch={epoch} test_acc={evaluate(model, test_set):.4f} lr={scheduler.get_last_lr()[0]:.4f}",
                  flush=True)
        save(args, ctx, epoch + 1, 0)
    # leave cleanly: with gloo a DDP model still alive after destroy_process_group() can abort the exit
    del model, ctx
    gc.collect()
    return outcome


def init_group(rank: int, world: int) -> None:
    """Join the gloo group; under torchrun, in a key space of this attempt.

    Seen here with torch 2.13: torchrun's agent keeps one store for all attempts (TORCHELASTIC_USE_AGENT_STORE)
    and the default group's keys carry no attempt number, so the ranks of a restart read the dead attempt's
    addresses and fail to connect. A prefix per attempt keeps the attempts apart (so would running torchrun with
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, which gives every attempt a new store)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group("gloo", rank=rank, world_size=world)
        return
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False)
    prefix = f"attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    dist.init_process_group("gloo", store=dist.PrefixStore(prefix, store), rank=rank, world_size=world)


def main(argv=None, snapshots=None) -> None:
    args = parse_args(argv)
    if snapshots is None and args.snapshots:
        snapshots = load_snapshots(args.snapshots)
    env = rank_env()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    init_group(env.rank, env.world_size)
    try:
        outcome = run(args, snapshots)
    finally:
        dist.destroy_process_group()
    if env.rank == 0:
        print(f"{outcome}", flush=True)


if __name__ == "__main__":
    main()
