"""What the dp x tp, dp x cp and dp x pp runs of notebooks 06, 11 and 12 share (``course_lib.tp.train``,
``course_lib.cp.train``, ``course_lib.pp.train`` and their measurements): a gloo rank started from torchrun's (or
srun's) environment, this rank's process groups on Megatron's rank grid, plain SGD steps, and the
``step=N loss=X`` lines rank 0 prints and the notebook reads back.
"""
import datetime
import re
import sys

from course_lib import registry
from course_lib.core.rankkit import RankEnvError, rank_env

STEP_LINE = re.compile(r"^step=(\d+) loss=(\S+)$")


def start(world: int | None = None, what: str = "", timeout_s: float | None = None) -> tuple[int, int]:
    """Join the gloo process group as the environment says: (rank, world size). ``world``: the ranks the run
    needs (``what`` says how they are counted, e.g. "tp*dp"); another number stops the run with that message."""
    import torch.distributed as dist
    try:
        rank, _, size, _ = rank_env()
    except RankEnvError as e:
        sys.exit(str(e))
    if world is not None and size != world:
        sys.exit(f"launch {what} = {world} ranks, not {size}")
    timeout = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    dist.init_process_group("gloo", rank=rank, world_size=size, **timeout)
    return rank, size


def grid_groups(rank: int, world: int, kinds, order: str, **sizes) -> dict:
    """{kind: (ranks, process group)} of this rank for each of ``kinds``, on Megatron's grid
    (``course_lib.tp.grid.reference_rank_groups``); every rank creates every group, in the same order, as
    dist.new_group asks."""
    import torch.distributed as dist

    from course_lib.tp.grid import reference_rank_groups
    grid, mine = reference_rank_groups(world, order=order, **sizes), {}
    for kind in kinds:
        for ranks in grid[kind]:
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[kind] = (ranks, group)
    return mine


def sgd(params, batches, loss_of, lr: float, reduce_grads=None, mean_over=None):
    """Plain SGD, one step per ``(x, y)`` of ``batches``: ``loss_of(x, y)`` is this rank's loss, ``reduce_grads()``
    (a parallel run's) averages the gradients over the ranks before the step. Yields each step's loss, averaged
    over the process group ``mean_over`` when given (each rank's loss a mean over an equal share)."""
    import torch
    import torch.distributed as dist
    opt = torch.optim.SGD(params, lr=lr)
    for x, y in batches:
        opt.zero_grad()
        loss = loss_of(x, y)
        loss.backward()
        if reduce_grads is not None:
            reduce_grads()
        opt.step()
        mean = loss.detach().clone()
        if mean_over is not None:
            dist.all_reduce(mean, group=mean_over)
            mean /= dist.get_world_size(mean_over)
        yield mean.item()


def print_step(step: int, loss: float) -> None:
    print(f"step={step} loss={loss!r}", flush=True)


def parse_losses(output) -> list[float]:
    """The losses of the ``step=N loss=X`` lines of a run's output (its text, or its lines)."""
    lines = output.splitlines() if isinstance(output, str) else output
    return [float(m.group(2)) for m in map(STEP_LINE.match, (line.strip() for line in lines)) if m]


def main(args, train_serial, train_parallel, exercise: str) -> int:
    """``--serial``: the serial run's step lines; else ``train_parallel(args)`` on the learner's file, given as
    ``--EXERCISE-file``."""
    if args.serial:
        for step, loss in enumerate(train_serial(args), 1):
            print_step(step, loss)
        return 0
    if not getattr(args, f"{exercise}_file"):
        sys.exit(f"give --{exercise}-file PATH (your exercises/{registry.get(exercise).file}) or --serial")
    train_parallel(args)
    return 0
