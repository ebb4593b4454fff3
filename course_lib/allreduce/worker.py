"""One rank of ``course check allreduce``: runs a learner's all-reduce functions on test cases.

Started by the checker through ``course_lib.core.launch.launch`` (srun-style environment), one launch per
world size::

    python -m course_lib.allreduce.worker PATH --functions ring_allreduce,tree_allreduce

It prints progress markers, one JSON object per line after ``@@ ``, that the checker reads:
``import`` (could the file be loaded, which functions it has), ``begin`` and ``result`` per case,
``stuck`` when a case ran past its deadline (with the learner's line the rank was waiting on), and
``done``. A function's first failing case ends it. Then the run ends too (exit code 0) unless nothing can be
in flight (W=1, or NotImplementedError everywhere): a failed function may leave unmatched sends
behind that would confuse the next one, so the checker goes on in a fresh launch.
"""
from __future__ import annotations

import argparse
import datetime
import inspect

from course_lib.core.loader import import_path
from course_lib.core.rankkit import (
    CollectiveGuard,
    ForbiddenCollective,
    RankEnvError,
    Watchdog,
    emit,
    error_where,
    exit_now,
    learner_line,
    rank_env,
)

FUNCTIONS = ("naive_allreduce", "ring_allreduce", "tree_allreduce")
BIG = 1_000_003          # one case per function and world size: large messages
PRIME = 1009
# Collectives the learner may not call: each is wrapped while the learner's code runs.
COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "_all_gather_base",
               "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "barrier", "monitored_barrier",
               "all_to_all", "all_to_all_single", "scatter", "gather", "all_gather_object", "gather_object",
               "broadcast_object_list", "scatter_object_list", "all_reduce_coalesced", "all_gather_coalesced")


def cases(world: int) -> list[dict]:
    """The cases for one world size, the most telling first: a typical size, then the edges, then big."""
    counts = [PRIME, world + 1, world - 1, 1, 0]
    out, seen = [], set()
    for count in counts:
        for dtype in ("float32", "float64", "int64"):
            if (count, dtype) not in seen:
                seen.add((count, dtype))
                out.append({"shape": [count], "dtype": dtype})
    out.append({"shape": [world + 1, 3], "dtype": "float32"})       # a 2-D tensor: elements, not rows
    out.append({"shape": [BIG], "dtype": "float32"})
    for i, case in enumerate(out):
        case["index"] = i
        case["group_kw"] = i % 2 == 1     # every other call passes group=None explicitly
    return out


def describe(case: dict, world: int) -> str:
    shape = case["shape"]
    size = (f"{shape[0]:,} element{'s' if shape[0] != 1 else ''}" if len(shape) == 1
            else f"a 2-D tensor of shape {tuple(shape)}")
    return f"W={world}, {size}, {case['dtype']}"


# ---- inputs and expected sums -------------------------------------------------------------------------

def make_input(case: dict, rank: int):
    """Rank ``rank``'s input: random, different on every rank, the same wherever it is made."""
    import torch
    g = torch.Generator().manual_seed(1000 * case["index"] + rank + 1)
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


def diagnose(got, expected, original, world: int) -> str:
    """What is wrong with ``got`` (this rank's tensor after the call), in words a learner can act on."""
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
    elif len(idx) < n:
        hints.append("only some elements are wrong: check the chunk boundaries (each of the W chunks, "
                     "the last one and empty ones too) and which chunk is sent at each step")
    return where + ("\nhint: " + "; ".join(hints) if hints else "")


# ---- running one case ---------------------------------------------------------------------------------

def watchdog(path: str, seconds: float) -> Watchdog:
    """A per-case deadline: past it, say where this rank waits (a ``stuck`` marker), then the rank exits."""
    def on_fire(frames, fn: str, index: int) -> None:
        emit("stuck", fn=fn, case=index, seconds=seconds, waiting="agree" in [f.name for f in frames],
             where=learner_line(frames, path))
    return Watchdog(seconds, on_fire)


def load(path: str, guard: CollectiveGuard):
    """Import the learner's file by path; collectives are wrapped already (a `from ... import` sees the guard)."""
    with guard:
        return import_path(path, "learner_allreduce")


PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Failed to recv, got 0 bytes")


def peer_gone(e: Exception) -> bool:
    """Gloo's error on this rank when a partner's process ended and closed its connection: what a rank still
    waiting sees after a stuck partner's watchdog ended it, not a fault of this rank's own code."""
    return any(s in str(e) for s in PEER_GONE)


def run_case(fn, case: dict, world: int, rank: int, guard: CollectiveGuard, path: str) -> dict:
    """Call the learner's function on this rank's input; return {"ok": bool, "kind": str, "msg": str}."""
    import torch
    inputs = [make_input(case, r) for r in range(world)]
    wide = torch.float64 if inputs[0].dtype.is_floating_point else torch.int64
    expected = torch.stack([x.to(wide) for x in inputs]).sum(0)
    x = inputs[rank].clone()
    original, ptr = inputs[rank], x.data_ptr()
    guard.used.clear()
    try:
        with guard:
            ret = fn(x, group=None) if case["group_kw"] else fn(x)
    except ForbiddenCollective as e:
        return {"ok": False, "kind": "collective",
                "msg": f"calls {e} (at {error_where(e, path)}): only point-to-point operations are allowed "
                       "(send, recv, isend, irecv, batch_isend_irecv)"}
    except NotImplementedError as e:
        return {"ok": False, "kind": "todo", "msg": f"not written yet (NotImplementedError: {e})"}
    except Exception as e:   # the learner's bug: report it with the line it came from
        where = error_where(e, path)
        return {"ok": False, "kind": "peer_gone" if peer_gone(e) else "error", "where": where,
                "msg": f"raised {type(e).__name__}: {e}" + (f" (at {where})" if where else "")}
    if guard.used:   # the learner caught our exception and went on
        return {"ok": False, "kind": "collective",
                "msg": f"calls dist.{guard.used[0]}: only point-to-point operations are allowed"}
    return judge(x, ret, original, expected, ptr, world)


