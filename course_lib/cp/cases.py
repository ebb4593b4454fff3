"""The cases of ``course check cp`` (course_lib.checking runs them), each against one process in float64 within
``course_lib.tp.numerics.TOL``: ``split_positions`` and ``merge_partials`` in one process, the rest on cp = 1..4
gloo ranks, dp=2 x cp=2 and tp=2 x cp=2 (``group=`` honoured, different data per dp replica; with tp fastest a cp
group is not ranks 0..cp-1 and dp x cp not the world), every rank given its shard at the checker's own positions
(plain and load-balanced)."""
import functools

from course_lib import checking, gridrun
from course_lib.checking.case import Case, Fail
from course_lib.cp import reference
from course_lib.cp.cases_attention import case_attention, case_gather, case_unshard
from course_lib.cp.cases_grads import case_reduce, case_train_step
from course_lib.cp.cases_ring import case_ring
from course_lib.tp import numerics
from course_lib.tp.grid import reference_rank_groups
from course_lib.tp.numerics import close, diff, rand

FILE = LOAD_ITEM = "cp.py"
Ctx = numerics.Ctx       # the cases compute in float64
ITEMS = ("split_positions", "unshard_sequence", "gather_sequence", "cp_attention", "merge_partials",
         "ring_attention", "reduce_shared_grads")
FIRST_WORLDS, WORLDS = (1,), (2, 3, 4)
PARALLEL = 2
CASE_TIMEOUT = 20.0
# every collective, so that ring_attention is held to send/recv (a gather then a scatter is an all-gather too; a
# barrier moves no data, but it is a collective: every rank of the group waits for the slowest at every step)
COUNTED = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
           "broadcast", "all_to_all", "all_to_all_single", "gather", "scatter", "reduce", "barrier",
           "monitored_barrier")
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
# the 4-rank grids, on Megatron's order (tp fastest, then cp, then dp): label, sizes. dp x cp is every rank, cp groups
# [0, 1] and [2, 3]; with tp fastest the cp groups are [0, 2] and [1, 3] and dp x cp is half the world, so that a
# group ignored, or a group rank taken for a global one, shows
GRIDS = {"dp2cp2": ("4 ranks, dp=2 x cp=2, group= given", {"cp": 2, "dp": 2}),
         "tp2cp2": ("4 ranks, tp=2 x cp=2 (cp groups [0, 2] and [1, 3]), group= given", {"tp": 2, "cp": 2})}
check = functools.partial(checking.check, "cp")   # course check cp PATH, from Python


def cases(world: int) -> list[Case]:
    out = []
    if world == 1:
        out += [Case("split_positions", "split_positions", case_split, "one process"),
                Case("merge_partials", "merge_partials", case_merge, "one process")]
    for name in (*GRIDS, None) if world == 4 else (None,):   # the grids first: they name the group mistakes
        label = GRIDS[name][0] if name else f"cp={world}"
        out += [Case(f"{item}:{name or f'cp{world}'}:{short}", item, functools.partial(in_setting, name, fn), label)
                for item, short, fn in DIST_CASES]
    return out


def in_setting(grid: str | None, fn, ctx):
    """Run ``fn`` with ctx given this rank's cp and dp groups, their sizes, its indices in them, the ranks that share
    its weights (``ctx.shared``: its dp x cp block) and a seed per dp replica (different data in different
    replicas); every rank creates every group once per launch, in order. ``grid``: a name of GRIDS, or None: dp = 1,
    every rank one cp group."""
    import torch.distributed as dist
    key = grid or "flat"
    if key not in ctx.cache:
        sizes = GRIDS[grid][1] if grid else {"cp": ctx.world, "dp": 1}
        mine = gridrun.grid_groups(ctx.rank, ctx.world, ("cp", "dp") if grid else ("dp",), "tp-cp-dp-pp", **sizes)
        everyone = reference_rank_groups(ctx.world, order="tp-cp-dp-pp", **sizes)
        cp_ranks = mine["cp"][0] if grid else list(range(ctx.world))
        shared = sorted({m for g in everyone["dp"] if set(g) & set(cp_ranks) for m in g})
        ctx.cache[key] = (mine["cp"][1] if grid else dist.group.WORLD, mine["dp"][1], shared)
    ctx.cp_group, ctx.dp_group, ctx.shared = ctx.cache[key]
    ctx.kw = {"group": ctx.cp_group} if grid else {}     # what the learner's cp functions get
    ctx.cp, ctx.r = dist.get_world_size(ctx.cp_group), dist.get_rank(ctx.cp_group)
    ctx.dp, ctx.dp_rank = dist.get_world_size(ctx.dp_group), dist.get_rank(ctx.dp_group)
    ctx.seed = 1000 * ctx.dp_rank
    return fn(ctx)


