"""Tensor parallelism the Megatron-LM way: split one layer's weights over the ranks of a group.

Megatron-LM (Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion Parameter Language Models Using
Model Parallelism") needs only two communication operators, both autograd Functions:

    f = copy_to_parallel_region      forward: identity     backward: all-reduce (sum)
    g = reduce_from_parallel_region  forward: all-reduce   backward: identity

and two layers built from them:

    ColumnParallelLinear   Y = X A,  A split by columns (output features): rank r holds A_r, computes Y_r = X A_r
    RowParallelLinear      Y = X B,  B split by rows (input features): rank r computes X_r B_r, g sums them

Column then row (an MLP, the heads of an attention block) needs one all-reduce forward (g) and one
backward (f). PyTorch's nn.Linear stores ``weight`` as ``[out_features, in_features]``, so here:

    ColumnParallelLinear.weight  [out_features/tp, in_features]   rows r*out/tp .. (r+1)*out/tp of the full weight
    ColumnParallelLinear.bias    [out_features/tp]
    RowParallelLinear.weight     [out_features, in_features/tp]   columns r*in/tp .. (r+1)*in/tp of the full weight
    RowParallelLinear.bias       [out_features]                   whole, added once after the all-reduce

That layout is what ``course check tp`` relies on: it builds the serial ``nn.Linear`` with a fixed seed,
copies this rank's shard into ``.weight``/``.bias`` and compares outputs and gradients with serial.
``ParallelMLP`` must keep its layers as ``.fc1`` (column) and ``.fc2`` (row), with GELU between them;
``ParallelSelfAttention`` keeps ``.q``, ``.k``, ``.v`` (column) and ``.proj`` (row).

Every function takes ``group=None``: the tensor-parallel process group (None: all ranks).
Run ``course check tp exercises/06_tensor_parallel/tp.py`` to check your work.
"""
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def _world(group):
    """(tp size, this rank's index in the group)."""
    return dist.get_world_size(group), dist.get_rank(group)


# ----------------------------------------------------------------------------- f and g
class _CopyToParallelRegion(torch.autograd.Function):
    """Megatron's f: every rank of the group goes on with the same input; gradients from all ranks are summed."""

    @staticmethod
    def forward(ctx, x, group):
        # YOUR CODE HERE
        raise NotImplementedError()

    @staticmethod
    def backward(ctx, grad_output):
        # YOUR CODE HERE
        raise NotImplementedError()


class _ReduceFromParallelRegion(torch.autograd.Function):
    """Megatron's g: sum the ranks' partial results; the gradient of a sum reaches every term unchanged."""

    @staticmethod
    def forward(ctx, x, group):
        # YOUR CODE HERE
        raise NotImplementedError()

    @staticmethod
    def backward(ctx, grad_output):
        # YOUR CODE HERE
        raise NotImplementedError()


def copy_to_parallel_region(x, group=None):
    """f: identity forward, all-reduce backward."""
    return _CopyToParallelRegion.apply(x, group)


def reduce_from_parallel_region(x, group=None):
    """g: all-reduce forward, identity backward."""
    return _ReduceFromParallelRegion.apply(x, group)


# Two more operators for the layers' optional modes (given: read them, they follow the same pattern).
class _GatherFromParallelRegion(torch.autograd.Function):
    """All-gather the ranks' shards along the last dimension; backward keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        tp, _ = _world(group)
        parts = [torch.empty_like(x) for _ in range(tp)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad_output):
        tp, rank = _world(ctx.group)
        return grad_output.chunk(tp, dim=-1)[rank].contiguous(), None


class _ScatterToParallelRegion(torch.autograd.Function):
    """Keep this rank's slice of the last dimension; backward all-gathers the slices' gradients."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        tp, rank = _world(group)
        return x.chunk(tp, dim=-1)[rank].contiguous()

    @staticmethod
    def backward(ctx, grad_output):
        return _GatherFromParallelRegion.apply(grad_output, ctx.group), None


def gather_from_parallel_region(x, group=None):
    return _GatherFromParallelRegion.apply(x, group)


def scatter_to_parallel_region(x, group=None):
    return _ScatterToParallelRegion.apply(x, group)


# ----------------------------------------------------------------------------- layers
def _divide(n, tp, what):
    if n % tp:
        raise ValueError(f"{what}={n} is not divisible by the tensor-parallel size {tp}")
    return n // tp


def _init_like_linear(weight, bias, fan_in):
    """nn.Linear's default initialisation, with the fan-in of the whole (unsplit) layer. Each rank draws its shard from
    its own generator, so ranks seeded alike draw alike shards: course_lib.tp.train copies the serial model's weights
    into the shards instead, as Megatron's CPU initialisation splits one master weight."""
    bound = 1 / math.sqrt(fan_in)
    nn.init.uniform_(weight, -bound, bound)
    if bias is not None:
        nn.init.uniform_(bias, -bound, bound)