def judge(x, ret, original, expected, ptr: int, world: int) -> dict:
    """The verdict on ``x``, this rank's tensor after the call (``ret``: what the call returned)."""
    import torch
    if x.shape != original.shape or x.dtype != original.dtype:
        return {"ok": False, "kind": "shape", "msg": f"the tensor changed from {tuple(original.shape)} "
                f"{original.dtype} to {tuple(x.shape)} {x.dtype}: sum in place, keep shape and dtype"}
    ok = _matches(x, expected)
    if not ok and isinstance(ret, torch.Tensor) and ret.shape == x.shape and _matches(ret, expected):
        return {"ok": False, "kind": "returned", "msg": "returned the sum as a new tensor but left the input "
                "unchanged: the caller keeps its tensor, so write the sum into it (`tensor.copy_(result)` "
                "or in-place ops)"}
    if not ok:
        exact = expected if x.dtype.is_floating_point else expected.to(x.dtype)
        return {"ok": False, "kind": "value", "msg": diagnose(x, exact, original, world)}
    if x.data_ptr() != ptr:
        return {"ok": False, "kind": "returned", "msg": "the tensor's storage was replaced (`tensor.data = ...`): "
                "write into the existing tensor instead"}
    return {"ok": True, "kind": "ok", "msg": ""}


def _matches(x, expected) -> bool:
    import torch
    if x.dtype.is_floating_point:
        rtol, atol = tolerance(x.dtype)
        return bool(torch.allclose(x.double(), expected.double(), rtol=rtol, atol=atol))
    return bool(torch.equal(x.to(torch.int64), expected))


def agree(res: dict, guard: CollectiveGuard) -> tuple[bool, bool]:
    """(passed on every rank, safe to go on in this launch) -- a real all-reduce of our own.

    Going on after a failure is safe only when no message can be left in flight: with one rank, or
    when every rank stopped at NotImplementedError (a starter function).
    """
    import torch
    flags = torch.tensor([0 if res["ok"] else 1, 0 if res["kind"] in ("ok", "todo") else 1])
    guard.original("all_reduce")(flags)
    return int(flags[0]) == 0, int(flags[1]) == 0


# ---- one launch -----------------------------------------------------------------------------------------

def import_learner(path: str, guard: CollectiveGuard, seconds: float):
    """The learner's module, or None after an ``import`` marker saying why it could not be loaded."""
    def hangs(_frames) -> None:
        emit("import", ok=False, error=f"loading the file took more than {seconds:.0f} s "
             "(a loop or a blocking call at the top level of the file?)", where="")
    deadline = Watchdog(seconds, hangs)
    deadline.arm()
    try:
        return load(path, guard)
    except BaseException as e:   # SyntaxError, ImportError, an exception or exit at import time
        emit("import", ok=False, error=f"{type(e).__name__}: {e}", where=error_where(e, path))
        return None
    finally:
        deadline.disarm()


def interface(module, names: list[str]) -> dict:
    """name -> "ok", "missing" or "no group parameter"."""
    found = {}
    for name in names:
        fn = getattr(module, name, None)
        if not callable(fn):
            found[name] = "missing"
        elif "group" not in inspect.signature(fn).parameters:
            found[name] = "no group parameter"
        else:
            found[name] = "ok"
    return found


def run_function(fn, name: str, world: int, rank: int, guard: CollectiveGuard, path: str,
                 deadline: Watchdog) -> tuple[bool, bool]:
    """Every case of ``fn`` until the first failure: (passed, safe to go on in this launch)."""
    passed, clean = True, True
    for case in cases(world):
        emit("begin", fn=name, case=case["index"], label=describe(case, world))
        deadline.arm(name, case["index"])
        res = run_case(fn, case, world, rank, guard, path)
        emit("result", fn=name, case=case["index"], rank=rank, **res)
        passed, clean = agree(res, guard)
        deadline.disarm()
        if not passed:
            break
    emit("fn_done", fn=name, ok=passed)
    return passed, clean


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path")
    p.add_argument("--functions", default=",".join(FUNCTIONS))
    p.add_argument("--case-timeout", type=float, default=10.0)
    args = p.parse_args(argv)
    try:
        env = rank_env()
    except RankEnvError as e:
        p.error(str(e))

    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    guard = CollectiveGuard(COLLECTIVES, mode="forbid")
    module = import_learner(args.path, guard, args.case_timeout)
    if module is None:
        exit_now(0)
    found = interface(module, args.functions.split(","))
    emit("import", ok=True, functions=found)

    # the library's own timeout only backs up the watchdog, which reports more clearly
    dist.init_process_group("gloo", rank=env.rank, world_size=env.world_size,
                            timeout=datetime.timedelta(seconds=args.case_timeout + 60))
    deadline = watchdog(args.path, args.case_timeout)
    for name in [n for n, state in found.items() if state == "ok"]:
        passed, clean = run_function(getattr(module, name), name, env.world_size, env.rank, guard, args.path,
                                     deadline)
        if not passed and not (clean or env.world_size == 1):
            break       # a fresh launch for the remaining functions
    else:
        emit("done")
    # every verdict is printed: leave at once. An orderly interpreter shutdown with torch loaded takes
    # a second or two per launch, and a learner's unfinished isend could make it hang.
    exit_now(0)


if __name__ == "__main__":
    main()
