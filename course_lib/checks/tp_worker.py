"""Worker of ``course check tp``: run as ranks by ``course_lib.launch.launch`` (or as one process for rank_groups).

    python -m course_lib.checks.tp_worker PATH --mode groups|layers [--skip CASE,...] [--case-timeout S]

Prints, per case, ``@@start CASE``, one ``@@verdict {json}`` and ``@@end CASE``. CASE is ``piece@setting``.
Every comparison is against the serial computation in float64, within ``TOL``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import traceback
from pathlib import Path

from course_lib.checks import import_path

TOL = 1e-10


class Fail(Exception):
    """A check failed; the message says what is wrong in the learner's terms."""


class Missing(Exception):
    """The learner's file lacks a name the check needs."""


# ----------------------------------------------------------------------------- output protocol
def emit(tag, payload):
    print(f"@@{tag} {payload}", flush=True)


def load(path):
    return import_path(path, "learner_tp")


def explain(exc, path):
    """One line for an exception raised by the learner's code, pointing at their file when it can."""
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if Path(frame.filename).resolve() == Path(path).resolve():
            where = f" (tp.py line {frame.lineno}, in {frame.name})"
            break
    if isinstance(exc, NotImplementedError):
        return f"not written yet: NotImplementedError{where}"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}{where}"


def run_case(case, item, fn, path, rank, case_timeout, sync=None):
    """Run one check with a watchdog: a rank stuck in a collective exits so the checker can go on.

    ``sync`` (a group of the checker's own, so it never pairs with the learner's collectives): every rank
    waits there after the case, so no rank runs ahead into the next case while another is still in this one.
    """
    emit("start", case)
    timer = threading.Timer(case_timeout, lambda: (emit("stuck", case), os._exit(3)))
    timer.daemon = True
    timer.start()
    verdict = {"case": case, "item": item, "rank": rank, "ok": True, "message": ""}
    try:
        fn()
    except Fail as e:
        verdict.update(ok=False, message=str(e))
    except Missing as e:
        verdict.update(ok=False, missing=True, message=str(e))
    except Exception as e:   # the learner's code raised
        verdict.update(ok=False, message=explain(e, path))
    emit("verdict", json.dumps(verdict))
    if sync is not None:
        import torch.distributed as dist
        dist.barrier(group=sync)
    timer.cancel()
    emit("end", case)


def need(mod, name):
    if not hasattr(mod, name):
        raise Missing(f"tp.py has no `{name}` (keep the names of the starter file)")
    return getattr(mod, name)


# ----------------------------------------------------------------------------- rank_groups (one process)
def groups_mode(mod, path):
    from course_lib.checks.tp import reference_rank_groups, rank_group_cases
    emit("start", "rank_groups")
    cases = rank_group_cases()
    verdict = {"case": "rank_groups", "item": "rank_groups", "rank": 0, "ok": True,
               "message": f"{len(cases)} (world, tp, dp, cp, pp, order) combinations match Megatron's "
                          f"RankGenerator, including orders where dp varies fastest"}
    try:
        fn = need(mod, "rank_groups")
        results = [(case, check_one_grid(fn, *case, reference_rank_groups)) for case in cases]
        diagnose_grids(results, reference_rank_groups)
    except Fail as e:
        verdict.update(ok=False, message=str(e))
    except Missing as e:
        verdict.update(ok=False, missing=True, message=str(e))
    emit("verdict", json.dumps(verdict))
    emit("end", "rank_groups")


def _canon(groups):
    return sorted(sorted(int(r) for r in g) for g in groups)


def _call(world, tp, dp, cp, pp, order):
    return f"rank_groups({world}, tp={tp}, dp={dp}, cp={cp}, pp={pp}, order={order!r})"


