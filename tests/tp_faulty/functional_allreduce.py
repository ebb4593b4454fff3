"""g built on torch.distributed.nn.functional.all_reduce, whose backward all-reduces the gradient too.

A real trap: the autograd-aware all_reduce is the right forward for g but its backward is another
all-reduce, so row-parallel input and weight grads come out tp times serial.
The layers are written in a functional style: parameters sliced from a full weight built on every rank.
"""
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnf
import torch.nn as nn
import torch.nn.functional as F


class _F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


def copy_to_parallel_region(x, group=None):
    return _F.apply(x, group)


def reduce_from_parallel_region(x, group=None):
    return dnf.all_reduce(x, group=group or dist.group.WORLD)


def _gather(x, group):
    return torch.cat(dnf.all_gather(x.contiguous(), group=group or dist.group.WORLD), dim=-1)


class ColumnParallelLinear(nn.Module):
    def __init__(self, in_features, out_features, bias=True, gather_output=False, group=None):
        super().__init__()
        tp, r = dist.get_world_size(group), dist.get_rank(group)
        full = nn.Linear(in_features, out_features, bias=bias)
        n = out_features // tp
        self.weight = nn.Parameter(full.weight.detach()[r * n:(r + 1) * n].clone())
        self.bias = nn.Parameter(full.bias.detach()[r * n:(r + 1) * n].clone()) if bias else None
        self.gather_output, self.group = gather_output, group

    def forward(self, x):
        y = F.linear(copy_to_parallel_region(x, self.group), self.weight, self.bias)
        return _gather(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    def __init__(self, in_features, out_features, bias=True, input_is_parallel=True, group=None):
        super().__init__()
        tp, r = dist.get_world_size(group), dist.get_rank(group)
        full = nn.Linear(in_features, out_features, bias=bias)
        n = in_features // tp
        self.weight = nn.Parameter(full.weight.detach()[:, r * n:(r + 1) * n].clone())
        self.bias = nn.Parameter(full.bias.detach().clone()) if bias else None
        self.input_is_parallel, self.group, self.tp, self.r = input_is_parallel, group, tp, r

    def forward(self, x):
        if not self.input_is_parallel:
            x = copy_to_parallel_region(x, self.group).chunk(self.tp, dim=-1)[self.r]
        y = reduce_from_parallel_region(F.linear(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y


class ParallelMLP(nn.Module):
    def __init__(self, hidden_size, ffn_hidden_size, bias=True, group=None):
        super().__init__()
        self.fc1 = ColumnParallelLinear(hidden_size, ffn_hidden_size, bias, group=group)
        self.fc2 = RowParallelLinear(ffn_hidden_size, hidden_size, bias, group=group)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def rank_groups(world_size, tp=1, dp=1, cp=1, pp=1, order="tp-cp-pp-dp"):
    # a correct grid written with itertools: the first name is the innermost loop
    import itertools
    sizes = {"tp": tp, "dp": dp, "cp": cp, "pp": pp}
    names = order.split("-") + [n for n in sizes if n not in order.split("-")]
    coords = [tuple(reversed(c)) for c in itertools.product(*[range(sizes[n]) for n in reversed(names)])]
    out = {}
    for kind in sizes:
        k = names.index(kind)
        groups = {}
        for rank, c in enumerate(coords):
            groups.setdefault(c[:k] + c[k + 1:], []).append(rank)
        out[kind] = list(groups.values())
    return out
