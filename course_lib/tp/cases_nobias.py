"""Cases for ``bias=False``, which the other cases never pass (they build every layer with a bias): the layer then
has none (``.bias`` is None, as in nn.Linear), its forward runs without one and equals the serial layer without a
bias; ParallelMLP passes the argument on to fc1 and fc2. Small and on tp=2 only: the bias is no communication."""
from course_lib.checking.case import Fail
from course_lib.checking.learner import error_where
from course_lib.tp.cases_linear import N_IN, N_OUT
from course_lib.tp.numerics import as_tensor, judge, rand
from course_lib.tp.shards import serial_linear

NONE = "with bias=False there is none, as in nn.Linear: set self.bias = None and add nothing in forward"


def _no_bias(layer, name: str, attr: str = "bias", fix: str = NONE):
    b = getattr(layer, "bias", None)
    if b is not None:
        raise Fail(f"{name}(bias=False): .{attr} is {list(getattr(b, 'shape', [b]))}; {fix}")


def _run(c, module, x, name: str):
    """``module(x)``; the learner's error named with the likely cause: a bias added that is not there."""
    try:
        return as_tensor(module(x), name)
    except Fail:
        raise
    except Exception as e:   # the learner's bug: with its line
        where = error_where(e, c.path)
        raise Fail(f"{name}(bias=False): forward raised {type(e).__name__}: {str(e).strip()}"
                   + (f" (at {where})" if where else "") + "; with bias=False self.bias is None: add the bias only "
                   "when there is one (`if self.bias is not None:`)") from None


def _load(layer, name: str, weight, want_shape):
    import torch
    if list(getattr(layer, "weight", weight).shape) != list(want_shape):
        raise Fail(f"{name}(bias=False): .weight is {list(layer.weight.shape)}, expected {list(want_shape)} (the "
                   "same shard as with a bias)")
    with torch.no_grad():
        layer.weight.copy_(weight)


def case_column_no_bias(c):
    import torch.nn.functional as F
    name = "ColumnParallelLinear"
    layer = c.need(name)(N_IN, N_OUT, bias=False, **c.kw).double()
    _no_bias(layer, name)
    sl = slice(c.r * N_OUT // c.tp, (c.r + 1) * N_OUT // c.tp)
    w = serial_linear(c.seed + 31, N_IN, N_OUT).weight.detach()[sl]
    _load(layer, name, w, w.shape)
    x = rand(c.seed + 32, 5, N_IN)
    judge(_run(c, layer, x, name).detach(), F.linear(x, w), f"{name}(bias=False): forward differs from x W_r^T")


def case_row_no_bias(c):
    import torch.nn.functional as F
    name = "RowParallelLinear"
    layer = c.need(name)(N_OUT, N_IN, bias=False, **c.kw).double()
    _no_bias(layer, name)
    w = serial_linear(c.seed + 33, N_OUT, N_IN).weight.detach()
    sl = slice(c.r * N_OUT // c.tp, (c.r + 1) * N_OUT // c.tp)
    _load(layer, name, w[:, sl], w[:, sl].shape)
    x = rand(c.seed + 34, 5, N_OUT)
    judge(_run(c, layer, x[:, sl], name).detach(), F.linear(x, w),
          f"{name}(bias=False): forward differs from the serial layer without a bias")


def case_mlp_no_bias(c):
    import torch.nn.functional as F
    name, h, ffn = "ParallelMLP", N_IN, 16
    mlp = c.need(name)(h, ffn, bias=False, **c.kw).double()
    pass_on = ("ParallelMLP(..., bias=False) must pass bias on to both layers: ColumnParallelLinear(..., bias=bias) "
               "and RowParallelLinear(..., bias=bias)")
    for attr in ("fc1", "fc2"):
        _no_bias(getattr(mlp, attr, None), name, f"{attr}.bias", pass_on)
    sl = slice(c.r * ffn // c.tp, (c.r + 1) * ffn // c.tp)
    w1 = serial_linear(c.seed + 35, h, ffn).weight.detach()
    w2 = serial_linear(c.seed + 36, ffn, h).weight.detach()
    _load(mlp.fc1, f"{name}.fc1", w1[sl], w1[sl].shape)
    _load(mlp.fc2, f"{name}.fc2", w2[:, sl], w2[:, sl].shape)
    x = rand(c.seed + 37, 3, 5, h)
    judge(_run(c, mlp, x, name).detach(), F.linear(F.gelu(F.linear(x, w1)), w2),
          f"{name}(bias=False): forward differs from serial fc2(gelu(fc1(x))) without biases")
