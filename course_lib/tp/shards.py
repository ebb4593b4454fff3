"""The exercise's shard layout (Megatron's): check the shapes of a learner's shards, copy serial weights into them.

Column-parallel: this rank's rows ``[out/tp, in]`` and bias ``[out/tp]``; row-parallel: this rank's
columns ``[out, in/tp]`` and the whole bias ``[out]``.
"""
from course_lib.checking.case import Fail


def _param(layer, name, cls):
    import torch.nn as nn
    p = getattr(layer, name, None)
    if p is None:
        raise Fail(f"{cls}.{name} is None: create it as an nn.Parameter")
    if not isinstance(p, nn.Parameter):
        raise Fail(f"{cls}.{name} must be an nn.Parameter (else .parameters() and the optimizer miss it)")
    return p


# kind -> (the part a rank keeps, its layout, the dimension it is split along, the layout transposed)
SPLITS = {"column": ("rows", "[out_features/tp, in_features]", "output", "[in_features, out_features/tp]"),
          "row": ("columns", "[out_features, in_features/tp]", "input", "[in_features/tp, out_features]")}


def _weight_shape(w, cls, kind, want, split_wrong, whole):
    """Fail naming the mistake the weight's shape shows, unless it is ``want``."""
    part, layout, dim, transposed = SPLITS[kind]
    if list(w.shape) == want:
        return
    shape, keeps = list(w.shape), f"this rank's {part} {layout} = {want}"
    if shape == split_wrong:
        other = "input" if dim == "output" else "output"
        raise Fail(f"{cls}.weight is {shape}: weights split along the {other} dimension instead of the {dim} "
                   f"dimension; a {kind}-parallel layer keeps {keeps}")
    if shape == whole:
        raise Fail(f"{cls}.weight is the whole {shape} on every rank: keep only {keeps}")
    if shape == want[::-1]:
        raise Fail(f"{cls}.weight is {shape} = {transposed}: store it as nn.Linear does, {layout} = {want}, "
                   "and use F.linear")
    raise Fail(f"{cls}.weight is {shape}; expected {keeps}")


def check_column_shapes(layer, n_in, n_out, tp, cls="ColumnParallelLinear"):
    o = n_out // tp
    w, b = _param(layer, "weight", cls), _param(layer, "bias", cls)
    _weight_shape(w, cls, "column", [o, n_in], [n_out, n_in // tp], [n_out, n_in])
    if list(b.shape) != [o]:
        if list(b.shape) == [n_out]:
            raise Fail(f"{cls}.bias is the whole [out_features] = {[n_out]}: a column-parallel layer keeps the part of "
                       f"its own output features, [out_features/tp] = {[o]}")
        raise Fail(f"{cls}.bias is {list(b.shape)}; expected [out_features/tp] = {[o]}")
    return w, b


def check_row_shapes(layer, n_in, n_out, tp, cls="RowParallelLinear"):
    i = n_in // tp
    w, b = _param(layer, "weight", cls), _param(layer, "bias", cls)
    _weight_shape(w, cls, "row", [n_out, i], [n_out // tp, n_in], [n_out, n_in])
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
