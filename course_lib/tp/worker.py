"""Worker of ``course check tp``: run as ranks by ``course_lib.core.launch.launch`` (or as one process for rank_groups).

    python -m course_lib.tp.worker PATH --mode groups|layers [--skip CASE,...] [--case-timeout S]

Talks to the checker through rankkit markers: per case ``start`` (case), one ``verdict`` (case, item, rank,
ok, message[, missing]) and ``end`` (case); ``stuck`` (case) when a case's watchdog fires. CASE is
``piece@setting@short``. The cases live in cases_fg.py, cases_linear.py, cases_blocks.py and cases_groups.py;
every comparison is against the serial computation in float64, within ``numerics.TOL``.
"""
from __future__ import annotations

import argparse
import functools

from course_lib.core import rankkit
from course_lib.core.loader import import_path
from course_lib.tp.cases_blocks import case_attention, case_mlp
from course_lib.tp.cases_fg import case_f, case_g
from course_lib.tp.cases_groups import case_init_groups, groups_verdict
from course_lib.tp.cases_linear import case_column, case_row
from course_lib.tp.failures import Fail, Missing, explain

# the collectives whose calls ParallelMLP's case counts
COUNTED = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast")

# (item, short name, case) in the order they run in each setting
LAYER_CASES = [("copy_to_parallel_region", "f", case_f), ("reduce_from_parallel_region", "g", case_g),
               ("ColumnParallelLinear", "col", functools.partial(case_column, gather=False)),
               ("ColumnParallelLinear", "colgather", functools.partial(case_column, gather=True)),
               ("RowParallelLinear", "row", functools.partial(case_row, parallel_input=True)),
               ("RowParallelLinear", "rowscatter", functools.partial(case_row, parallel_input=False)),
               ("ParallelMLP", "mlp", case_mlp), ("ParallelSelfAttention", "attn", case_attention)]


class Ctx:
    """What a case needs: the module, its group (None: all ranks), tp, this rank's index, a seed offset."""

    def __init__(self, mod, group, guard):
        import torch.distributed as dist
        self.mod, self.group, self.guard = mod, group, guard
        self.tp, self.r = dist.get_world_size(group), dist.get_rank(group)
        self.rank = dist.get_rank()
        self.seed = 1000 * (self.rank // self.tp)   # different data in different groups: mixing shows
        self.kw = {} if group is None else {"group": group}

    def take_counts(self):
        """The collectives the learner's code called since the last take."""
        return self.guard.take()


def load(path):
    return import_path(path, "learner_tp")


def load_or_report(path, rank):
    """The learner's module, or None after a verdict that says why it does not load."""
    try:
        return load(path)
    except BaseException as e:
        rankkit.emit("verdict", case="import", item=None, rank=rank, ok=False,
                     message=f"tp.py does not load: {explain(e, path)}")
        return None


def run_case(case, item, call, path, rank, watchdog, sync=None):
    """Run one check under the watchdog: a rank stuck in a collective exits so the checker can go on.

    ``sync`` (a group of the checker's own, so it never pairs with the learner's collectives): every rank
    waits there after the case, so no rank runs ahead into the next case while another is still in this one.
    """
    rankkit.emit("start", case=case)
    watchdog.arm(case)
    verdict = {"case": case, "item": item, "rank": rank, "ok": True, "message": ""}
    try:
        call()
    except Fail as e:
        verdict.update(ok=False, message=str(e))
    except Missing as e:
        verdict.update(ok=False, missing=True, message=str(e))
    except Exception as e:   # the learner's code raised
        verdict.update(ok=False, message=explain(e, path))
    rankkit.emit("verdict", **verdict)
    if sync is not None:
        import torch.distributed as dist
        dist.barrier(group=sync)
    watchdog.disarm()
    rankkit.emit("end", case=case)


def groups_mode(path):
    """rank_groups in this one process (pure Python)."""
    mod = load_or_report(path, 0)
    if mod is None:
        return
    rankkit.emit("start", case="rank_groups")
    rankkit.emit("verdict", **groups_verdict(mod))
    rankkit.emit("end", case="rank_groups")


def _settings(world, rank):
    """(setting, group) pairs: all ranks, then (on 4 ranks) two tp=2 groups, which shows whether group= is used."""
    import torch.distributed as dist
    settings = [("tp2", None)] if world == 2 else [("tp4", None)]
    if world == 4:
        subgroups = [dist.new_group([0, 1]), dist.new_group([2, 3])]   # every rank creates both, same order
        settings.append(("tp2of4", subgroups[rank // 2]))
    return settings


def _run_layer_cases(mod, path, rank, world, skip, watchdog, sync, guard):
    for setting, group in _settings(world, rank):
        ctx = Ctx(mod, group, guard)
        for item, short, fn in LAYER_CASES:
            case = f"{item}@{setting}@{short}"
            if case not in skip:
                run_case(case, item, functools.partial(fn, ctx), path, rank, watchdog, sync)
    case = "init_rank_groups@grid4@groups"
    if world == 4 and case not in skip:   # last: a wrong init_rank_groups may leave the default group's store bad
        ctx = Ctx(mod, None, guard)
        run_case(case, "init_rank_groups", functools.partial(case_init_groups, ctx), path, rank, watchdog, sync)


def layers_mode(path, skip, case_timeout):
    import torch
    import torch.distributed as dist
    env = rankkit.rank_env()
    dist.init_process_group("gloo", rank=env.rank, world_size=env.world_size)
    torch.set_default_dtype(torch.float64)
    sync = dist.new_group(backend="gloo")   # the checker's own group, for the barrier between cases
    watchdog = rankkit.Watchdog(case_timeout, lambda frames, case: rankkit.emit("stuck", case=case))
    with rankkit.CollectiveGuard(COUNTED, mode="count") as guard:   # before the learner's module binds any name
        mod = load_or_report(path, env.rank)
        if mod is None:
            return
        _run_layer_cases(mod, path, env.rank, env.world_size, skip, watchdog, sync, guard)
    dist.barrier(group=sync)
    dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--mode", choices=["groups", "layers"], required=True)
    p.add_argument("--skip", default="")
    p.add_argument("--case-timeout", type=float, default=30)
    a = p.parse_args(argv)
    if a.mode == "groups":
        groups_mode(a.path)
    else:
        layers_mode(a.path, set(filter(None, a.skip.split(","))), a.case_timeout)
    return 0


if __name__ == "__main__":
    rankkit.exit_now(main())
