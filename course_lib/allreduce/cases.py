"""The cases of ``course check allreduce``: each function on W = 1..5 real gloo ranks (course_lib.checking runs them).

A case passes when every rank's *input tensor* holds the sum afterwards (exact for integers), with no collective
called. A function's first failing case is its verdict.
"""
import functools
import inspect
import re

from course_lib import checking
from course_lib.allreduce.traffic import DEPTH, TRAFFIC, naive_traffic, ring_traffic, tree_traffic
from course_lib.checking.case import Case, Fail, Missing
from course_lib.checking.guard import ForbiddenCollective
from course_lib.checking.learner import error_where
from course_lib.checking.p2p import P2PMeter, events_of, post_events
from course_lib.checking.worker import peer_gone

FUNCTIONS = ("naive_allreduce", "ring_allreduce", "tree_allreduce")
ITEMS = FUNCTIONS
FILE, LOAD_ITEM = "allreduce.py", "import"
WORLDS = (1, 2, 3, 4, 5)
CASE_TIMEOUT = 10.0
PARALLEL = 2          # world sizes side by side: a rank waits for its peers often enough to leave a core free
STOP_ITEM = FRESH_AFTER_FAILURE = True
BIG = 1_000_003          # one case per function and world size: large messages
PRIME = 1009
# W -> the subgroup tried beside the whole world: it does not start at global rank 0, so a function that hands
# group ranks to send/recv (which take global ranks) fails; at W=5 its size, 3, is not a power of two
SUBGROUPS = {4: [2, 3], 5: [2, 3, 4]}
# Collectives the learner may not call: each is wrapped while the learner's code runs.
COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "_all_gather_base",
               "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "barrier", "monitored_barrier",
               "all_to_all", "all_to_all_single", "scatter", "gather", "all_gather_object", "gather_object",
               "broadcast_object_list", "scatter_object_list", "all_reduce_coalesced", "all_gather_coalesced")
GUARD = (COLLECTIVES, "forbid")
HANG_HINTS = {None: "a send or recv without its partner waits forever. With gloo a send waits for the matching "
                    "recv, so if every rank sends first nobody receives: post sends and receives together "
                    "(isend/irecv, batch_isend_irecv) or order them (even ranks send first, odd ranks receive "
                    "first) -- and check that every send has a recv on the rank it names, and that every isend's "
                    "work is kept and waited: gloo may never deliver a send whose work was dropped unwaited"}
check = functools.partial(checking.check, "allreduce")   # course check allreduce PATH, from Python


def cases(world: int) -> list[Case]:
    """Every function's cases, one function after the other."""
    return [Case(f"{fn}:{c['index']}", fn, functools.partial(run, fn, c), describe(c, world))
            for fn in FUNCTIONS for c in shapes(world) + group_shapes(world)]


def pass_text(item: str, recs) -> str:
    worlds = ", ".join(str(w) for w in dict.fromkeys(r.world for r in recs))
    text = f"W={worlds}: element counts 0, 1, W-1, W+1, a prime, 1,000,003 and a 2-D tensor; float32, float64, int64"
    tried = [f"{SUBGROUPS[w]} of W={w}" for w in dict.fromkeys(r.world for r in recs if r.key.count(":g"))]
    return text + (f"; and with group= a subgroup, ranks {' and '.join(tried)}" if tried else "")


def shapes(world: int) -> list[dict]:
    """The cases for one world size, the most telling first: a typical size, then the edges, then big."""
    pairs = dict.fromkeys((count, dtype) for count in (PRIME, world + 1, world - 1, 1, 0)
                          for dtype in ("float32", "float64", "int64"))      # W=2: W-1 = 1, once
    out = [{"shape": [count], "dtype": dtype} for count, dtype in pairs]
    out.append({"shape": [world + 1, 3], "dtype": "float32"})       # a 2-D tensor: elements, not rows
    out.append({"shape": [BIG], "dtype": "float32"})
    for i, case in enumerate(out):
        case["index"] = i
        case["group_kw"] = i % 2 == 1     # every other call passes group=None explicitly
    return out


