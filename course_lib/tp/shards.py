"""The layout of DESIGN.md: check the shapes of a learner's shards, copy serial weights into them.

Column-parallel: this rank's rows ``[out/tp, in]`` and bias ``[out/tp]``; row-parallel: this rank's
columns ``[out, in/tp]`` and the whole bias ``[out]``.
"""
from __future__ import annotations

from course_lib.checking.case import Fail


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
    rows = f"[out_features/tp, in_features] = {[o, n_in]}"
    if shape != [o, n_in]:
        if shape == [n_out, n_in // tp]:
            raise Fail(f"{cls}.weight is {shape}: weights split along the input dimension instead of the output "
                       f"dimension; a column-parallel layer keeps this rank's rows {rows}")
        if shape == [n_out, n_in]:
            raise Fail(f"{cls}.weight is the whole {shape} on every rank: keep only this rank's rows {rows}")
        if shape == [n_in, o]:
            raise Fail(f"{cls}.weight is {shape} = [in_features, out_features/tp]: store it as nn.Linear does, "
                       f"{rows}, and use F.linear")
        raise Fail(f"{cls}.weight is {shape}; expected this rank's rows {rows}")
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
    columns = f"[out_features, in_features/tp] = {[n_out, i]}"
    if shape != [n_out, i]:
        if shape == [n_out // tp, n_in]:
            raise Fail(f"{cls}.weight is {shape}: weights split along the output dimension instead of the input "
                       f"dimension; a row-parallel layer keeps this rank's columns {columns}")
        if shape == [n_out, n_in]:
            raise Fail(f"{cls}.weight is the whole {shape} on every rank: keep only this rank's columns {columns}")
        if shape == [i, n_out]:
            raise Fail(f"{cls}.weight is {shape} = [in_features/tp, out_features]: store it as nn.Linear does, "
                       f"{columns}, and use F.linear")
        raise Fail(f"{cls}.weight is {shape}; expected this rank's columns {columns}")
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