def check_one_grid(fn, world, tp, dp, cp, pp, order, reference):
    """The learner's grid for one combination, after the checks of its form (each rank once per kind, sizes)."""
    call = _call(world, tp, dp, cp, pp, order)
    sizes = {"tp": tp, "dp": dp, "cp": cp, "pp": pp}
    try:
        got = fn(world, tp=tp, dp=dp, cp=cp, pp=pp, order=order)
    except NotImplementedError:
        raise Fail("not written yet: rank_groups raises NotImplementedError")
    except Exception as e:
        raise Fail(f"{call} raised {type(e).__name__}: {e}")
    if not isinstance(got, dict) or not set(sizes) <= set(got):
        raise Fail(f"{call} must return a dict with keys 'tp', 'dp', 'cp', 'pp' (lists of rank lists); got {got!r:.200}")
    for kind, size in sizes.items():
        try:
            groups = [[int(r) for r in g] for g in got[kind]]
        except TypeError:
            raise Fail(f"{call}[{kind!r}] must be a list of lists of ranks; got {got[kind]!r:.200}")
        seen = sorted(r for g in groups for r in g)
        if seen != list(range(world)):
            extra = sorted({r for r in seen if seen.count(r) > 1})
            lost = sorted(set(range(world)) - set(seen))
            raise Fail(f"{call}: the {kind} groups must hold every rank exactly once "
                       f"({f'ranks {extra} appear twice' if extra else ''}{'; ' if extra and lost else ''}"
                       f"{f'ranks {lost} are missing' if lost else ''}); got {groups}")
        if any(len(g) != size for g in groups):
            raise Fail(f"{call}: every {kind} group must have {kind}={size} ranks; got {groups}")
    return {kind: _canon(got[kind]) for kind in sizes}


def diagnose_grids(results, reference):
    """Compare every grid with the reference; name the mistake that explains ALL the differences, if one does."""
    def matches(got, args, order):
        want = reference(args[0], tp=args[1], dp=args[2], cp=args[3], pp=args[4], order=order)
        return all(got[k] == _canon(want[k]) for k in got)

    wrong = [(args, got) for args, got in results if not matches(got, args, args[5])]
    if not wrong:
        return
    args, got = wrong[0]
    want = reference(args[0], tp=args[1], dp=args[2], cp=args[3], pp=args[4], order=args[5])
    kind = next(k for k in got if got[k] != _canon(want[k]))
    example = f"{_call(*args)}: {kind} groups are {got[kind]}, expected {want[kind]}"
    reverse = lambda order: "-".join(reversed(order.split("-")))
    if all(matches(got, a, reverse(a[5])) for a, got in wrong):
        raise Fail(f"in your grid the LAST name of order varies fastest; in Megatron's RankGenerator the FIRST does "
                   f"(with 'tp-cp-pp-dp', tp neighbours are consecutive ranks). {example}")
    if all(matches(got, a, "tp-cp-pp-dp") for a, got in results):
        raise Fail(f"the order argument is ignored (every grid is the default 'tp-cp-pp-dp' one). {example}")
    raise Fail(f"{example} (a {kind} group = the ranks that differ only in their {kind} coordinate; the first "
               f"name of order varies fastest)")


# ----------------------------------------------------------------------------- tensors and comparisons
def rand(seed, *shape):
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def close(a, b):
    import torch
    return a is not None and b is not None and a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=TOL)


def diff(a, b):
    if a is None:
        return "it is None"
    if a.shape != b.shape:
        return f"its shape is {list(a.shape)}, expected {list(b.shape)}"
    return f"max |difference| = {(a - b).abs().max().item():.3g}"


def as_tensor(y, what):
    import torch
    if not isinstance(y, torch.Tensor):
        raise Fail(f"{what} must return a tensor; it returned {type(y).__name__}")
    return y


class Counter:
    """Counts the collectives the learner's code calls (torch.distributed is patched before it is loaded)."""

    def __init__(self):
        import torch.distributed as dist
        self.counts = {}
        for name in ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast"):
            orig = getattr(dist, name)

            def wrapped(*a, _orig=orig, _name=name, **k):
                self.counts[_name] = self.counts.get(_name, 0) + 1
                return _orig(*a, **k)
            setattr(dist, name, wrapped)

    def take(self):
        c, self.counts = self.counts, {}
        return c


