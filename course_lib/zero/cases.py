"""The cases of ``course check zero`` (course_lib.checking runs them), on W = 2 and 4 real gloo ranks: shard_range,
reduce_scatter and all_gather on point-to-point operations only, then ZeRO-1/2 (zerocase.py).

Sub-cases end with ``ctx.agree_or_fail``: a rank running ahead into the next call would wait forever.
"""
import functools

from course_lib import checking
from course_lib.checking import case as harness
from course_lib.checking.case import Case, Fail
from course_lib.checking.p2p import P2PMeter
from course_lib.runtime.warm import DDP_IMPORTS
from course_lib.zero.groups import case_zero_on_groups

FILE = LOAD_ITEM = "zero.py"
LOAD_TEXT = "{file} does not load: {error}{at}"
ITEMS = ("shard_range", "reduce_scatter", "all_gather", "ZeRO-1", "ZeRO-2")
WORLDS = (2, 4)
COUNTED = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_single",
           "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all", "all_to_all_single",
           "scatter", "gather")
GUARD = (COUNTED, "count")
PRELOAD = DDP_IMPORTS      # the reference is torch's DDP: the server imports what it imports once, not each rank
BUILT_ON = {"reduce_scatter": ("shard_range",), "all_gather": ("shard_range",), "ZeRO-1": ("shard_range",),
            "ZeRO-2": ("shard_range",)}
HANG_HINTS = {None: "with gloo a send waits for its matching receive: if every rank sends first, nobody receives. "
                    "Post both at once (sendrecv, batch_isend_irecv) and check that every send has a receive on the "
                    "rank it names; and keep each isend's handle and wait() on it: a send never waited on may "
                    "never leave (a receive waited on does not complete the send that matches it)"}
TOL = {"float64": (1e-12, 1e-12), "float32": (1e-5, 1e-6)}
check = functools.partial(checking.check, "zero")   # course check zero PATH, from Python


def cases(world: int) -> list[Case]:
    return [Case(item, item, run, f"W={world}") for item, run in (
        ("shard_range", case_shard_range), ("reduce_scatter", case_reduce_scatter), ("all_gather", case_all_gather),
        ("ZeRO-1", functools.partial(case_zero_on_groups, stage=1)),
        ("ZeRO-2", functools.partial(case_zero_on_groups, stage=2)))]


class Ctx(harness.Ctx):
    def shards(self, n):
        """Every rank's (start, stop) as the learner's shard_range says (their collectives use it, right or wrong);
        the course's when it does not run."""
        try:
            return [tuple(int(v) for v in self.mod.shard_range(n, r, self.world)) for r in range(self.world)]
        except Exception:
            return [reference_range(n, r, self.world) for r in range(self.world)]

    def collectives(self):
        """The learner's own collectives once both passed (in this launch or an earlier one), else the library's."""
        return "mine" if self.passed.get("reduce_scatter") and self.passed.get("all_gather") else "torch"


FULL_WORLD = 4     # the smallest W where a ring's right and left neighbours differ
ONLY_SMALL = (" (only W={worlds} ran: at W=2 a rank's right and left neighbours are the same rank, so a ring that "
              "turns the wrong way gives the same result; W=4 would show it: check without quick mode)")


def pass_text(item: str, recs) -> str:
    recs = sorted(recs, key=lambda r: r.world)
    worlds = ", ".join(str(r.world) for r in recs)
    note = ONLY_SMALL.format(worlds=worlds) if recs[-1].world < FULL_WORLD and item != "shard_range" else ""
    if not item.startswith("ZeRO"):
        return f"W={worlds}: {recs[0].verdicts[0]['message']}{note}"
    figures = {r.world: r.verdicts[0]["figures"] for r in recs}
    own = not any(f.get("ran") for f in figures.values())     # the rings ran: they are what W=2 cannot judge
    note = f" (only W={worlds} ran: see reduce_scatter)" if note and own else ""
    ratios = "; ".join(f"W={w}: {f['ratio']:.2f}" for w, f in figures.items())
    held = "; ".join(f"W={w}: {f['held']:,} B" for w, f in figures.items())
    sent = "; ".join(f"W={w}: {f['sent']:,} B" for w, f in figures.items() if f.get("sent") is not None)
    return (f"{recs[-1].verdicts[0]['message'].split(';')[0]}; AdamW state on rank 0 / DDP's: {ratios}; "
            f"held on rank 0 after step() beyond the parameters: {held}"
            + (f"; sent by rank 0 in one step(): {sent}" if sent else "") + note)


