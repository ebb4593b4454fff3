"""Weights stored [in, out] as in the paper's Y = X A (torch.matmul), and a numpy grid with the last name fastest.

Two mistakes a reader of the Megatron paper makes: its A is [in, out], but the course (like nn.Linear)
keeps [out, in]; and numpy's reshape is row-major, so the LAST axis varies fastest.
f and g are right (Megatron's own style: in-place all-reduce, input returned as is).
"""
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input_, group):
        ctx.group = group
        return input_

    @staticmethod
    def backward(ctx, grad_output):
        dist.all_reduce(grad_output, group=ctx.group)
        return grad_output, None


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input_, group):
        dist.all_reduce(input_, group=group)
        return input_

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None


def copy_to_parallel_region(x, group=None):
    return _Copy.apply(x, group)


def reduce_from_parallel_region(x, group=None):
    return _Reduce.apply(x, group)


class ColumnParallelLinear(nn.Module):
    def __init__(self, in_features, out_features, bias=True, gather_output=False, group=None):
        super().__init__()
        tp = dist.get_world_size(group)
        self.weight = nn.Parameter(torch.randn(in_features, out_features // tp) * 0.1)   # A_r: [in, out/tp]
        self.bias = nn.Parameter(torch.zeros(out_features // tp)) if bias else None
        self.group = group

    def forward(self, x):
        y = torch.matmul(copy_to_parallel_region(x, self.group), self.weight)
        return y + self.bias if self.bias is not None else y


class RowParallelLinear(nn.Module):
    def __init__(self, in_features, out_features, bias=True, input_is_parallel=True, group=None):
        super().__init__()
        tp = dist.get_world_size(group)
        self.weight = nn.Parameter(torch.randn(in_features // tp, out_features) * 0.1)   # B_r: [in/tp, out]
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.group = group

    def forward(self, x):
        y = reduce_from_parallel_region(torch.matmul(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y


def rank_groups(world_size, tp=1, dp=1, cp=1, pp=1, order="tp-cp-pp-dp"):
    sizes = {"tp": tp, "dp": dp, "cp": cp, "pp": pp}
    names = order.split("-") + [n for n in sizes if n not in order.split("-")]
    grid = np.arange(world_size).reshape([sizes[n] for n in names])   # row-major: last axis fastest
    out = {}
    for kind in sizes:
        moved = np.moveaxis(grid, names.index(kind), -1).reshape(-1, sizes[kind])
        out[kind] = moved.tolist()
    return out