# ----------------------------------------------------------------------------- the cases
class Ctx:
    """What a case needs: the module, its group (None: all ranks), tp, this rank's index, a seed offset."""

    def __init__(self, mod, group, counter):
        import torch.distributed as dist
        self.mod, self.group, self.counter = mod, group, counter
        self.tp, self.r = dist.get_world_size(group), dist.get_rank(group)
        self.rank = dist.get_rank()
        self.seed = 1000 * (self.rank // self.tp)   # different data in different groups: mixing shows
        self.kw = {} if group is None else {"group": group}


def case_f(c):
    fn = need(c.mod, "copy_to_parallel_region")
    x0 = rand(c.seed + 1, 4, 6)
    x = x0.clone().requires_grad_()
    y = as_tensor(fn(x, **c.kw), "copy_to_parallel_region")
    if not close(y.detach(), x0):
        if close(y.detach(), c.tp * x0):
            raise Fail("forward of copy_to_parallel_region must be the identity: it returned tp times the input "
                       "(it all-reduces in forward, which is g's job, not f's)")
        raise Fail(f"forward of copy_to_parallel_region must return its input unchanged; {diff(y.detach(), x0)}")
    if not y.requires_grad:
        raise Fail("the output of copy_to_parallel_region does not require grad: make it a torch.autograd.Function "
                   "(call it with .apply) and return the result of forward")
    grads = [rand(c.seed + 100 + i, 4, 6) for i in range(c.tp)]   # rank i's upstream gradient
    (y * grads[c.r]).sum().backward()
    want = sum(grads)
    got = x.grad
    if close(got, want):
        return
    if got is None:
        raise Fail("backward of copy_to_parallel_region: no gradient reached the input")
    if close(got, grads[c.r]):
        raise Fail("backward of copy_to_parallel_region must all-reduce: input grads are this rank's own part only "
                   "(in a column-parallel layer, 1/tp of serial on average); sum them over the group")
    if close(got, want / c.tp):
        raise Fail("backward of copy_to_parallel_region averages the gradients over the group; it must sum them "
                   "(all-reduce with ReduceOp.SUM, no division by tp)")
    raise Fail(f"backward of copy_to_parallel_region must return the sum of the ranks' gradients; {diff(got, want)}")


def case_g(c):
    fn = need(c.mod, "reduce_from_parallel_region")
    parts = [rand(c.seed + 10 + i, 4, 6) for i in range(c.tp)]   # rank i's partial result
    x = parts[c.r].clone().requires_grad_()
    y = as_tensor(fn(x.clone(), **c.kw), "reduce_from_parallel_region")
    want = sum(parts)
    if not close(y.detach(), want):
        if close(y.detach(), parts[c.r]):
            raise Fail("forward of reduce_from_parallel_region must all-reduce (sum over the group): it returned its "
                       "input unchanged (the identity is f's forward, not g's)")
        if close(y.detach(), want / c.tp):
            raise Fail("forward of reduce_from_parallel_region averages over the group; it must sum "
                       "(ReduceOp.SUM, no division by tp)")
        raise Fail(f"forward of reduce_from_parallel_region must return the sum over the group; {diff(y.detach(), want)}")
    if not y.requires_grad:
        raise Fail("the output of reduce_from_parallel_region does not require grad: make it a "
                   "torch.autograd.Function (call it with .apply)")
    grads = [rand(c.seed + 200 + i, 4, 6) for i in range(c.tp)]
    (y * grads[c.r]).sum().backward()
    got = x.grad
    if close(got, grads[c.r]):
        return
    if got is None:
        raise Fail("backward of reduce_from_parallel_region: no gradient reached the input")
    if close(got, sum(grads)):
        raise Fail("backward of reduce_from_parallel_region must be the identity: it all-reduces the gradient "
                   "(in a row-parallel layer that makes input and weight grads tp times serial)")
    if close(got, sum(grads) / c.tp):
        raise Fail("backward of reduce_from_parallel_region must be the identity: it averages the gradient over "
                   "the group, a communication the backward of a sum does not need")
    raise Fail(f"backward of reduce_from_parallel_region must pass the gradient through unchanged; {diff(got, grads[c.r])}")


def _param(layer, name, cls):
    import torch.nn as nn
    p = getattr(layer, name, None)
    if p is None:
        raise Fail(f"{cls}.{name} is None: create it as an nn.Parameter")
    if not isinstance(p, nn.Parameter):
        raise Fail(f"{cls}.{name} must be an nn.Parameter (else .parameters() and the optimizer miss it)")
    return p


def check_column_shapes(layer, n_in, n_out, tp, cls="ColumnParallelLinear"):
    w, b = _param(layer, "weight", cls), _param(layer, "bias", cls)
    o = n_out // tp
    shape = list(w.shape)
    if shape != [o, n_in]:
        if shape == [n_out, n_in // tp]:
            raise Fail(f"{cls}.weight is {shape}: weights split along the input dimension instead of the output "
                       f"dimension; a column-parallel layer keeps this rank's rows [out_features/tp, in_features] = {[o, n_in]}")
        if shape == [n_out, n_in]:
            raise Fail(f"{cls}.weight is the whole {shape} on every rank: keep only this rank's rows "
                       f"[out_features/tp, in_features] = {[o, n_in]}")
        if shape == [n_in, o]:
            raise Fail(f"{cls}.weight is {shape} = [in_features, out_features/tp]: store it as nn.Linear does, "
                       f"[out_features/tp, in_features] = {[o, n_in]}, and use F.linear")
        raise Fail(f"{cls}.weight is {shape}; expected this rank's rows [out_features/tp, in_features] = {[o, n_in]}")
    if list(b.shape) != [o]:
        if list(b.shape) == [n_out]:
            raise Fail(f"{cls}.bias is the whole [out_features] = {[n_out]}: a column-parallel layer keeps the part of "
                       f"its own output features, [out_features/tp] = {[o]}")
        raise Fail(f"{cls}.bias is {list(b.shape)}; expected [out_features/tp] = {[o]}")
    return w, b


def check_row_shapes(layer, n_in, n_out, tp, cls="RowParallelLinear"):
    w, b = _param(layer, "weight", cls), _param(layer, "bias", cls)
    i = n_in // tp
    shape = list(w.shape)
    if shape != [n_out, i]:
        if shape == [n_out // tp, n_in]:
            raise Fail(f"{cls}.weight is {shape}: weights split along the output dimension instead of the input "
                       f"dimension; a row-parallel layer keeps this rank's columns [out_features, in_features/tp] = {[n_out, i]}")
        if shape == [n_out, n_in]:
            raise Fail(f"{cls}.weight is the whole {shape} on every rank: keep only this rank's columns "
                       f"[out_features, in_features/tp] = {[n_out, i]}")
        if shape == [i, n_out]:
            raise Fail(f"{cls}.weight is {shape} = [in_features/tp, out_features]: store it as nn.Linear does, "
                       f"[out_features, in_features/tp] = {[n_out, i]}, and use F.linear")
        raise Fail(f"{cls}.weight is {shape}; expected this rank's columns [out_features, in_features/tp] = {[n_out, i]}")
    if list(b.shape) != [n_out]:
        if list(b.shape) == [n_out // tp]:
            raise Fail(f"{cls}.bias is split ({list(b.shape)}): a row-parallel layer keeps the whole bias "
                       f"[out_features] = {[n_out]} and adds it once, after the all-reduce")
        raise Fail(f"{cls}.bias is {list(b.shape)}; expected the whole [out_features] = {[n_out]}")
    return w, b


def serial_linear(seed, n_in, n_out):
    import torch
    import torch.nn as nn
    torch.manual_seed(seed)
    return nn.Linear(n_in, n_out).double()


def load_column(layer, serial, tp, r):
    import torch
    o = serial.out_features // tp
    with torch.no_grad():
        layer.weight.copy_(serial.weight[r * o:(r + 1) * o])
        layer.bias.copy_(serial.bias[r * o:(r + 1) * o])


def load_row(layer, serial, tp, r):
    import torch
    i = serial.in_features // tp
    with torch.no_grad():
        layer.weight.copy_(serial.weight[:, r * i:(r + 1) * i])
        layer.bias.copy_(serial.bias)


def compare_grads(cls, pairs):
    """pairs: (what, got, want, hint for tp x, hint for None)."""
    for what, got, want, tp_times, none_hint in pairs:
        if close(got, want):
            continue
        if got is None:
            raise Fail(f"{cls}: {what} is None: {none_hint}")
        if tp_times is not None and close(got, tp_times[0] * want):
            raise Fail(f"{cls}: {what} are tp times serial: {tp_times[1]}")
        raise Fail(f"{cls}: {what} differ from serial; {diff(got, want)}")


N_IN, N_OUT = 8, 12   # divisible by 2 and 4; different, so a transposed weight shows


def case_column(c, gather):
    cls = need(c.mod, "ColumnParallelLinear")
    name = "ColumnParallelLinear(gather_output=True)" if gather else "ColumnParallelLinear"
    layer = cls(N_IN, N_OUT, bias=True, gather_output=gather, **c.kw).double()
    w, b = check_column_shapes(layer, N_IN, N_OUT, c.tp)
    serial = serial_linear(c.seed + 3, N_IN, N_OUT)
    load_column(layer, serial, c.tp, c.r)
    o, sl = N_OUT // c.tp, slice(c.r * N_OUT // c.tp, (c.r + 1) * N_OUT // c.tp)
    x0 = rand(c.seed + 4, 5, N_IN)
    x, xs = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    y = as_tensor(layer(x), name)
    full = serial(xs)
    want = full if gather else full[:, sl]
    if not close(y.detach(), want.detach()):
        if gather and list(y.shape) == [5, o]:
            raise Fail("gather_output=True is ignored: the output is this rank's [..., out_features/tp]; "
                       "all-gather the ranks' outputs along the last dimension (gather_from_parallel_region)")
        if not gather and list(y.shape) == [5, N_OUT]:
            raise Fail("gather_output=False but the output is gathered ([..., out_features]); return this rank's "
                       "[..., out_features/tp] for the next row-parallel layer")
        if close(y.detach(), (want - (serial.bias if gather else serial.bias[sl])).detach()):
            raise Fail(f"{name}: the bias is not added")
        raise Fail(f"{name}: forward output differs from the serial layer's "
                   f"{'output' if gather else f'output columns {sl.start}..{sl.stop - 1}'}; {diff(y.detach(), want.detach())}")
    grad_full = rand(c.seed + 5, 5, N_OUT)
    (y * (grad_full if gather else grad_full[:, sl])).sum().backward()
    (full * grad_full).sum().backward()
    partial = grad_full[:, sl] @ serial.weight.detach()[sl]
    if x.grad is not None and not close(x.grad, xs.grad) and close(x.grad, partial):
        raise Fail(f"{name}: input grads are this rank's part only (1/tp of serial on average): the input must "
                   f"go through copy_to_parallel_region (f), whose backward all-reduces")
    none_hint = ("the output is not connected to the weights: the all-gather needs a backward "
                 "(use gather_from_parallel_region)" if gather else "is the output computed from .weight/.bias?")
    gather_hint = (c.tp, "the all-gather's backward must keep this rank's slice of the gradient, not sum the "
                         "slices over the ranks (torch.distributed.nn.functional.all_gather sums them; "
                         "use gather_from_parallel_region)") if gather else None
    compare_grads(name, [
        ("input grads", x.grad, xs.grad, gather_hint, "no gradient reached the input"),
        ("weight grads", w.grad, serial.weight.grad[sl], gather_hint, none_hint),
        ("bias grads", b.grad, serial.bias.grad[sl], gather_hint, none_hint),
    ])


def case_row(c, parallel_input):
    import torch
    cls = need(c.mod, "RowParallelLinear")
    name = "RowParallelLinear" if parallel_input else "RowParallelLinear(input_is_parallel=False)"
    n_in, n_out = N_OUT, N_IN   # 12 -> 8
    layer = cls(n_in, n_out, bias=True, input_is_parallel=parallel_input, **c.kw).double()
    w, b = check_row_shapes(layer, n_in, n_out, c.tp)
    serial = serial_linear(c.seed + 6, n_in, n_out)
    load_row(layer, serial, c.tp, c.r)
    sl = slice(c.r * n_in // c.tp, (c.r + 1) * n_in // c.tp)
    x0 = rand(c.seed + 7, 5, n_in)
    xs = x0.clone().requires_grad_()
    x = (x0[:, sl] if parallel_input else x0).clone().requires_grad_()
    try:
        y = as_tensor(layer(x), name)
    except RuntimeError as e:
        if not parallel_input and "shape" in str(e):
            raise Fail(f"{name}: {str(e).splitlines()[0]}; with input_is_parallel=False the input is whole: take "
                       f"this rank's slice first (scatter_to_parallel_region)")
        raise
    want = serial(xs)
    yd = y.detach()
    if not close(yd, want.detach()):
        partial = x0[:, sl] @ serial.weight.detach()[:, sl].T
        bias = serial.bias.detach()
        if close(yd, want.detach() + (c.tp - 1) * bias):
            raise Fail(f"{name}: bias added tp times: it is added on every rank before the all-reduce; add it once, "
                       f"after reduce_from_parallel_region (g)")
        if close(yd, partial + bias) or close(yd, partial):
            raise Fail(f"{name}: missing reduction: the output is this rank's partial sum; pass X_r B_r through "
                       f"reduce_from_parallel_region (g), then add the bias")
        if close(yd, want.detach() - bias):
            raise Fail(f"{name}: the bias is not added (add it once, after the all-reduce)")
        raise Fail(f"{name}: forward output differs from the serial layer's; {diff(yd, want.detach())}")
    grad_out = rand(c.seed + 8, 5, n_out)
    (y * grad_out).sum().backward()
    (want * grad_out).sum().backward()
    want_x = xs.grad[:, sl] if parallel_input else xs.grad
    if not parallel_input and x.grad is not None and not close(x.grad, want_x):
        own = torch.zeros_like(want_x)
        own[:, sl] = want_x[:, sl]
        if close(x.grad, own):
            raise Fail(f"{name}: the input grad holds only this rank's slice; with input_is_parallel=False it must be "
                       f"whole on every rank: use scatter_to_parallel_region (its backward all-gathers), not indexing")
    g_hint = (c.tp, "the backward of reduce_from_parallel_region (g) must be the identity (it all-reduces)")
    compare_grads(name, [
        ("input grads", x.grad, want_x, g_hint, "no gradient reached the input"),
        ("weight grads", w.grad, serial.weight.grad[:, sl], g_hint, "is the output computed from .weight?"),
        ("bias grads", b.grad, serial.bias.grad, None,
         "this rank's bias gets no gradient: add the bias on every rank, after the reduction (adding it on one "
         "rank only leaves the replicas' gradients different)"),
    ])


def case_mlp(c):
    import torch.nn.functional as F
    cls = need(c.mod, "ParallelMLP")
    h, ffn = N_IN, 16
    mlp = cls(h, ffn, **c.kw).double()
    if getattr(mlp, "fc1", None) is None or getattr(mlp, "fc2", None) is None:
        raise Fail("ParallelMLP must keep its layers as .fc1 (a ColumnParallelLinear) and .fc2 (a RowParallelLinear)")
    w1, b1 = check_column_shapes(mlp.fc1, h, ffn, c.tp, "ParallelMLP.fc1")
    w2, b2 = check_row_shapes(mlp.fc2, ffn, h, c.tp, "ParallelMLP.fc2")
    fc1, fc2 = serial_linear(c.seed + 11, h, ffn), serial_linear(c.seed + 12, ffn, h)
    load_column(mlp.fc1, fc1, c.tp, c.r)
    load_row(mlp.fc2, fc2, c.tp, c.r)
    x0 = rand(c.seed + 13, 3, 5, h)   # [batch, sequence, hidden]
    x, xs = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    c.counter.take()
    y = as_tensor(mlp(x), "ParallelMLP")
    fwd = c.counter.take()
    want = fc2(F.gelu(fc1(xs)))
    if not close(y.detach(), want.detach()):
        if close(y.detach(), fc2(F.relu(fc1(xs))).detach()):
            raise Fail("ParallelMLP uses ReLU; the course's MLP (and its serial twin) uses GELU: F.gelu")
        raise Fail(f"ParallelMLP: forward output differs from serial fc2(gelu(fc1(x))); {diff(y.detach(), want.detach())}")
    grad_out = rand(c.seed + 14, 3, 5, h)
    (y * grad_out).sum().backward()
    bwd = c.counter.take()
    (want * grad_out).sum().backward()
    s1 = slice(c.r * ffn // c.tp, (c.r + 1) * ffn // c.tp)
    compare_grads("ParallelMLP", [
        ("input grads", x.grad, xs.grad, None, "no gradient reached the input"),
        ("fc1 weight grads", w1.grad, fc1.weight.grad[s1], None, "is fc1 used?"),
        ("fc1 bias grads", b1.grad, fc1.bias.grad[s1], None, "is fc1's bias used?"),
        ("fc2 weight grads", w2.grad, fc2.weight.grad[:, s1], None, "is fc2 used?"),
        ("fc2 bias grads", b2.grad, fc2.bias.grad, None, "is fc2's bias used?"),
    ])
    extra_f = {k: v for k, v in fwd.items() if v and not (k == "all_reduce" and v <= 1)}
    if extra_f:
        raise Fail(f"ParallelMLP is right but communicates more than it needs in forward: {_calls(fwd)}; column then "
                   f"row needs ONE all-reduce (g after fc2): keep fc1's output split (gather_output=False, "
                   f"input_is_parallel=True)")
    extra_b = {k: v for k, v in bwd.items() if v and not (k == "all_reduce" and v <= 1)}
    if extra_b:
        raise Fail(f"ParallelMLP is right but communicates more than it needs in backward: {_calls(bwd)}; "
                   f"column then row needs ONE all-reduce (f before fc1)")


def _calls(counts):
    return ", ".join(f"{v} x {k}" for k, v in counts.items() if v) or "none"


def case_attention(c):
    import torch.nn.functional as F
    cls = need(c.mod, "ParallelSelfAttention")
    h, heads, b, t = N_IN, 4, 2, 5
    attn = cls(h, heads, **c.kw).double()
    for nm in ("q", "k", "v", "proj"):
        if not hasattr(attn, nm):
            raise Fail("ParallelSelfAttention must keep its layers as .q, .k, .v (column-parallel) and .proj (row-parallel)")
    serial = {nm: serial_linear(c.seed + 20 + i, h, h) for i, nm in enumerate(("q", "k", "v", "proj"))}
    for nm in ("q", "k", "v"):
        check_column_shapes(getattr(attn, nm), h, h, c.tp, f"ParallelSelfAttention.{nm}")
        load_column(getattr(attn, nm), serial[nm], c.tp, c.r)
    check_row_shapes(attn.proj, h, h, c.tp, "ParallelSelfAttention.proj")
    load_row(attn.proj, serial["proj"], c.tp, c.r)
    x0 = rand(c.seed + 25, b, t, h)
    x, xs = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    y = as_tensor(attn(x), "ParallelSelfAttention")

    def split(z):
        return z.view(b, t, heads, h // heads).transpose(1, 2)
    o = F.scaled_dot_product_attention(split(serial["q"](xs)), split(serial["k"](xs)), split(serial["v"](xs)))
    want = serial["proj"](o.transpose(1, 2).reshape(b, t, h))
    if not close(y.detach(), want.detach()):
        raise Fail(f"ParallelSelfAttention: forward output differs from serial multi-head attention with "
                   f"{heads} heads (rank r computes heads r*{heads}/tp .. (r+1)*{heads}/tp - 1); {diff(y.detach(), want.detach())}")
    grad_out = rand(c.seed + 26, b, t, h)
    (y * grad_out).sum().backward()
    (want * grad_out).sum().backward()
    sl = slice(c.r * h // c.tp, (c.r + 1) * h // c.tp)
    pairs = [("input grads", x.grad, xs.grad, None, "no gradient reached the input")]
    for nm in ("q", "k", "v"):
        pairs.append((f"{nm} weight grads", getattr(attn, nm).weight.grad, serial[nm].weight.grad[sl], None, "unused?"))
    pairs.append(("proj weight grads", attn.proj.weight.grad, serial["proj"].weight.grad[:, sl], None, "unused?"))
    pairs.append(("proj bias grads", attn.proj.bias.grad, serial["proj"].bias.grad, None, "unused?"))
    compare_grads("ParallelSelfAttention", pairs)


def case_init_groups(c):
    import torch
    import torch.distributed as dist
    from course_lib.checks.tp import reference_rank_groups
    fn = need(c.mod, "init_rank_groups")
    world, rank = dist.get_world_size(), dist.get_rank()
    for sizes, order in (({"tp": 2, "dp": world // 2}, "tp-cp-pp-dp"), ({"tp": 2, "dp": world // 2}, "dp-tp-cp-pp")):
        call = f"init_rank_groups(tp={sizes['tp']}, dp={sizes['dp']}, order={order!r})"
        groups = fn(order=order, **sizes)
        if not isinstance(groups, dict) or not {"tp", "dp"} <= set(groups):
            raise Fail(f"{call} must return a dict with this rank's groups under 'tp', 'dp', 'cp', 'pp'; got {groups!r:.200}")
        grid = reference_rank_groups(world, order=order, **sizes)
        for kind in ("tp", "dp", "cp", "pp"):
            if kind not in groups:
                raise Fail(f"{call}: no {kind!r} group for rank {rank} (cp=pp=1 still has groups: one rank each)")
            want = next(g for g in grid[kind] if rank in g)
            try:
                got = sorted(dist.get_process_group_ranks(groups[kind]))
            except Exception as e:
                raise Fail(f"{call}[{kind!r}] is not a process group of dist.new_group ({type(e).__name__}: {e})")
            if got != want:
                raise Fail(f"{call}: rank {rank}'s {kind} group holds ranks {got}, expected {want}")
            t = torch.tensor([float(rank)])
            dist.all_reduce(t, group=groups[kind])
            if t.item() != sum(want):
                raise Fail(f"{call}: an all-reduce in rank {rank}'s {kind} group summed {t.item():g}, expected "
                           f"{sum(want)} (the groups were not created the same way on every rank)")


# ----------------------------------------------------------------------------- layers mode (N ranks)
def layers_mode(mod_path, skip, case_timeout):
    import torch
    import torch.distributed as dist
    rank = int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", 0)))
    world = int(os.environ.get("SLURM_NTASKS", os.environ.get("WORLD_SIZE", 1)))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_default_dtype(torch.float64)
    sync = dist.new_group(backend="gloo")   # the checker's own group, for the barrier between cases
    counter = Counter()   # before the learner's module binds any name of torch.distributed
    try:
        mod = load(mod_path)
    except BaseException as e:
        emit("verdict", json.dumps({"case": "import", "item": None, "rank": rank, "ok": False,
                                    "message": f"tp.py does not load: {explain(e, mod_path)}"}))
        return
    settings = [("tp2", None)] if world == 2 else [("tp4", None)]
    if world == 4:
        subgroups = [dist.new_group([0, 1]), dist.new_group([2, 3])]   # every rank creates both, same order
        settings.append(("tp2of4", subgroups[rank // 2]))
    cases = [("copy_to_parallel_region", "f", case_f), ("reduce_from_parallel_region", "g", case_g),
             ("ColumnParallelLinear", "col", lambda c: case_column(c, False)),
             ("ColumnParallelLinear", "colgather", lambda c: case_column(c, True)),
             ("RowParallelLinear", "row", lambda c: case_row(c, True)),
             ("RowParallelLinear", "rowscatter", lambda c: case_row(c, False)),
             ("ParallelMLP", "mlp", case_mlp), ("ParallelSelfAttention", "attn", case_attention)]
    for setting, group in settings:
        ctx = Ctx(mod, group, counter)
        for item, short, fn in cases:
            case = f"{item}@{setting}@{short}"
            if case not in skip:
                run_case(case, item, lambda: fn(ctx), mod_path, rank, case_timeout, sync)
    if world == 4:   # last: a wrong init_rank_groups may leave the default group's store in a bad state
        case = "init_rank_groups@grid4@groups"
        if case not in skip:
            run_case(case, "init_rank_groups", lambda: case_init_groups(Ctx(mod, None, counter)), mod_path, rank,
                     case_timeout, sync)
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
        try:
            mod = load(a.path)
        except BaseException as e:
            emit("verdict", json.dumps({"case": "import", "item": None, "rank": 0, "ok": False,
                                        "message": f"tp.py does not load: {explain(e, a.path)}"}))
            return 0
        groups_mode(mod, a.path)
    else:
        layers_mode(a.path, set(filter(None, a.skip.split(","))), a.case_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