def reference_range(n, rank, world):
    return rank * n // world, (rank + 1) * n // world


def sizes(world):
    """Element counts: a prime, then the edges (n < W, n not divisible by W, empty)."""
    return list(dict.fromkeys(n for n in (1009, world + 1, world - 1, 1, 0) if n >= 0))


# ---- shard_range ---------------------------------------------------------------------------------------------
def range_problem(fn, n, world):
    """What is wrong with ``fn``'s split of ``n`` elements over ``world`` ranks, or None."""
    got = [tuple(int(v) for v in fn(n, r, world)) for r in range(world)]
    label = f"shard_range(n={n}, W={world})"
    longest = -(-n // world)
    if got[0][0] != 0:
        return f"{label}: rank 0 starts at {got[0][0]}, not 0: elements 0..{got[0][0] - 1} belong to no rank"
    for r in range(world - 1):
        if got[r][1] != got[r + 1][0]:
            kind = "a gap" if got[r][1] < got[r + 1][0] else "an overlap"
            return (f"{label}: rank {r} stops at {got[r][1]} but rank {r + 1} starts at {got[r + 1][0]} ({kind}): "
                    "each shard must start where the previous one stops")
    if got[-1][1] != n:
        hint = " (n is not divisible by W: the remainder must go to some rank)" if n % world else ""
        return (f"{label}: the last rank stops at {got[-1][1]}, not n={n}: elements {got[-1][1]}..{n - 1} belong "
                f"to no rank{hint}" if got[-1][1] < n else f"{label}: the last rank stops at {got[-1][1]}, past n={n}")
    for r, (a, b) in enumerate(got):
        if not 0 <= b - a <= longest:
            return (f"{label}: rank {r} owns {b - a} elements; no shard may be longer than ceil(n/W) = {longest}, "
                    "or that rank holds more than its share")
    return None


def case_shard_range(c):
    fn = harness.need(c.mod, "shard_range", FILE)
    for world in range(1, 7):
        for n in sizes(world) + [101, 7 * world + 3]:
            problem = range_problem(fn, n, world)
            if problem:
                raise Fail(problem)
    return "every element owned by exactly one rank, in rank order, no shard longer than ceil(n/W) (W=1..6)"


# ---- reduce_scatter / all_gather ------------------------------------------------------------------------------
def rand(seed, n, dtype):
    import torch
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1).to(getattr(torch, dtype))


def _close(got, want, dtype):
    import torch
    rtol, atol = TOL[dtype]
    return got.shape == want.shape and bool(torch.allclose(got.double(), want.double(), rtol=rtol, atol=atol))


def no_collectives(c, fname):
    used = c.take_counts()
    if used:
        name = sorted(used)[0]
        raise Fail(f"{fname} calls dist.{name}: write it with point-to-point operations only (sendrecv, "
                   "isend/irecv); that is the exercise. ZeroOptimizer(collectives=\"torch\") uses the library's")


RING_05 = ("Notebook 05's ring ends with rank r holding the sum of chunk (r+1) % W; start one chunk earlier (send "
           "chunk (r-step-1) % W at step `step`) so that the last chunk each rank adds is its own")


def ring_problem(c, p2p, fname):
    """None when this rank sent only to its right neighbour and received only from its left (a ring, as the
    exercise asks: at W = 2 they are one rank, so only W >= 3 shows it); else whom it talked to."""
    if not p2p.off_ring(c.r, c.world):
        return None
    right, left = (c.r + 1) % c.world, (c.r - 1) % c.world
    half = "first" if fname == "reduce_scatter" else "second"
    return (f"{fname}, W={c.world}: the values are right, but rank {c.r} sent to ranks {sorted(p2p.sent_to, key=str)} "
            f"and received from {sorted(p2p.received_from, key=str)}: {fname} is the {half} half of your ring "
            f"all-reduce, where each rank sends only to its right neighbour (rank {right}) and receives only from its "
            f"left (rank {left}), W-1 steps of one chunk each (sendrecv): no rank waits on one owner after another")


