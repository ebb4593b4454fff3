"""Train an MLP classifier on digits with data x tensor parallelism (dp x tp), using a tp.py of the course.

    python -m course_lib.tp.train --serial                                   # one process, the reference
    (4 ranks)  python -m course_lib.tp.train --tp-file TP_FILE --tp 2 --dp 2    # the tp exercise's file

The model is ``fc1 -> GELU -> fc2 -> log_softmax`` on flattened 28x28 images: fc1 a ColumnParallelLinear
(784 -> hidden, split over tp), fc2 a RowParallelLinear (hidden -> 10): one all-reduce per step forward,
one backward, inside each tp group. Each dp replica takes its share of the global batch; gradients are
averaged over the dp group (what DDP does), so every step equals the serial step on the whole batch.

All in float64, with the serial model's initial weights copied shard by shard into the parallel layers,
so the loss curve equals the serial one to rounding. One line per step, then one line on memory::

    step=1 loss=2.3123456789012345
    params_per_rank=50890 bytes_per_rank=407120 serial_params=101770 serial_bytes=814160 tp=2 dp=2
"""
from __future__ import annotations

import argparse
import re
import sys

from course_lib import registry
from course_lib.core.loader import import_path
from course_lib.core.rankkit import RankEnvError, rank_env

STEP_LINE = re.compile(r"^step=(\d+) loss=(\S+)$")
MEMORY_LINE = re.compile(r"^params_per_rank=(\d+) bytes_per_rank=(\d+) serial_params=(\d+) serial_bytes=(\d+)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="dp x tp MLP on digits (float64), equal to the serial run")
    p.add_argument("--tp-file", help="the tp.py to use (learner's or solution); not needed with --serial")
    p.add_argument("--serial", action="store_true", help="train the plain model in this one process")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64, help="global batch (split over the dp replicas)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dataset", default="digits")
    return p.parse_args(argv)


def serial_model(hidden, seed):
    import torch
    import torch.nn as nn
    torch.manual_seed(seed)
    # float64 from the start: the same random numbers whatever torch's default dtype is in this process
    f64 = torch.float64
    return nn.ModuleDict({"fc1": nn.Linear(784, hidden, dtype=f64), "fc2": nn.Linear(hidden, 10, dtype=f64)})


def forward(model, x):
    import torch.nn.functional as F
    return F.log_softmax(model["fc2"](F.gelu(model["fc1"](x.flatten(1)))), dim=1)


def batches(args):
    """The same global batches on every rank: a fixed permutation of the training set, float64."""
    import torch

    from course_lib.data import load_dataset
    train, _ = load_dataset(args.dataset)
    g = torch.Generator().manual_seed(args.seed)
    step = 0
    while True:
        for idx in torch.randperm(len(train), generator=g).split(args.batch_size):
            if len(idx) < args.batch_size:
                break   # equal-sized batches only, so dp shares are equal
            yield train.images[idx].double(), train.targets[idx]
            step += 1
            if step == args.steps:
                return


def param_bytes(model):
    return sum(p.numel() for p in model.parameters()), sum(p.numel() * p.element_size() for p in model.parameters())


def train_serial(args) -> list[float]:
    import torch
    import torch.nn.functional as F
    model = serial_model(args.hidden, args.seed)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    losses = []
    for x, y in batches(args):
        opt.zero_grad()
        loss = F.nll_loss(forward(model, x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def load_tp(path):
    return import_path(path, "tp_for_training")


def train_parallel(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    try:
        rank, _, world, _ = rank_env()
    except RankEnvError as e:
        sys.exit(str(e))
    if world != args.tp * args.dp:
        sys.exit(f"launch tp*dp = {args.tp * args.dp} ranks, not {world}")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_default_dtype(torch.float64)
    tp = load_tp(args.tp_file)
    groups = tp.init_rank_groups(tp=args.tp, dp=args.dp)
    tp_group, dp_group = groups["tp"], groups["dp"]
    t, d = dist.get_rank(tp_group), dist.get_rank(dp_group)

    model = nn.ModuleDict({
        "fc1": tp.ColumnParallelLinear(784, args.hidden, gather_output=False, group=tp_group),
        "fc2": tp.RowParallelLinear(args.hidden, 10, input_is_parallel=True, group=tp_group),
    }).double()
    # the serial model's weights, this rank's shard of each (the exercise's layout, Megatron's)
    ref, h = serial_model(args.hidden, args.seed), args.hidden // args.tp
    with torch.no_grad():
        model["fc1"].weight.copy_(ref["fc1"].weight[t * h:(t + 1) * h])
        model["fc1"].bias.copy_(ref["fc1"].bias[t * h:(t + 1) * h])
        model["fc2"].weight.copy_(ref["fc2"].weight[:, t * h:(t + 1) * h])
        model["fc2"].bias.copy_(ref["fc2"].bias)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    share = args.batch_size // args.dp
    for step, (x, y) in enumerate(batches(args), 1):
        x, y = x[d * share:(d + 1) * share], y[d * share:(d + 1) * share]   # this replica's share
        opt.zero_grad()
        loss = F.nll_loss(forward(model, x), y)
        loss.backward()
        for p in model.parameters():   # data parallelism: average the gradients over the replicas
            dist.all_reduce(p.grad, group=dp_group)
            p.grad /= args.dp
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=dp_group)
        if rank == 0:
            print(f"step={step} loss={mean.item() / args.dp!r}", flush=True)
    n, b = param_bytes(model)
    sn, sb = param_bytes(ref)
    if rank == 0:
        print(f"params_per_rank={n} bytes_per_rank={b} serial_params={sn} serial_bytes={sb} tp={args.tp} dp={args.dp}",
              flush=True)
    dist.barrier()
    dist.destroy_process_group()


def parse_output(lines):
    """(losses, memory dict or None) from the lines of a run."""
    losses, memory = [], None
    for line in lines:
        m = STEP_LINE.match(line.strip())
        if m:
            losses.append(float(m.group(2)))
        m = MEMORY_LINE.match(line.strip())
        if m:
            memory = dict(zip(("params_per_rank", "bytes_per_rank", "serial_params", "serial_bytes"),
                              map(int, m.groups())))
    return losses, memory


def main(argv=None):
    args = parse_args(argv)
    if args.serial:
        import torch
        torch.set_default_dtype(torch.float64)
        for step, loss in enumerate(train_serial(args), 1):
            print(f"step={step} loss={loss!r}", flush=True)
        return 0
    if not args.tp_file:
        sys.exit(f"give --tp-file PATH (your exercises/{registry.get('tp').file}) or --serial")
    train_parallel(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