def pass_text(item: str, recs) -> str:
    where = ", ".join(dict.fromkeys(r.label for r in recs))
    texts = {
        "split_positions": "every token on exactly one rank for S = cp..13, cp = 1..4; plain contiguous with sizes "
                           "within one; balanced chunks r and 2cp-1-r",
        "merge_partials": "equals softmax over both blocks within 1e-10, a fully masked block and lse values near "
                          "1000 (exp overflows) included",
        "unshard_sequence": f"the whole sequence on every rank, S not divisible by cp, plain and balanced ({where})",
        "gather_sequence": f"within 1e-10; forward sends an all-gather's bytes, backward a reduce-scatter's ({where})",
        "cp_attention": f"output and q, k, v grads equal one process within 1e-10, plain and balanced ({where})",
        "ring_attention": f"output equals one process within 1e-10 with send/recv only, to one neighbour and from the "
                          f"other, one shard's keys at a time ({where})",
        "reduce_shared_grads": f"grads averaged over dp x cp; a training step's grads equal one process ({where})",
    }
    return texts[item]


def hint(item: str, first, recs) -> str:
    flat = [not r.failed for r in recs if r.label.startswith("cp=")]
    if first.label.startswith("4 ranks") and flat and all(flat):
        grid = first.label.split(", group=")[0].removeprefix("4 ranks, ")
        return (f"\n(it passes when the group is every rank but not with {grid}: pass group=... to every "
                f"collective, and use dist.get_world_size(group) / dist.get_rank(group) / dist.get_global_rank)")
    return ""


# The cases run in one process: split_positions (every rank's share, asked rank by rank) and merge_partials.
MAX_SEQ = 13
LARGE_LSE = 1000.0   # added to every lse: exp of it is inf in float64


def _as_positions(got, what):
    import torch
    try:
        t = torch.as_tensor(got)
    except Exception:
        raise Fail(f"{what} must return a LongTensor of positions; it returned {type(got).__name__}") from None
    if t.dim() != 1 or (t.numel() and t.is_floating_point()):
        raise Fail(f"{what} must return a 1-D LongTensor of positions; it returned {t.dtype} of shape {list(t.shape)}")
    return t.long()


def _tokens_once(shares, seq_len, cp, mode):
    """Every token 0..S-1 on exactly one rank: name the lost and the duplicated ones."""
    import torch
    where = f"seq_len={seq_len}, cp={cp}, {mode}"
    every = torch.cat(shares) if shares else torch.empty(0, dtype=torch.long)
    outside = sorted({int(p) for p in every if not 0 <= int(p) < seq_len})
    if outside:
        raise Fail(f"{where}: positions {outside} are outside 0..{seq_len - 1}")
    count = torch.bincount(every, minlength=seq_len)
    lost = (count == 0).nonzero().flatten().tolist()
    if lost:
        raise Fail(f"{where}: the split loses tokens {lost} (no rank holds them; S is not divisible by cp: the "
                   f"remainder must go somewhere, e.g. one more token on the first S % cp ranks)")
    dup = (count > 1).nonzero().flatten().tolist()
    if dup:
        holders = [r for r, s in enumerate(shares) if dup[0] in s.tolist()]
        raise Fail(f"{where}: the split duplicates tokens {dup} (token {dup[0]} is on ranks {holders})")


def case_split(ctx):
    fn = ctx.need("split_positions")
    for cp in range(1, 5):
        for seq_len in range(cp, MAX_SEQ + 1):
            for balanced in (False, True):
                mode = "balanced" if balanced else "plain"
                shares = [_as_positions(fn(seq_len, cp, r, balanced=balanced), f"split_positions({seq_len}, {cp}, "
                                        f"{r}, balanced={balanced})") for r in range(cp)]
                _tokens_once(shares, seq_len, cp, mode)
                for r, s in enumerate(shares):
                    if s.numel() > 1 and not bool((s[1:] > s[:-1]).all()):
                        raise Fail(f"seq_len={seq_len}, cp={cp}, {mode}: rank {r}'s positions {s.tolist()} are not "
                                   f"ascending")
                (_balanced if balanced else _plain)(shares, seq_len, cp)
    return None