def group_shapes(world: int) -> list[dict]:
    """The subgroup cases of one world size (none where ``SUBGROUPS`` has no group): a typical size, then fewer
    elements than members (empty chunks). Their index goes on after ``shapes``'s, with a "g" (the case's name)."""
    ranks = SUBGROUPS.get(world)
    if not ranks:
        return []
    base = len(shapes(world))
    return [{"shape": [count], "dtype": dtype, "index": f"g{base + i}", "seed": base + i, "group": ranks,
             "group_kw": True} for i, (count, dtype) in enumerate([(PRIME, "float32"), (len(ranks) - 1, "int64")])]


def describe(case: dict, world: int) -> str:
    shape = case["shape"]
    size = (f"{shape[0]:,} element{'s' if shape[0] != 1 else ''}" if len(shape) == 1
            else f"a 2-D tensor of shape {tuple(shape)}")
    group = f", group=ranks {case['group']} (dist.new_group)" if case.get("group") else ""
    return f"W={world}{group}, {size}, {case['dtype']}"


# ---- inputs and expected sums -------------------------------------------------------------------------

def make_input(case: dict, rank: int):
    """Rank ``rank``'s input: random, different on every rank, the same wherever it is made."""
    import torch
    g = torch.Generator().manual_seed(1000 * case.get("seed", case["index"]) + rank + 1)
    shape, dtype = case["shape"], getattr(torch, case["dtype"])
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
    # beyond 2**24 and 2**53 / W: a sum done in float32 or float64 is not exact
    return torch.randint(-2**55, 2**55, shape, generator=g, dtype=torch.int64)


def tolerance(dtype):
    import torch
    return {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12)}.get(dtype, (0.0, 0.0))


def fmt(values) -> str:
    vals = values.tolist()
    return "[" + ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in vals) + "]"


