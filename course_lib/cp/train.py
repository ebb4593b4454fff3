"""Train a one-layer causal attention model with data x context parallelism (dp x cp), using a cp.py of the course.

    python -m course_lib.cp.train --serial                                  # one process, the reference
    (4 ranks)  python -m course_lib.cp.train --cp-file CP_FILE --cp 2 --dp 2  # the cp exercise's file

The task: predict at every position the mean of the random feature vectors up to it (uniform attention over the
past solves it), in float64. On Megatron's grid (cp fastest) each dp replica takes its share of the batch, each cp
rank its tokens (the balanced split) and the mean loss over them; the learner's ``reduce_shared_grads`` averages
over dp x cp, so the loss curve equals the serial one to rounding. One line per step: ``step=1 loss=0.123456789``.
"""
import sys

from course_lib import gridrun
from course_lib.core.loader import import_path
from course_lib.cp import reference
from course_lib.gridrun import parse_losses as parse_output  # noqa: F401 - notebook 11 reads its run with it
from course_lib.tp.train import parser


def parse_args(argv=None):
    return parser("cp", "dp x cp causal attention on a running-mean task, equal to serial", cp=2, dp=2, features=8,
                  seq_len=16, batch_size=32, steps=30, lr=2.0, seed=1).parse_args(argv)


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
    import torch.nn.functional as F
    net = model(args.features, args.seed)
    return list(gridrun.sgd(net.parameters(), batches(args),
                            lambda x, y: F.mse_loss(forward(net, x, reference.serial), y), args.lr))


def train_parallel(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    if args.seq_len % (2 * args.cp) or args.batch_size % args.dp:
        sys.exit("--seq-len must divide by 2*cp (the balanced split) and --batch-size by dp")
    rank, world = gridrun.start(args.cp * args.dp, "cp*dp")
    torch.set_default_dtype(torch.float64)
    cp_mod = import_path(args.cp_file, "cp_for_training")
    groups = gridrun.grid_groups(rank, world, ("dp", "cp"), "tp-cp-dp-pp", cp=args.cp, dp=args.dp)
    (_, dp_group), (_, cp_group) = groups["dp"], groups["cp"]
    c, d = dist.get_rank(cp_group), dist.get_rank(dp_group)
    pos = cp_mod.split_positions(args.seq_len, args.cp, c, balanced=True)
    net = model(args.features, args.seed)       # the same initial weights as the serial run, on every rank
    share = args.batch_size // args.dp
    mine = ((x[d * share:(d + 1) * share, pos], y[d * share:(d + 1) * share, pos]) for x, y in batches(args))

    def loss_of(x, y):   # the mean over this rank's tokens
        return F.mse_loss(forward(net, x, lambda q, k, v: cp_mod.cp_attention(q, k, v, pos, group=cp_group)), y)
    losses = gridrun.sgd(net.parameters(), mine, loss_of, args.lr,
                         lambda: cp_mod.reduce_shared_grads(list(net.parameters()), dp_group, cp_group),
                         dist.group.WORLD)
    for step, loss in enumerate(losses, 1):
        if rank == 0:
            gridrun.print_step(step, loss)
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None):
    return gridrun.main(parse_args(argv), train_serial, train_parallel, "cp")


if __name__ == "__main__":
    sys.exit(main())
