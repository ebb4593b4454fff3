"""The runs of notebook 09, one rank each (launched by ``course_lib.zero.lab``).

``accum``: one DDP step as a large batch, as micro-batches with ``no_sync``, and without it. ``sharded``: DDP, the
learner's ZeroOptimizer (stage 1 and 2) and FSDP2 on the same batches, with SGD + momentum (unlike Adam's
normalised step, it shows a gradient off by a factor); a method that fails emits ``error`` and the others go on.
"""
import argparse
import contextlib
import traceback

from course_lib import gridrun
from course_lib.checking.learner import explain
from course_lib.core import rankkit
from course_lib.core.loader import import_path
from course_lib.zero.measure import held, nbytes, state_bytes

METHODS = ("DDP", "ZeRO-1", "ZeRO-2", "FSDP2")
OPTIMIZER = {"lr": 0.05, "momentum": 0.9}     # torch.optim.SGD's: one buffer (the velocity) per parameter


def mlp(hidden=128, dtype=None):
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, 10))
    return model.to(dtype) if dtype else model


def global_batches(size, steps, dtype):
    """The same ``steps`` global batches on every rank (digits set, fixed order)."""
    import torch

    from course_lib.data import load_dataset
    train, _ = load_dataset("digits", quiet=True)
    g = torch.Generator().manual_seed(1)
    idx = torch.randperm(len(train), generator=g)[: size * steps].view(steps, size)
    return [(train.images[i].to(dtype), train.targets[i]) for i in idx]


def mine(batch, rank, world):
    x, y = batch
    per = len(y) // world
    return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]


# ---- gradient accumulation --------------------------------------------------------------------------------------
def counting_ddp(model, **options):
    """DDP whose all-reduces are noted in ``ddp.buckets`` (each bucket's elements, in order): a communication hook
    that notes, then does what DDP does."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP
    ddp = DDP(model, **options)
    ddp.buckets = []

    def hook(state, bucket):
        ddp.buckets.append(bucket.buffer().numel())
        return allreduce_hook(None, bucket)   # None: the default process group
    ddp.register_comm_hook(None, hook)
    return ddp


def accum_way(way, micro, batch, rank, world):
    """One optimizer step done ``way``; returns (all-reduces, numbers all-reduced, parameters after the step)."""
    import torch
    import torch.nn.functional as F
    ddp = counting_ddp(mlp(hidden=32, dtype=torch.float64))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    x, y = mine(global_batches(micro * batch * world, 1, torch.float64)[0], rank, world)
    if way == "large batch":
        F.cross_entropy(ddp(x), y).backward()
    else:
        for k, (xk, yk) in enumerate(zip(x.split(batch), y.split(batch))):
            quiet = ddp.no_sync() if way == "no_sync" and k < micro - 1 else contextlib.nullcontext()
            with quiet:   # the mean of the micro-batch means is the large batch's mean: divide by micro
                (F.cross_entropy(ddp(xk), yk) / micro).backward()
    opt.step()
    out = len(ddp.buckets), sum(ddp.buckets), torch.nn.utils.parameters_to_vector(ddp.parameters()).detach()
    del ddp   # before the process group goes (gloo: a DDP model alive at exit can abort the process)
    return out


def run_accum(micro, batch, rank, world):
    ways = ("large batch", "no_sync", "every micro-batch")
    results = {way: accum_way(way, micro, batch, rank, world) for way in ways}
    ref = results["large batch"][2]
    if rank == 0:
        for way, (calls, numbers, params) in results.items():
            rankkit.emit("accum", way=way, allreduces=calls, numbers=numbers, micro=micro, batch=batch,
                         diff=float((params - ref).abs().max()))


# ---- DDP, ZeRO-1/2, FSDP2 side by side ------------------------------------------------------------------------
def build(method, zero_mod, collectives):
    """(model, optimizer-like with step/zero_grad, inner torch optimizer) for ``method``."""
    import torch
    model = mlp()
    if method == "DDP":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model)
        opt = torch.optim.SGD(model.parameters(), **OPTIMIZER)
        return model, opt, opt
    if method == "FSDP2":
        from torch.distributed.fsdp import fully_shard
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)   # each layer its own unit: all-gathered for its forward, then freed
        fully_shard(model)
        opt = torch.optim.SGD(model.parameters(), **OPTIMIZER)
        return model, opt, opt
    zero = zero_mod.ZeroOptimizer(model.parameters(), torch.optim.SGD, stage=int(method[-1]),
                                  collectives=collectives, **OPTIMIZER)
    return model, zero, zero.optimizer


def memory(model, inner, zero):
    """Bytes on this rank right after a step: parameters, gradients (still allocated), optimizer state, and for ZeRO
    every other tensor its optimizer object or the model keeps alive (the shard's copy, anything in an attribute)."""
    grads = sum(nbytes(p.grad) for p in model.parameters())
    out = {"params": sum(nbytes(p) for p in model.parameters()), "grads": grads, "state": state_bytes(inner),
           "other": 0}
    if zero is not None:
        out["grads"] += nbytes(getattr(getattr(zero, "shard", None), "grad", None))
        found = held({"zero": zero, "model": model}, list(model.parameters()))
        out["other"] = max(0, sum(b for b, _, _ in found.values()) - out["grads"] - out["state"])
    return out


def train(method, zero_mod, collectives, batches, rank, world):
    import torch.distributed as dist
    import torch.nn.functional as F
    model, opt, inner = build(method, zero_mod, collectives)
    losses, mem = [], None
    for i, batch in enumerate(batches):
        x, y = mine(batch, rank, world)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if i == len(batches) - 1:
            mem = memory(model, inner, opt if method.startswith("ZeRO") else None)
        opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)                # the global batch's loss, for the curves
        losses.append(float(mean) / world)
    del model, opt, inner
    return losses, mem


def run_sharded(zero_file, steps, collectives, rank, world):
    import torch
    zero_mod = None
    try:
        zero_mod = import_path(zero_file, "learner_zero")
    except BaseException as e:
        rankkit.emit("error", method="ZeRO", rank=rank, message=f"zero.py does not load: {type(e).__name__}: {e}")
    batches = global_batches(64, steps, torch.float32)
    for method in METHODS:
        if method.startswith("ZeRO") and zero_mod is None:
            continue
        try:
            losses, mem = train(method, zero_mod, collectives, batches, rank, world)
        except Exception as e:   # the learner's ZeroOptimizer, or FSDP2 on a torch that cannot run it here
            rankkit.emit("error", method=method, rank=rank, message=explain(e, zero_file, "zero.py"),
                         trace=traceback.format_exc()[-600:])
            continue
        if rank == 0:
            rankkit.emit("loss", method=method, losses=losses)
        rankkit.emit("memory", method=method, rank=rank, world=world, **mem)


def main(argv=None):
    import torch
    import torch.distributed as dist
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["accum", "sharded"])
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--zero-file")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--collectives", default="mine", choices=["mine", "torch"])
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    rank, world = gridrun.start()
    if a.mode == "accum":
        run_accum(a.micro, a.batch, rank, world)
    else:
        run_sharded(a.zero_file, a.steps, a.collectives, rank, world)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    rankkit.exit_now(main())