class ColumnParallelLinear(nn.Module):
    """Y = X A with A split by output features: rank r computes Y_r = X A_r (Megatron's column-parallel linear).

    ``gather_output=True`` all-gathers the ranks' Y_r into the whole Y; False leaves Y_r, ready for a
    RowParallelLinear with ``input_is_parallel=True``.
    """

    def __init__(self, in_features, out_features, bias=True, gather_output=False, group=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.gather_output, self.group = gather_output, group
        tp, _ = _world(group)
        self.weight = None   # TODO: this rank's rows of the [out_features, in_features] weight
        self.bias = None     # TODO: this rank's part of the bias (None when bias=False)
        if self.weight is not None:
            _init_like_linear(self.weight, self.bias, in_features)

    def forward(self, x):
        # YOUR CODE HERE
        raise NotImplementedError()


class RowParallelLinear(nn.Module):
    """Y = X B with B split by input features: rank r computes X_r B_r, g sums them (Megatron's row-parallel linear).

    ``input_is_parallel=True``: x is already this rank's slice X_r (the output of a ColumnParallelLinear);
    False: x is the whole X and each rank takes its slice. The bias is added once, after the sum.
    """

    def __init__(self, in_features, out_features, bias=True, input_is_parallel=True, group=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel, self.group = input_is_parallel, group
        tp, _ = _world(group)
        self.weight = None   # TODO: this rank's columns of the [out_features, in_features] weight
        self.bias = None     # TODO: the bias (None when bias=False)
        if self.weight is not None:
            _init_like_linear(self.weight, self.bias, in_features)

    def forward(self, x):
        # YOUR CODE HERE
        raise NotImplementedError()


class ParallelMLP(nn.Module):
    """fc1 (column-parallel, no gather) -> GELU -> fc2 (row-parallel): one all-reduce forward, one backward."""

    def __init__(self, hidden_size, ffn_hidden_size, bias=True, group=None):
        super().__init__()
        self.fc1 = None   # TODO: a ColumnParallelLinear hidden_size -> ffn_hidden_size
        self.fc2 = None   # TODO: a RowParallelLinear ffn_hidden_size -> hidden_size

    def forward(self, x):
        # YOUR CODE HERE
        raise NotImplementedError()


class ParallelSelfAttention(nn.Module):
    """Multi-head self-attention with the heads split over the ranks (Megatron's parallel attention).

    q, k, v are column-parallel (rank r gets heads r*h/tp .. (r+1)*h/tp), the heads' attention needs no
    communication, and the output projection is row-parallel: one all-reduce forward (g, after proj); in backward
    each of q, k and v applies f, so three all-reduces (Megatron fuses q, k, v into one linear: one all-reduce).
    Input and output are ``[batch, sequence, hidden_size]``; no mask, no dropout.
    """

    def __init__(self, hidden_size, num_heads, group=None):
        super().__init__()
        tp, _ = _world(group)
        self.local_heads = _divide(num_heads, tp, "num_heads")
        self.head_dim = _divide(hidden_size, num_heads, "hidden_size per head")
        self.q = ColumnParallelLinear(hidden_size, hidden_size, group=group)
        self.k = ColumnParallelLinear(hidden_size, hidden_size, group=group)
        self.v = ColumnParallelLinear(hidden_size, hidden_size, group=group)
        self.proj = RowParallelLinear(hidden_size, hidden_size, input_is_parallel=True, group=group)

    def forward(self, x):
        b, t, _ = x.shape
        # YOUR CODE HERE
        raise NotImplementedError()


# ----------------------------------------------------------------------------- rank groups
NAMES = ("tp", "cp", "pp", "dp")


def rank_groups(world_size, tp=1, dp=1, cp=1, pp=1, order="tp-cp-pp-dp"):
    """The rank grid of Megatron's RankGenerator: ``{"tp": [[ranks], ...], "dp": ..., "cp": ..., "pp": ...}``.

    Ranks are laid out on a grid with one axis per name in ``order``; the FIRST name varies fastest, so
    with the default order the ranks of one tp group are neighbours (the same node, the fastest links).
    A group of kind "dp" is the set of ranks that differ only in their dp coordinate. Names of size 1
    may be left out of ``order``. Example: 8 ranks, tp=4, dp=2 ->
    tp [[0, 1, 2, 3], [4, 5, 6, 7]], dp [[0, 4], [1, 5], [2, 6], [3, 7]].
    """
    sizes = {"tp": tp, "dp": dp, "cp": cp, "pp": pp}
    names = order.lower().split("-")
    if sorted(set(names)) != sorted(names) or not set(names) <= set(sizes):
        raise ValueError(f"order={order!r}: use each of {', '.join(NAMES)} at most once, joined by '-'")
    for name in NAMES:
        if name not in names:
            if sizes[name] != 1:
                raise ValueError(f"{name}={sizes[name]} but {name!r} is not in order={order!r}")
            names.append(name)
    if tp * dp * cp * pp != world_size:
        raise ValueError(f"tp*dp*cp*pp = {tp * dp * cp * pp} but world_size = {world_size}")
    # YOUR CODE HERE
    raise NotImplementedError()


def init_rank_groups(tp=1, dp=1, cp=1, pp=1, order="tp-cp-pp-dp"):
    """Create the torch.distributed groups of the grid; return ``{"tp": group, ...}``: the ones holding this rank.

    ``dist.new_group`` is collective over the whole world: every rank must create every group, in the
    same order, even the groups it is not a member of.
    """
    rank = dist.get_rank()
    grid = rank_groups(dist.get_world_size(), tp=tp, dp=dp, cp=cp, pp=pp, order=order)
    mine = {}
    # YOUR CODE HERE
    raise NotImplementedError()
    return mine
