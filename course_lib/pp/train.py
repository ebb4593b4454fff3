"""dp x pp training with the learner's 1F1B: ``python -m course_lib.pp.train --pp-file PATH --dp 2 --pp 2`` as
dp * pp ranks; ``--serial``: one process, the whole batch. The ranks lie on Megatron-core's default grid (a dp group
is neighbouring ranks, one node; the stages vary slowest, across nodes); each stage averages its gradients over its
dp group before its SGD step, so in float64 the loss curve equals the serial one to rounding.
"""
import sys

from course_lib import gridrun
from course_lib.core.loader import import_path
from course_lib.gridrun import parse_losses  # noqa: F401 - notebook 12 reads its run with it
from course_lib.pp import pipe as pp
from course_lib.tp.train import parser

ORDER = "tp-cp-dp-pp"


def data(steps: int, batch: int, width: int):
    """A regression task: inputs and a fixed 'teacher' network's outputs, one batch per step."""
    import torch
    teacher = pp.make_model(2, width, seed=123)
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(batch, width, generator=g, dtype=torch.float64) for _ in range(steps)]
    with torch.no_grad():
        return [(x, teacher(x)) for x in xs]


def train_serial(a) -> list[float]:
    model = pp.make_model(a.layers, a.width)
    return list(gridrun.sgd(model.parameters(), data(a.steps, a.batch, a.width), lambda x, y: pp.mse(model(x), y),
                            a.lr))


def train_parallel(a) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    rank, world = gridrun.start(timeout_s=60)
    mine = gridrun.grid_groups(rank, world, ("pp", "dp"), ORDER, dp=a.dp, pp=a.pp)
    (pp_ranks, pp_group), (dp_ranks, dp_group) = mine["pp"], mine["dp"]
    stage, replica = pp_ranks.index(rank), dp_ranks.index(rank)
    print(f"rank {rank}: stage {stage} of pp group {pp_ranks}, dp replica {replica} of dp group {dp_ranks}",
          flush=True)
    mod = import_path(a.pp_file, "learner_pp")
    model = pp.make_model(a.layers, a.width)
    share = a.batch // a.dp
    pipe = pp.make_pipe(model, a.pp, stage, a.m, share // a.m, ranks=pp_ranks, group=pp_group)
    for step, (x, y) in enumerate(data(a.steps, a.batch, a.width), 1):
        pipe.module.zero_grad()        # once per step, never between micro-batches
        rows = slice(replica * share, (replica + 1) * share)
        loss = mod.one_f_one_b(pipe, list(x[rows].chunk(a.m)), list(y[rows].chunk(a.m)))
        with torch.no_grad():
            for p in pipe.module.parameters():
                dist.all_reduce(p.grad, group=dp_group)
                p -= a.lr * p.grad / a.dp
        if pipe.last:
            total = torch.tensor([loss], dtype=torch.float64)
            dist.all_reduce(total, group=dp_group)
            if replica == 0:
                gridrun.print_step(step, float(total) / a.dp)
    dist.destroy_process_group()


def parse_args(argv=None):
    return parser("pp", __doc__.splitlines()[0], dp=2, pp=2, m=4, steps=30, batch=32, layers=4, width=8,
                  lr=0.2).parse_args(argv)


def main(argv=None) -> int:
    return gridrun.main(parse_args(argv), train_serial, train_parallel, "pp")


if __name__ == "__main__":
    sys.exit(main())
