"""Cases for Megatron's two operators, f (copy_to_parallel_region) and g (reduce_from_parallel_region), and the two
layers: ColumnParallelLinear (and gather_output=True), RowParallelLinear (and input_is_parallel=False), each against
the serial ``nn.Linear`` whose shard it is given."""
from course_lib.checking.case import Fail
from course_lib.checking.collectives import Collectives, ring
from course_lib.tp.meter import check_held, check_sent
from course_lib.tp.numerics import as_tensor, close, compare_grads, judge, rand
from course_lib.tp.shards import check_column_shapes, check_row_shapes, load_column, load_row, serial_linear

N_IN, N_OUT = 8, 12   # divisible by 2 and 4; different, so a transposed weight shows
F_IDENTITY = ("f's forward is the identity: every rank of the group already holds the same input, so it needs no "
              "communication (no all-reduce, average or broadcast)")
ONE_F = "its backward needs ONE all-reduce of the input gradient (f's)"
# a row-parallel bias whose gradient is 1/tp of serial: the forward's sum hid it
BIAS_SHARE = ("the bias reaches the output as 1/tp of it on each rank (divided by tp, added before the all-reduce): "
              "add the whole bias once, after reduce_from_parallel_region (g)")


def case_f(c):
    fn = c.need("copy_to_parallel_region")
    x0 = rand(c.seed + 1, 4, 6)
    x = x0.clone().requires_grad_()
    with Collectives() as fwd:
        y = as_tensor(fn(x, **c.kw), "copy_to_parallel_region")
    judge(y.detach(), x0, "forward of copy_to_parallel_region must return its input unchanged", [
        (c.tp * x0, "forward of copy_to_parallel_region must be the identity: it returned tp times the input "
                    "(it all-reduces in forward, which is g's job, not f's)")])
    if not y.requires_grad:
        raise Fail("the output of copy_to_parallel_region does not require grad: make it a torch.autograd.Function "
                   "(call it with .apply) and return the result of forward")
    grads = [rand(c.seed + 100 + i, 4, 6) for i in range(c.tp)]   # rank i's upstream gradient
    with Collectives() as bwd:
        (y * grads[c.r]).sum().backward()
    want = sum(grads)
    judge(x.grad, want, "backward of copy_to_parallel_region must return the sum of the ranks' gradients", [
        (grads[c.r], "backward of copy_to_parallel_region must all-reduce: input grads are this rank's own part only "
                     "(in a column-parallel layer, 1/tp of serial on average); sum them over the group"),
        (want / c.tp, "backward of copy_to_parallel_region averages the gradients over the group; it must sum them "
                      "(all-reduce with ReduceOp.SUM, no division by tp)")],
        "backward of copy_to_parallel_region: no gradient reached the input")
    check_sent("copy_to_parallel_region", "forward", fwd.calls, 0, c.tp, F_IDENTITY)
    check_sent("copy_to_parallel_region", "backward", bwd.calls, ring("all_reduce", x0.numel(), c.tp), c.tp,
               "f's backward is ONE all-reduce of the gradient")


def case_g(c):
    fn = c.need("reduce_from_parallel_region")
    parts = [rand(c.seed + 10 + i, 4, 6) for i in range(c.tp)]   # rank i's partial result
    x = parts[c.r].clone().requires_grad_()
    with Collectives() as fwd:
        y = as_tensor(fn(x.clone(), **c.kw), "reduce_from_parallel_region")
    want = sum(parts)
    judge(y.detach(), want, "forward of reduce_from_parallel_region must return the sum over the group", [
        (parts[c.r], "forward of reduce_from_parallel_region must all-reduce (sum over the group): it returned its "
                     "input unchanged (the identity is f's forward, not g's)"),
        (want / c.tp, "forward of reduce_from_parallel_region averages over the group; it must sum "
                      "(ReduceOp.SUM, no division by tp)")])
    if not y.requires_grad:
        raise Fail("the output of reduce_from_parallel_region does not require grad: make it a "
                   "torch.autograd.Function (call it with .apply)")
    grads = [rand(c.seed + 200 + i, 4, 6) for i in range(c.tp)]
    with Collectives() as bwd:
        (y * grads[c.r]).sum().backward()
    judge(x.grad, grads[c.r], "backward of reduce_from_parallel_region must pass the gradient through unchanged", [
        (sum(grads), "backward of reduce_from_parallel_region must be the identity: it all-reduces the gradient "
                     "(in a row-parallel layer that makes input and weight grads tp times serial)"),
        (sum(grads) / c.tp, "backward of reduce_from_parallel_region must be the identity: it averages the gradient "
                            "over the group, a communication the backward of a sum does not need")],
        "backward of reduce_from_parallel_region: no gradient reached the input")
    check_sent("reduce_from_parallel_region", "forward", fwd.calls, ring("all_reduce", x.numel(), c.tp), c.tp,
               "g's forward is ONE all-reduce of its input (an all-gather then a sum sends tp/2 times as much)")
    check_sent("reduce_from_parallel_region", "backward", bwd.calls, 0, c.tp,
               "g's backward is the identity: no communication")