def _rs_problem(c, got, inputs, b, dtype, scratch):
    """Why ``got`` is not this rank's shard of the sum, in words; None when it is. ``scratch``: the flat the
    learner's function was given (used as scratch space, it may hold a finished sum in the wrong place)."""
    import torch
    a0, b0 = b[c.r]
    total = torch.stack([x.double() for x in inputs]).sum(0)
    want = total[a0:b0]
    if not isinstance(got, torch.Tensor):
        return f"returned {type(got).__name__}, not a tensor holding this rank's shard of the sum"
    got = got.reshape(-1)
    if _close(got, want, dtype):
        return None
    label = f"W={c.world}, {len(total):,} elements, {dtype}, rank {c.r} (shard {a0}..{b0})"
    if got.numel() != b0 - a0:
        return f"{label}: returned {got.numel()} elements; this rank's shard has {b0 - a0}"
    nxt, who = b[(c.r + 1) % c.world], (c.r + 1) % c.world
    if nxt[1] - nxt[0] == got.numel() and _close(got, total[nxt[0]:nxt[1]], dtype):
        return f"{label}: returned the summed shard of rank {who}, not its own. {RING_05}"
    if c.world > 1 and nxt[1] > nxt[0] and _close(scratch[nxt[0]:nxt[1]], total[nxt[0]:nxt[1]], dtype):
        return f"{label}: the finished sum in flat is rank {who}'s shard, not this rank's. {RING_05}"
    if c.world > 1 and _close(got, want / c.world, dtype):
        return f"{label}: this is the mean; reduce_scatter must sum (ZeroOptimizer divides by W, once)"
    if _close(got, inputs[c.r].double()[a0:b0], dtype):
        return f"{label}: returned this rank's own input: nothing was added"
    return f"{label}: wrong values, largest error {float((got.double() - want).abs().max()):.3g}"


def case_reduce_scatter(c):
    fn = harness.need(c.mod, "reduce_scatter", FILE)
    for i, n in enumerate(sizes(c.world)):
        for dtype in ("float64", "float32"):
            inputs = [rand(100 * i + r, n, dtype) for r in range(c.world)]
            b = c.shards(n)
            c.take_counts()
            scratch = inputs[c.r].clone()
            with P2PMeter() as p2p:
                got = fn(scratch, **c.kw)
            no_collectives(c, "reduce_scatter")
            c.agree_or_fail(_rs_problem(c, got, inputs, b, dtype, scratch) or ring_problem(c, p2p, "reduce_scatter"))
    return f"this rank's shard of the sum (n = {', '.join(map(str, sizes(c.world)))}; float64, float32)"


def _ag_problem(c, flat, want, b, label):
    import torch
    covered = torch.cat([torch.arange(a0, b0) for a0, b0 in b])   # elements no shard holds are not judged here
    if _close(flat[covered], want[covered], "float64"):
        return None
    wrong = [r for r, (a0, b0) in enumerate(b) if not _close(flat[a0:b0], want[a0:b0], "float64")]
    if wrong == [c.r]:
        return f"{label}: this rank's own shard is missing from flat: copy it in too"
    if torch.isnan(flat).any():
        return (f"{label}: the shards of ranks {wrong} never arrived in flat (it still holds what was there "
                "before): receive each chunk straight into its place, W-1 steps")
    return f"{label}: the shards of ranks {wrong} hold wrong values (sent to or received into the wrong place?)"


def case_all_gather(c):
    import torch
    fn = harness.need(c.mod, "all_gather", FILE)
    for i, n in enumerate(sizes(c.world)):
        b = c.shards(n)
        full = rand(7 + i, n, "float64")       # rank r's shard: its slice of `full`
        flat = torch.full((n,), float("nan"), dtype=torch.float64)
        a0, b0 = b[c.r]
        c.take_counts()
        with P2PMeter() as p2p:
            ret = fn(full[a0:b0].clone(), flat, **c.kw)
        no_collectives(c, "all_gather")
        label = f"W={c.world}, {n:,} elements, rank {c.r}"
        problem = _ag_problem(c, flat, full, b, label)
        if problem and isinstance(ret, torch.Tensor) and ret.numel() == n and _close(ret.reshape(-1), full, "float64"):
            problem = f"{label}: returned the gathered vector but left flat unchanged: write into flat, in place"
        c.agree_or_fail(problem or ring_problem(c, p2p, "all_gather"))
    return f"every rank's shard in its place (n = {', '.join(map(str, sizes(c.world)))})"
