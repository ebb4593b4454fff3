"""Train a one-layer causal attention model with data x context parallelism (dp x cp), using a cp.py of the course.

    python -m course_lib.cp.train --serial                                  # one process, the reference
    (4 ranks)  python -m course_lib.cp.train --cp-file CP_FILE --cp 2 --dp 2  # the cp exercise's file

The task: from a sequence of random feature vectors, predict at every position the mean of the vectors up to it
(a causal running mean: uniform attention over the past solves it). The model is q, k, v = Linear(x), causal
attention, an output Linear, in float64. The ranks form the grid of Megatron's order ``tp-cp-dp-pp`` (cp fastest:
cp groups [0, 1] and [2, 3], dp groups [0, 2] and [1, 3]). Each dp replica takes its share of the batch; inside a
replica each cp rank takes its tokens (the load-balanced split), computes its loss as the mean over its tokens,
and the learner's ``reduce_shared_grads`` averages every gradient over dp x cp. So every step is the serial step on
the whole batch, and the loss curves agree to rounding. One line per step::

    step=1 loss=0.123456789
"""
from __future__ import annotations

import argparse
import re
import sys

STEP_LINE = re.compile(r"^step=(\d+) loss=(\S+)$")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="dp x cp causal attention on a running-mean task, equal to serial")
    p.add_argument("--cp-file", help="the cp.py to use (learner's or solution); not needed with --serial")
    p.add_argument("--serial", action="store_true", help="train the plain model in this one process")
    p.add_argument("--cp", type=int, default=2)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--features", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32, help="global batch (split over the dp replicas)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def model(features: int, seed: int):
    import torch
    torch.manual_seed(seed)
    f64 = torch.float64
    return torch.nn.ModuleDict({"qkv": torch.nn.Linear(features, 3 * features, dtype=f64),
                                "out": torch.nn.Linear(features, features, dtype=f64)})


def forward(net, x, attend):
    q, k, v = net["qkv"](x).chunk(3, dim=-1)
    return net["out"](attend(q, k, v))


def batches(args):
    """(x, y) for every step, the same on every rank: y[:, t] is the mean of x[:, :t+1]."""
    import torch
    g = torch.Generator().manual_seed(args.seed)
    for _ in range(args.steps):
        x = torch.randn(args.batch_size, args.seq_len, args.features, generator=g, dtype=torch.float64)
        y = x.cumsum(1) / torch.arange(1, args.seq_len + 1, dtype=torch.float64)[None, :, None]
        yield x, y


def train_serial(args) -> list[float]:
    import torch
    import torch.nn.functional as F

    from course_lib.cp import reference
    net = model(args.features, args.seed)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    losses = []
    for x, y in batches(args):
        opt.zero_grad()
        loss = F.mse_loss(forward(net, x, reference.serial), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def train_parallel(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from course_lib.core.loader import import_path
    from course_lib.core.rankkit import RankEnvError, rank_env
    from course_lib.tp.grid import reference_rank_groups
    try:
        rank, _, world, _ = rank_env()
    except RankEnvError as e:
        sys.exit(str(e))
    if world != args.cp * args.dp:
        sys.exit(f"launch cp*dp = {args.cp * args.dp} ranks, not {world}")
    if args.seq_len % (2 * args.cp) or args.batch_size % args.dp:
        sys.exit("--seq-len must divide by 2*cp (the balanced split) and --batch-size by dp")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_default_dtype(torch.float64)
    cp_mod = import_path(args.cp_file, "cp_for_training")
    mine = {}
    for kind, groups in reference_rank_groups(world, cp=args.cp, dp=args.dp, order="tp-cp-dp-pp").items():
        for ranks in groups:
            if kind in ("cp", "dp"):
                group = dist.new_group(ranks)   # every rank creates every group, in the same order
                if rank in ranks:
                    mine[kind] = group
    c, d = dist.get_rank(mine["cp"]), dist.get_rank(mine["dp"])
    pos = cp_mod.split_positions(args.seq_len, args.cp, c, balanced=True)
    net = model(args.features, args.seed)       # the same initial weights as the serial run, on every rank
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    share = args.batch_size // args.dp
    for step, (x, y) in enumerate(batches(args), 1):
        x, y = x[d * share:(d + 1) * share, pos], y[d * share:(d + 1) * share, pos]   # this rank's tokens
        opt.zero_grad()
        out = forward(net, x, lambda q, k, v: cp_mod.cp_attention(q, k, v, pos, group=mine["cp"]))
        loss = F.mse_loss(out, y)                     # the mean over this rank's tokens
        loss.backward()
        cp_mod.reduce_shared_grads(list(net.parameters()), mine["dp"], mine["cp"])
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if rank == 0:
            print(f"step={step} loss={mean.item() / world!r}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def parse_output(lines) -> list[float]:
    return [float(m.group(2)) for m in map(STEP_LINE.match, (line.strip() for line in lines)) if m]


def main(argv=None):
    args = parse_args(argv)
    if args.serial:
        for step, loss in enumerate(train_serial(args), 1):
            print(f"step={step} loss={loss!r}", flush=True)
        return 0
    if not args.cp_file:
        sys.exit("give --cp-file PATH (your exercises/11_context_parallel/cp.py) or --serial")
    train_parallel(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
