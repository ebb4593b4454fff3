"""The cases of ``course check tp`` (course_lib.checking runs them), each against the serial computation in float64
within ``numerics.TOL``: ``rank_groups`` in one process, the operators and layers on tp=2, tp=4 and two tp=2 groups
inside 4 ranks (which shows whether ``group=`` is honoured), ``init_rank_groups`` on 4 ranks."""
import functools

from course_lib import checking, gridrun
from course_lib.checking.case import Case
from course_lib.tp import numerics
from course_lib.tp.cases_blocks import case_attention, case_mlp
from course_lib.tp.cases_groups import case_init_groups, case_rank_groups
from course_lib.tp.cases_linear import case_column, case_f, case_g, case_row
from course_lib.tp.cases_nobias import case_column_no_bias, case_mlp_no_bias, case_row_no_bias

FILE = LOAD_ITEM = "tp.py"
Ctx = numerics.Ctx       # the cases compute in float64
ITEMS = ("copy_to_parallel_region", "reduce_from_parallel_region", "ColumnParallelLinear", "RowParallelLinear",
         "ParallelMLP", "ParallelSelfAttention", "rank_groups", "init_rank_groups")
FIRST_WORLDS, WORLDS = (1,), (2, 4)      # rank_groups in one process, then the layers
GUARD = (("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast"), "count")
SETTING_TEXT = {"tp2": "tp=2", "tp4": "tp=4", "tp2of4": "tp=2 groups inside 4 ranks, group= given",
                "grid4": "4 ranks, tp=2 x dp=2"}
LAYERS = ITEMS[:4]
BUILT_ON = {"ColumnParallelLinear": LAYERS[:1], "RowParallelLinear": LAYERS[1:2], "ParallelMLP": LAYERS,
            "ParallelSelfAttention": LAYERS, "init_rank_groups": ("rank_groups",)}
# What a stuck case usually means, in the learner's terms.
HANG_HINTS = {
    "init_rank_groups": "every rank must call dist.new_group for EVERY group, in the same order, "
                        "even for the groups it is not a member of",
    None: "a collective that not every rank of the group calls waits forever; check that every rank runs the same "
          "all-reduce / all-gather (no `if rank == 0:` around one) and that each uses the group it was given",
}
# (item, short name, case) in the order they run in each setting
LAYER_CASES = [("copy_to_parallel_region", "f", case_f), ("reduce_from_parallel_region", "g", case_g),
               ("ColumnParallelLinear", "col", functools.partial(case_column, gather=False)),
               ("ColumnParallelLinear", "colgather", functools.partial(case_column, gather=True)),
               ("RowParallelLinear", "row", functools.partial(case_row, parallel_input=True)),
               ("RowParallelLinear", "rowscatter", functools.partial(case_row, parallel_input=False)),
               ("ParallelMLP", "mlp", case_mlp), ("ParallelSelfAttention", "attn", case_attention)]
# bias=False, after the cases with a bias: tp=2 only (no communication depends on it)
NO_BIAS_CASES = [("ColumnParallelLinear", "colnobias", case_column_no_bias),
                 ("RowParallelLinear", "rownobias", case_row_no_bias), ("ParallelMLP", "mlpnobias", case_mlp_no_bias)]
check = functools.partial(checking.check, "tp")   # course check tp PATH, from Python


def cases(world: int) -> list[Case]:
    if world == 1:
        return [Case("rank_groups", "rank_groups", case_rank_groups)]
    settings = {2: ["tp2"], 4: ["tp4", "tp2of4"]}.get(world, [])
    out = [Case(f"{item}:{setting}:{short}", item, functools.partial(in_setting, setting, fn), SETTING_TEXT[setting])
           for setting in settings for item, short, fn in LAYER_CASES + (NO_BIAS_CASES if setting == "tp2" else [])]
    if world == 4:   # last: a wrong init_rank_groups may leave the default group's store bad
        out.append(Case("init_rank_groups:grid4", "init_rank_groups", case_init_groups, SETTING_TEXT["grid4"]))
    return out


def in_setting(setting: str, fn, ctx):
    """Run ``fn`` with ctx given the setting's group (None: all ranks), tp, this rank's index in it, a seed."""
    import torch.distributed as dist
    if setting == "tp2of4" and "tp2of4" not in ctx.cache:
        ctx.cache["tp2of4"] = gridrun.grid_groups(ctx.rank, 4, ("tp",), "tp-cp-pp-dp", tp=2, dp=2)["tp"][1]
    group = ctx.cache.get(setting)
    ctx.tp, ctx.r = dist.get_world_size(group), dist.get_rank(group)
    ctx.seed = 1000 * (ctx.rank // ctx.tp)   # different data in different groups: mixing shows
    ctx.kw = {} if group is None else {"group": group}
    return fn(ctx)


def pass_text(item: str, recs) -> str:
    if item == "rank_groups":
        return recs[0].verdicts[0]["message"]
    if item == "init_rank_groups":
        return "4 ranks, tp=2 x dp=2 in two orders: each rank's groups match the grid and all-reduce within them"
    where = "; ".join(dict.fromkeys(r.label for r in recs))
    if item in ("copy_to_parallel_region", "reduce_from_parallel_region"):
        f = item.startswith("copy")
        return (f"forward and backward as Megatron's {'f' if f else 'g'} within 1e-10, sending one all-reduce's worth "
                f"{'backward' if f else 'forward'} and nothing more ({where})")
    return (f"forward, input grads and weight grads equal serial within 1e-10; it sends no more than it needs and "
            f"keeps only its shards ({where})")


def hint(item: str, first, recs) -> str:
    on_world = [not r.failed for r in recs if r.label == SETTING_TEXT["tp4"]]
    if first.label == SETTING_TEXT["tp2of4"] and on_world and all(on_world):
        return ("\n(it passes when the group is all ranks but not with a smaller group: pass group=... "
                "to every collective, and use dist.get_world_size(group) / dist.get_rank(group))")
    return ""
