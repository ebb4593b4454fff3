"""Train an MLP classifier on digits with data x tensor parallelism (dp x tp), using a tp.py of the course.

    python -m course_lib.tp.train --serial                                   # one process, the reference
    (4 ranks)  python -m course_lib.tp.train --tp-file TP_FILE --tp 2 --dp 2    # the tp exercise's file

``fc1 -> GELU -> fc2 -> log_softmax`` on flattened 28x28 images, fc1 column- and fc2 row-parallel inside each tp
group, the gradients averaged over the dp group; in float64 from the serial model's initial weights, shard by
shard, so the loss curve equals the serial one to rounding. One line per step, then one on memory::

    step=1 loss=2.3123456789012345
    params_per_rank=50890 bytes_per_rank=407120 serial_params=101770 serial_bytes=814160 tp=2 dp=2
"""
import argparse
import itertools
import sys

from course_lib import gridrun
from course_lib.core.loader import import_path
from course_lib.tp.shards import load_column, load_row


def parser(exercise: str, description: str, **defaults):
    """The options of a dp x EXERCISE run (here, cp.train's and pp.train's): the learner's file, --serial, and one
    option per default, of the default's type."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(f"--{exercise}-file",
                   help=f"the {exercise}.py to use (learner's or solution); not needed with --serial")
    p.add_argument("--serial", action="store_true", help="train the plain model in this one process")
    for name, default in defaults.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default,
                       help="global batch (split over the dp replicas)" if name.startswith("batch") else None)
    return p


def parse_args(argv=None):
    return parser("tp", "dp x tp MLP on digits (float64), equal to the serial run", tp=2, dp=2, hidden=128, steps=30,
                  batch_size=64, lr=0.1, seed=1, dataset="digits").parse_args(argv)


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

    def epochs():
        while True:
            for idx in torch.randperm(len(train), generator=g).split(args.batch_size):
                if len(idx) == args.batch_size:   # equal-sized batches only, so dp shares are equal
                    yield train.images[idx].double(), train.targets[idx]
    return itertools.islice(epochs(), args.steps)


def param_bytes(model):
    return sum(p.numel() for p in model.parameters()), sum(p.numel() * p.element_size() for p in model.parameters())


def train_serial(args) -> list[float]:
    import torch.nn.functional as F
    model = serial_model(args.hidden, args.seed)
    return list(gridrun.sgd(model.parameters(), batches(args), lambda x, y: F.nll_loss(forward(model, x), y), args.lr))


def train_parallel(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    rank, _ = gridrun.start(args.tp * args.dp, "tp*dp")
    torch.set_default_dtype(torch.float64)
    tp = import_path(args.tp_file, "tp_for_training")
    groups = tp.init_rank_groups(tp=args.tp, dp=args.dp)
    tp_group, dp_group = groups["tp"], groups["dp"]
    t, d = dist.get_rank(tp_group), dist.get_rank(dp_group)

    model = nn.ModuleDict({
        "fc1": tp.ColumnParallelLinear(784, args.hidden, gather_output=False, group=tp_group),
        "fc2": tp.RowParallelLinear(args.hidden, 10, input_is_parallel=True, group=tp_group),
    }).double()
    # the serial model's weights, this rank's shard of each (the exercise's layout, Megatron's)
    ref = serial_model(args.hidden, args.seed)
    load_column(model["fc1"], ref["fc1"], args.tp, t)
    load_row(model["fc2"], ref["fc2"], args.tp, t)
    share = args.batch_size // args.dp
    mine = ((x[d * share:(d + 1) * share], y[d * share:(d + 1) * share]) for x, y in batches(args))  # this replica's

    def reduce_grads():   # data parallelism: average the gradients over the replicas
        for p in model.parameters():
            dist.all_reduce(p.grad, group=dp_group)
            p.grad /= args.dp
    losses = gridrun.sgd(model.parameters(), mine, lambda x, y: F.nll_loss(forward(model, x), y), args.lr,
                         reduce_grads, dp_group)
    for step, loss in enumerate(losses, 1):
        if rank == 0:
            gridrun.print_step(step, loss)
    n, b = param_bytes(model)
    sn, sb = param_bytes(ref)
    if rank == 0:
        print(f"params_per_rank={n} bytes_per_rank={b} serial_params={sn} serial_bytes={sb} tp={args.tp} dp={args.dp}",
              flush=True)
    dist.barrier()
    dist.destroy_process_group()


def parse_output(lines):
    """(losses, memory dict or None) from the lines of a run."""
    lines = [line.strip() for line in lines]
    memory = [dict((k, int(v)) for k, v in (f.split("=") for f in line.split()))
              for line in lines if line.startswith("params_per_rank=")]
    return gridrun.parse_losses(lines), memory[-1] if memory else None


def main(argv=None):
    return gridrun.main(parse_args(argv), train_serial, train_parallel, "tp")


if __name__ == "__main__":
    sys.exit(main())