def _plain(shares, seq_len, cp):
    sizes = [s.numel() for s in shares]
    flat = [p for s in shares for p in s.tolist()]
    if flat != list(range(seq_len)):
        raise Fail(f"seq_len={seq_len}, cp={cp}, plain: each rank must hold a contiguous block, rank 0 first; got "
                   f"{[s.tolist() for s in shares]}")
    if max(sizes) - min(sizes) > 1:
        raise Fail(f"seq_len={seq_len}, cp={cp}, plain: shard sizes {sizes} differ by more than one (the last rank "
                   f"is short or idle); give the remainder one token each to the first ranks (tensor_split's rule)")


def _balanced(shares, seq_len, cp):
    want = [reference.positions(seq_len, cp, r, balanced=True).tolist() for r in range(cp)]
    got = [s.tolist() for s in shares]
    if got != want:
        raise Fail(f"seq_len={seq_len}, cp={cp}, balanced: expected {want} (of 2*cp={2 * cp} chunks, "
                   f"torch.tensor_split's sizes, rank r holds chunks r and {2 * cp - 1}-r), got {got}")


def case_merge(ctx):
    import torch
    fn = ctx.need("merge_partials")
    q, k, v = rand(1, 2, 3, 4), rand(2, 2, 8, 4), rand(3, 2, 8, 4)
    q_pos, k_pos = torch.tensor([2, 5, 7]), torch.arange(8)
    a, b = slice(0, 3), slice(3, 8)          # query 0 (position 2) sees nothing of block b: lse_b = -inf there
    out_a, lse_a = reference.block(q, k[:, a], v[:, a], q_pos, k_pos[a])
    out_b, lse_b = reference.block(q, k[:, b], v[:, b], q_pos, k_pos[b])
    want = reference.attention(q, k, v, q_pos, k_pos)
    want_lse = torch.logaddexp(lse_a, lse_b)
    got = fn(out_a.clone(), lse_a.clone(), out_b.clone(), lse_b.clone())
    if not (isinstance(got, tuple) and len(got) == 2):
        raise Fail("merge_partials must return a tuple (out, lse)")
    out, lse = got
    if not close(out, want):
        if close(out, (out_a + out_b) / 2):
            raise Fail("merge_partials averages the two partial outputs: each was normalised over its own block, so "
                       "they must be weighed by their share of the joint softmax denominator, exp(lse_x - lse) with "
                       "lse = logaddexp(lse_a, lse_b): the log-sum-exp correction")
        if out is not None and torch.isnan(out).any():
            raise Fail("merge_partials returns nan where a block is fully masked (its lse is -inf): torch.logaddexp "
                       "and exp(lse_b - lse) give 0 weight there without special cases")
        raise Fail(f"merge_partials: out differs from the softmax over both blocks; {diff(out, want)}")
    if not close(lse, want_lse):
        raise Fail(f"merge_partials: lse must be the log of the joint denominator, logaddexp(lse_a, lse_b); "
                   f"{diff(lse, want_lse)}")
    _merge_large(fn, out_a, lse_a, out_b, lse_b, want, want_lse)
    return None


def _merge_large(fn, out_a, lse_a, out_b, lse_b, want, want_lse):
    """Large scores: every lse raised by the same LARGE_LSE leaves the merged output as it was and raises the
    merged lse by as much, but exp(lse) itself overflows (float64 beyond ~709, float32 beyond ~88, float16 ~11)."""
    got = fn(out_a.clone(), (lse_a + LARGE_LSE).clone(), out_b.clone(), (lse_b + LARGE_LSE).clone())
    out, lse = got if isinstance(got, tuple) and len(got) == 2 else (None, None)
    if out is None or not close(out, want) or not close(lse, want_lse + LARGE_LSE):
        broken = "nan or inf" if out is not None and not bool(out.isfinite().all()) else "a wrong result"
        raise Fail(f"merge_partials gives {broken} when the lse values are large (the same blocks, every lse "
                   f"{LARGE_LSE:g} higher: the output must not change): exp(lse) overflows (float64 beyond ~709, "
                   f"float32 beyond ~88, large attention scores get there); subtract the maximum before taking exp: "
                   f"lse = torch.logaddexp(lse_a, lse_b), weights exp(lse_a - lse) and exp(lse_b - lse)")