def diagnose(got, expected, original, world: int, inputs=None, ring: bool = False) -> str:
    """What is wrong with ``got`` (this rank's tensor after the call), in words a learner can act on (``inputs``:
    every member's input, to say whose contributions each chunk holds; ``ring``: name the ring's phases)."""
    import torch
    if got.dtype.is_floating_point:
        rtol, atol = tolerance(got.dtype)
        g, e = got.double().reshape(-1), expected.double().reshape(-1)
        bad = ~torch.isclose(g, e, rtol=rtol, atol=atol)
    else:
        g, e = got.reshape(-1), expected.reshape(-1)
        bad = g != e
    idx = bad.nonzero().reshape(-1)
    n = g.numel()
    first = int(idx[0])
    lo, hi = max(0, first - 1), min(n, first + 3)
    where = (f"{len(idx)} of {n} elements wrong (indices {int(idx[0])}..{int(idx[-1])}); "
             f"at [{lo}:{hi}] expected {fmt(e[lo:hi])}, got {fmt(g[lo:hi])}")
    hints = []
    o = original.reshape(-1)
    if torch.equal(got.reshape(-1), o):
        hints.append("the tensor still holds this rank's input: either the sum never comes back to this rank, "
                     "or it is not written into the tensor in place (`tensor += buf`, `tensor.copy_(...)`, "
                     "`dist.recv(tensor, ...)`; `tensor = tensor + buf` only rebinds a local name)")
    elif world > 1 and got.dtype.is_floating_point and torch.allclose(g, e / world, rtol=1e-4, atol=1e-6):
        hints.append(f"this is the mean: all-reduce(sum) must not divide by W={world}")
    elif got.dtype == torch.float64 and torch.allclose(g, e, rtol=1e-5, atol=1e-5):
        hints.append("close, but only to float32 precision: keep the tensor's dtype for buffers "
                     "(`torch.empty_like(tensor)`, not `torch.zeros(n)`)")
    elif not got.dtype.is_floating_point and ((g - e).abs() < e.abs() // 2**20 + 2**10).all():
        hints.append("integers must be exact: was the sum computed in floating point? keep the tensor's dtype")
    elif phase := which_phase(got, inputs, ring) if inputs else "":
        hints.append(phase)
    elif len(idx) < n:
        hints.append("only some elements are wrong: check the chunk boundaries (each of the W chunks, "
                     "the last one and empty ones too) and which chunk is sent at each step")
    return where + ("\nhint: " + "; ".join(hints) if hints else "")


def sum_of(part, inputs) -> list[int] | None:
    """The ranks whose inputs (``inputs``: their parts) add up to ``part``, or None when no set of them does."""
    import itertools

    import torch
    tol = tolerance(part.dtype)
    for k in range(len(inputs), 0, -1):
        for ranks in itertools.combinations(range(len(inputs)), k):
            total = torch.stack([inputs[r].double() for r in ranks]).sum(0)
            if torch.allclose(part.double(), total, rtol=tol[0], atol=tol[1]):
                return list(ranks)
    return None


def which_phase(got, inputs, ring: bool) -> str:
    """Whose contributions each chunk of ``got`` holds (the ring's cut: chunk i is [i*n//W, (i+1)*n//W)), and
    the phase that lost the others; "" when a chunk is no sum of inputs (then the cut itself is wrong)."""
    world, flat, n = len(inputs), got.reshape(-1), got.numel()
    cuts = [i * n // world for i in range(world + 1)] if ring else [0, n]
    held = []
    for i in range(len(cuts) - 1):
        if cuts[i] < cuts[i + 1]:
            ranks = sum_of(flat[cuts[i]:cuts[i + 1]], [x.reshape(-1)[cuts[i]:cuts[i + 1]] for x in inputs])
            if ranks is None:
                return ""
            held.append((i, ranks))
    full = [i for i, ranks in held if len(ranks) == world]
    said = "; ".join(f"{'chunk ' + str(i) + f' (elements {cuts[i]}..{cuts[i + 1] - 1})' if ring else 'it'} holds "
                     f"the sum of rank{'s' if len(r) > 1 else ''} {r if len(r) > 1 else r[0]} only"
                     for i, r in held if len(r) < world)
    if not ring:
        return f"{said}: the other ranks' contributions never reached this rank"
    if not full:
        return (f"{said}: no chunk holds the full sum, so contributions are lost in the reduce-scatter (each of its "
                "W-1 steps must ADD the received chunk into the chunk it belongs to, `chunks[recv_i] += buf`)")
    return (f"chunk{'s' if len(full) > 1 else ''} {', '.join(map(str, full))} hold{'s' if len(full) == 1 else ''} "
            f"the full sum, but {said}: the reduce-scatter worked and the all-gather did not bring every finished "
            "chunk round (W-1 steps, each receiving straight into the chunk's place)")


def learner_function(mod, name: str):
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise Missing(f"no function {name}(tensor, group=None) in the file")
    if "group" not in inspect.signature(fn).parameters:
        raise Fail(f"{name} must accept group=None: the interface is {name}(tensor, group=None)", kind="todo")
    return fn


def subgroup(ctx, ranks: list[int]):
    """The process group of global ``ranks``, made once per launch (dist.new_group: every rank calls it, in the
    same order, members or not)."""
    import torch.distributed as dist
    key = ("group", tuple(ranks))
    if key not in ctx.cache:
        ctx.cache[key] = dist.new_group(ranks, backend="gloo")
    return ctx.cache[key]


def run(name: str, case: dict, ctx) -> str:
    """Call the learner's function on this rank's input (the collective guard is on) and judge the tensor; a ring
    and a tree also on their rounds, from every rank's messages (``traffic.DEPTH``)."""
    if name not in DEPTH:
        call(name, case, ctx)
        return ""
    p2p = None
    try:
        p2p = call(name, case, ctx)
    finally:   # every rank, whatever its call did: a rank that passed waits for its partners' events
        post_events(ctx, p2p)
    members = case.get("group") or list(range(ctx.world))
    if p2p is not None and (problem := DEPTH[name](events_of(ctx, members))):
        raise Fail(problem)
    return ""


def call(name: str, case: dict, ctx):
    """The learner's function on this rank's input, its tensor and traffic judged (``Fail``); its P2PMeter, None on
    a rank outside the case's group."""
    import torch
    fn, path = learner_function(ctx.mod, name), ctx.path
    members = case.get("group") or list(range(ctx.world))
    group = subgroup(ctx, members) if case.get("group") else None
    if ctx.rank not in members:
        return None        # idle: the function runs on the group's members only
    world, me = len(members), members.index(ctx.rank)
    inputs = [make_input(case, r) for r in range(world)]
    wide = torch.float64 if inputs[0].dtype.is_floating_point else torch.int64
    expected = torch.stack([x.to(wide) for x in inputs]).sum(0)
    x = inputs[me].clone()
    original, ptr = inputs[me], x.data_ptr()
    ctx.guard.used.clear()
    try:
        with P2PMeter() as p2p:
            ret = fn(x, group=group) if case["group_kw"] else fn(x)
    except ForbiddenCollective as e:
        raise Fail(f"calls {e} (at {error_where(e, path)}): only point-to-point operations are allowed "
                   "(send, recv, isend, irecv, batch_isend_irecv)") from None
    except NotImplementedError as e:
        raise Fail(f"not written yet (NotImplementedError: {e})", kind="todo") from None
    except Exception as e:   # the learner's bug: report it with the line it came from
        where = error_where(e, path)
        text = re.sub(r"<[\w.]*ProcessGroup object at 0x[0-9a-f]+>", f"ranks {members}", str(e))
        raise Fail(f"raised {type(e).__name__}: {text}" + (f" (at {where})" if where else "")
                   + group_rank_hint(e, members, ctx.rank),
                   kind="peer_gone" if peer_gone(e) else "error", where=where) from None
    if ctx.guard.used:   # the learner caught our exception and went on
        raise Fail(f"calls dist.{ctx.guard.used[0]}: only point-to-point operations are allowed")
    problem = judge(x, ret, original, expected, ptr, world, inputs, name == "ring_allreduce")
    if problem is None and name == "naive_allreduce":
        problem = naive_traffic(p2p, me, world)
    if problem is None and name == "ring_allreduce":
        problem = ring_traffic(p2p, me, world, x)
    if problem is None and name == "tree_allreduce":
        problem = tree_traffic(p2p, me, world)
    if problem:
        raise Fail(problem)
    return p2p


def group_rank_hint(exc: BaseException, members: list[int], rank: int) -> str:
    """torch's "Global rank R is not part of group" on a subgroup: a group rank was given where a global one goes."""
    if members[0] == 0 or "is not part of group" not in str(exc):
        return ""
    return (f"\nhint: send, recv, isend, irecv and P2POp take GLOBAL ranks, also with group=: in the group "
            f"{members} this rank is group rank {members.index(rank)} but global rank {rank}, and group rank 0 is "
            f"global rank {members[0]}. Turn a group rank r into a global one with dist.get_global_rank(group, r) "
            f"(the file's peer(group, r))")


def judge(x, ret, original, expected, ptr: int, world: int, inputs=None, ring: bool = False) -> str | None:
    """What is wrong with ``x``, this rank's tensor after the call (``ret``: what the call returned), or None."""
    import torch
    if x.shape != original.shape or x.dtype != original.dtype:
        return (f"the tensor changed from {tuple(original.shape)} "
                f"{original.dtype} to {tuple(x.shape)} {x.dtype}: sum in place, keep shape and dtype")
    ok = _matches(x, expected)
    if not ok and isinstance(ret, torch.Tensor) and ret.shape == x.shape and _matches(ret, expected):
        return ("returned the sum as a new tensor but left the input "
                "unchanged: the caller keeps its tensor, so write the sum into it (`tensor.copy_(result)` "
                "or in-place ops)")
    if not ok:
        exact = expected if x.dtype.is_floating_point else expected.to(x.dtype)
        return diagnose(x, exact, original, world, inputs, ring)
    if x.data_ptr() != ptr:
        return ("the tensor's storage was replaced (`tensor.data = ...`): "
                "write into the existing tensor instead")
    return None


def _matches(x, expected) -> bool:
    import torch
    if x.dtype.is_floating_point:
        rtol, atol = tolerance(x.dtype)
        return bool(torch.allclose(x.double(), expected.double(), rtol=rtol, atol=atol))
    return bool(torch.equal(x.to(torch.int64), expected))


# ---- hints keyed to the first failing case (the harness's summary appends them to its message) -----------------

def hint(item: str, first, recs) -> str:
    """What the first failing case ``first`` tells beyond its own message: where every rank was, and what the
    cases that passed before it rule out (powers of two only, float32 only)."""
    lines = where_ranks_were(first)
    if any(TRAFFIC in v.get("message", "") for v in first.verdicts.values()):
        return "".join("\n" + line for line in lines)   # the values were right: nothing below applies
    passed = [r for r in recs if not r.failed]
    pow2 = [w for w in dict.fromkeys(r.world for r in passed) if w > 1 and w & (w - 1) == 0]
    failed_worlds = {r.world for r in recs if r.failed}
    if first.world & (first.world - 1) and pow2 and not failed_worlds & set(pow2):
        lines.append(f"hint: every case at W={', '.join(map(str, sorted(pow2)))} passed and W={first.world} is the "
                     "first world size that is not a power of two: the algorithm works only for powers of two. A "
                     "partner such as rank ^ mask or rank + mask can be >= W there: a rank whose partner does not "
                     "exist must skip that round (and its subtree must still get the result)")
    members = SUBGROUPS.get(first.world) if "group=ranks" in first.label else None
    if members and not any("take GLOBAL ranks" in v.get("message", "") for v in first.verdicts.values()):
        lines.append(f"hint: the whole-world cases at W={first.world} passed and this one runs on the group {members} "
                     "only (the other ranks idle): send and recv take global ranks, and the group (group=group): "
                     "group rank r is global rank dist.get_global_rank(group, r); a call without group= numbers the "
                     "ranks of the whole world, where group rank 0 is an idle rank")
    dtype = dtype_of(first)
    if dtype in ("float64", "int64") and any(r.world == first.world and dtype_of(r) == "float32" for r in passed):
        lines.append(f"hint: the float32 cases at W={first.world} passed and the first {dtype} case fails: every "
                     f"buffer must take the tensor's dtype (torch.empty_like(tensor), tensor.new_empty(n)); a "
                     f"float32 buffer for {dtype} data receives half the bytes that are sent, which gloo treats as "
                     "an error (it can end the receiving process and reset its partners' connections)")
    return "".join("\n" + line for line in lines)


def dtype_of(rec) -> str:
    return rec.label.rsplit(", ", 1)[-1]


def where_ranks_were(rec) -> list[str]:
    """For a hang, the ranks that could not say where they waited (for a case that failed on one rank's error while
    others never returned, the harness's message says where those were)."""
    missing = sorted(set(range(rec.world)) - set(rec.verdicts))
    if rec.ended == "hung" and not any(v.get("kind") == "error" for v in rec.verdicts.values()):
        # the hang message says where each rank waited that said so; a rank stopped by the launcher (after a
        # partner's deadline ended it) before its own fired could not
        silent = [r for r in missing if not rec.stuck.get(r)]
        return [f"rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))} gave no location: stopped "
                "before its own deadline fired (it waited as long as its partners)"] if silent else []
    return []
