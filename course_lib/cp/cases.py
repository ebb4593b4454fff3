"""The cases of ``course check cp`` (course_lib.checking runs them): every comparison is against one process in
float64, within ``course_lib.tp.numerics.TOL``.

``split_positions`` and ``merge_partials`` run in one process (pure functions); the rest as real gloo ranks with
cp = 1, 2, 3, 4 (the group: every rank) and, on 4 ranks, dp = 2 x cp = 2 (cp groups [0, 1] and [2, 3], dp groups
[0, 2] and [1, 3]: ``group=`` must be honoured, and the two dp replicas hold different data). Each distributed case
builds the whole sequence in every rank from a seed, gives each rank its shard at the checker's own positions
(plain and load-balanced), and compares the learner's output and every gradient with the same computation done on
the whole sequence in one process. The cases live in cases_local.py, cases_attention.py and cases_grads.py.
"""
from __future__ import annotations

import functools

from course_lib import checking
from course_lib.checking.case import Case
from course_lib.cp.cases_attention import case_attention, case_gather, case_ring, case_unshard
from course_lib.cp.cases_grads import case_reduce, case_train_step
from course_lib.cp.cases_local import case_merge, case_split
from course_lib.tp import numerics

FILE = LOAD_ITEM = "cp.py"
ITEMS = ("split_positions", "unshard_sequence", "gather_sequence", "cp_attention", "merge_partials",
         "ring_attention", "reduce_shared_grads")
FIRST_WORLDS, WORLDS = (1,), (2, 3, 4)
PARALLEL = 2
CASE_TIMEOUT = 20.0
COUNTED = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
           "broadcast", "all_to_all", "all_to_all_single")
GUARD = (COUNTED, "count")
BUILT_ON = {"cp_attention": ("gather_sequence",), "ring_attention": ("merge_partials",)}
HANG_HINTS = {
    "ring_attention": "with gloo a send waits for its matching recv: if every rank sends to the next before it "
                      "receives from the previous, every rank waits; post the isend and the irecv together "
                      "(dist.batch_isend_irecv with P2POp, or isend + irecv, then wait on both)",
    None: "a collective that not every rank of the group calls waits forever: every rank must make the same calls "
          "in the same order, each with the group it was given",
}
# (item, short name, case): the order they run in each setting
DIST_CASES = [("unshard_sequence", "unshard", functools.partial(case_unshard, balanced=False)),
              ("unshard_sequence", "unshard_bal", functools.partial(case_unshard, balanced=True)),
              ("gather_sequence", "gather", case_gather),
              ("cp_attention", "attn", functools.partial(case_attention, balanced=False)),
              ("cp_attention", "attn_bal", functools.partial(case_attention, balanced=True)),
              ("ring_attention", "ring", functools.partial(case_ring, balanced=False)),
              ("ring_attention", "ring_bal", functools.partial(case_ring, balanced=True)),
              ("reduce_shared_grads", "reduce", case_reduce),
              ("reduce_shared_grads", "train", case_train_step)]


def check(path, **options):
    """``course check cp PATH`` from Python: a Report (``world_sizes=(2,)``: one process and 2 ranks only)."""
    return checking.check("cp", path, **options)


def setting_text(world: int, grid: bool) -> str:
    return "4 ranks, dp=2 x cp=2, group= given" if grid else f"cp={world}"


def cases(world: int) -> list[Case]:
    out = []
    if world == 1:
        out += [Case("split_positions", "split_positions", case_split, "one process"),
                Case("merge_partials", "merge_partials", case_merge, "one process")]
    for grid in (True, False) if world == 4 else (False,):   # dp x cp first: it names dp-only mistakes
        name = "dp2cp2" if grid else f"cp{world}"
        out += [Case(f"{item}:{name}:{short}", item, functools.partial(in_setting, grid, fn), setting_text(world, grid))
                for item, short, fn in DIST_CASES]
    return out


class Ctx(numerics.Ctx):
    FILE = FILE


class Setting:
    """What a distributed case needs: the module, the cp and dp groups, their sizes, this rank's indices, a seed
    (per dp replica: different data in different replicas)."""

    def __init__(self, ctx, cp_group, dp_group, grid: bool):
        import torch.distributed as dist
        self.mod, self.need, self.take_counts, self.grid = ctx.mod, ctx.need, ctx.take_counts, grid
        self.agree_or_fail = ctx.agree_or_fail     # every rank stops at the same sub-case (no rank left waiting)
        self.cp_group, self.dp_group = cp_group, dp_group
        self.group = cp_group if grid else None           # what the learner's cp functions get
        self.kw = {"group": cp_group} if grid else {}
        self.cp, self.r = dist.get_world_size(cp_group), dist.get_rank(cp_group)
        self.dp, self.dp_rank = dist.get_world_size(dp_group), dist.get_rank(dp_group)
        self.rank = dist.get_rank()
        self.seed = 1000 * self.dp_rank


def groups(ctx, grid: bool):
    """(cp group, dp group) of this rank, made once per launch; every rank creates every group in the same order."""
    import torch.distributed as dist
    key = "grid" if grid else "flat"
    if key not in ctx.cache:
        if grid:   # 4 ranks: cp fastest (Megatron's tp-cp-dp-pp order with tp = pp = 1)
            cps = [dist.new_group([0, 1]), dist.new_group([2, 3])]
            dps = [dist.new_group([0, 2]), dist.new_group([1, 3])]
            ctx.cache[key] = (cps[ctx.rank // 2], dps[ctx.rank % 2])
        else:      # every rank in one cp group; dp = 1: a group of this rank alone
            alone = [dist.new_group([r]) for r in range(ctx.world)]
            ctx.cache[key] = (dist.group.WORLD, alone[ctx.rank])
    return ctx.cache[key]


def in_setting(grid: bool, fn, ctx):
    cp_group, dp_group = groups(ctx, grid)
    return fn(Setting(ctx, cp_group, dp_group, grid))


def pass_text(item: str, recs) -> str:
    where = ", ".join(dict.fromkeys(r.label for r in recs))
    texts = {
        "split_positions": "every token on exactly one rank for S = cp..13, cp = 1..4; plain contiguous with sizes "
                           "within one; balanced chunks r and 2cp-1-r",
        "merge_partials": "equals softmax over both blocks within 1e-10, a fully masked block included",
        "unshard_sequence": f"the whole sequence on every rank, S not divisible by cp, plain and balanced ({where})",
        "gather_sequence": f"forward all-gathers, backward reduce-scatters, within 1e-10 ({where})",
        "cp_attention": f"output and q, k, v grads equal one process within 1e-10, plain and balanced ({where})",
        "ring_attention": f"output equals one process within 1e-10 with send/recv only ({where})",
        "reduce_shared_grads": f"grads averaged over dp x cp; a training step's grads equal one process ({where})",
    }
    return texts[item]


def hint(item: str, first, recs) -> str:
    flat = [not r.failed for r in recs if r.label.startswith("cp=")]
    if first.label.startswith("4 ranks") and flat and all(flat):
        return ("\n(it passes when the group is every rank but not with dp=2 x cp=2: pass group=... to every "
                "collective, and use dist.get_world_size(group) / dist.get_rank(group) / dist.get_global_rank)")
    return ""