def case_column(c, gather):
    cls = c.need("ColumnParallelLinear")
    name = "ColumnParallelLinear(gather_output=True)" if gather else "ColumnParallelLinear"
    layer = cls(N_IN, N_OUT, bias=True, gather_output=gather, **c.kw).double()
    w, b = check_column_shapes(layer, N_IN, N_OUT, c.tp)
    serial = serial_linear(c.seed + 3, N_IN, N_OUT)
    load_column(layer, serial, c.tp, c.r)
    o, sl = N_OUT // c.tp, slice(c.r * N_OUT // c.tp, (c.r + 1) * N_OUT // c.tp)
    x0 = rand(c.seed + 4, 5, N_IN)
    x, xs = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    with Collectives() as fwd:
        y = as_tensor(layer(x), name)
    full = serial(xs)
    want = (full if gather else full[:, sl]).detach()
    if gather and list(y.shape) == [5, o]:
        raise Fail("gather_output=True is ignored: the output is this rank's [..., out_features/tp]; "
                   "all-gather the ranks' outputs along the last dimension (gather_from_parallel_region)")
    if not gather and list(y.shape) == [5, N_OUT]:
        raise Fail("gather_output=False but the output is gathered ([..., out_features]); return this rank's "
                   "[..., out_features/tp] for the next row-parallel layer")
    part = 'output' if gather else f'output columns {sl.start}..{sl.stop - 1}'
    judge(y.detach(), want, f"{name}: forward output differs from the serial layer's {part}",
          [(want - (serial.bias if gather else serial.bias[sl]).detach(), f"{name}: the bias is not added")])
    grad_full = rand(c.seed + 5, 5, N_OUT)
    with Collectives() as bwd:
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
    check_sent(name, "forward", fwd.calls, ring("all_gather", want.numel(), c.tp) if gather else 0, c.tp,
               "gather_output=True needs one all-gather of the ranks' output slices (gather_from_parallel_region), "
               "not an all-reduce of a zero-padded whole output nor a gather of the weights" if gather else
               "with gather_output=False the forward needs no communication (f's forward is the identity)")
    check_sent(name, "backward", bwd.calls, ring("all_reduce", x0.numel(), c.tp), c.tp, ONE_F + (
        "; the all-gather's backward only keeps this rank's slice of the gradient" if gather else ""))
    check_held(name, layer, {"weight": [o, N_IN], "bias": [o]})


def _row_input_grad_slice_only(name, got, want_x, sl):
    """With a whole input, a grad that holds only this rank's slice means the slice was taken by indexing."""
    import torch
    own = torch.zeros_like(want_x)
    own[:, sl] = want_x[:, sl]
    if close(got, own):
        raise Fail(f"{name}: the input grad holds only this rank's slice; with input_is_parallel=False it must be "
                   f"whole on every rank: use scatter_to_parallel_region (its backward all-gathers), not indexing")


def case_row(c, parallel_input):
    cls = c.need("RowParallelLinear")
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
        with Collectives() as fwd:
            y = as_tensor(layer(x), name)
    except RuntimeError as e:   # a shape error with a whole input is explained
        if not parallel_input and "shape" in str(e):
            raise Fail(f"{name}: {str(e).splitlines()[0]}; with input_is_parallel=False the input is whole: take "
                       f"this rank's slice first (scatter_to_parallel_region)") from e
        raise
    want = serial(xs)
    partial, bias = x0[:, sl] @ serial.weight.detach()[:, sl].T, serial.bias.detach()
    unreduced = (f"{name}: missing reduction: the output is this rank's partial sum; pass X_r B_r through "
                 f"reduce_from_parallel_region (g), then add the bias")
    judge(y.detach(), want.detach(), f"{name}: forward output differs from the serial layer's", [
        (want.detach() + (c.tp - 1) * bias, f"{name}: bias added tp times: it is added on every rank before the "
                                            f"all-reduce; add it once, after reduce_from_parallel_region (g)"),
        (partial + bias, unreduced), (partial, unreduced),
        (want.detach() - bias, f"{name}: the bias is not added (add it once, after the all-reduce)")])
    grad_out = rand(c.seed + 8, 5, n_out)
    with Collectives() as bwd:
        (y * grad_out).sum().backward()
    (want * grad_out).sum().backward()
    want_x = xs.grad[:, sl] if parallel_input else xs.grad
    if not parallel_input and x.grad is not None and not close(x.grad, want_x):
        _row_input_grad_slice_only(name, x.grad, want_x, sl)
    g_hint = (c.tp, "the backward of reduce_from_parallel_region (g) must be the identity (it all-reduces)")
    compare_grads(name, [
        ("input grads", x.grad, want_x, g_hint, "no gradient reached the input"),
        ("weight grads", w.grad, serial.weight.grad[:, sl], g_hint, "is the output computed from .weight?"),
        ("bias grads", b.grad, serial.bias.grad, (1 / c.tp, BIAS_SHARE),
         "this rank's bias gets no gradient: add the bias on every rank, after the reduction (adding it on one "
         "rank only leaves the replicas' gradients different)"),
    ])
    check_sent(name, "forward", fwd.calls, ring("all_reduce", want.numel(), c.tp), c.tp,
               "its forward needs ONE all-reduce of the partial output X_r B_r (g); the bias is already the same on "
               "every rank, so it needs no broadcast")
    check_sent(name, "backward", bwd.calls, 0 if parallel_input else ring("all_gather", x0.numel(), c.tp), c.tp,
               "g's backward is the identity and the bias's gradient is already the same on every rank: no "
               "communication" if parallel_input else
               "with input_is_parallel=False its backward needs one all-gather of the input-gradient slices "
               "(scatter_to_parallel_region's backward), not an all-reduce of a zero-padded whole input")
    check_held(name, layer, {"weight": [n_out, n_in // c.tp], "bias": [n_out]})
