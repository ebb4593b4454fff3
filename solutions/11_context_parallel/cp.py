"""Context parallelism: the sequence split over the ranks of a cp group, attention computed across the shards.

Every tensor is ``[batch, tokens, features]`` (one attention head: heads add nothing to the split of the sequence).
Each of the cp ranks holds the activations of S / cp tokens and all the weights. Attention couples the shards:
a query needs every key and value it attends to, and with a causal mask those are the tokens at *global*
positions up to its own. What you write, in order (``course check cp exercises/11_context_parallel/cp.py``):

    split_positions(seq_len, cp, rank, balanced=False) -> LongTensor   the global positions rank holds, ascending:
        plain:    contiguous, in rank order, shard sizes differing by at most one (S need not divide by cp);
        balanced: S cut into 2*cp chunks by torch.tensor_split's rule; rank r holds chunks r and 2*cp-1-r, so
                  every rank gets an early (cheap) and a late (expensive) part of a causal sequence
    unshard_sequence(local, positions, seq_len, group=None) -> [B, S, F] on every rank: the whole sequence put
        back together from every rank's shard (forward only: to log or compare outputs)
    gather_sequence(t, group=None) -> [B, cp*s, F]: every rank's shard of equal size s, in rank order; an
        autograd Function whose backward is the reduce-scatter (every rank's queries used this rank's keys)
    cp_attention(q, k, v, positions, group=None) -> [B, s, F]: causal softmax(q k^T / sqrt(F)) v for this rank's
        queries, over the gathered keys and values, masked at the tokens' global positions
    merge_partials(out_a, lse_a, out_b, lse_b) -> (out, lse): two attention results over disjoint key blocks
        (each normalised over its own block; lse [B, s] the log of its softmax denominator) merged into the
        attention over both blocks: the log-sum-exp correction of blockwise (online) softmax
    ring_attention(q, k, v, positions, group=None) -> [B, s, F]: the same output as cp_attention, forward only,
        with key/value blocks (and their positions) passed around the group with send/recv, no collective
    reduce_shared_grads(params, dp_group, cp_group): the weights are replicated over dp AND cp, each rank's loss
        being the mean over its own tokens: average every grad over all dp*cp ranks, in place

``group``, ``dp_group``, ``cp_group`` are process groups (None: every rank); send/recv take global ranks
(``dist.get_global_rank(group, r)``). ``block_attention`` (given) is one block's attention with its lse.
"""
import math

import torch
import torch.distributed as dist


def split_positions(seq_len, cp, rank, balanced=False):
    """The global positions of the tokens that rank ``rank`` of ``cp`` holds, as an ascending LongTensor."""
    ### BEGIN SOLUTION
    # STUB: raise NotImplementedError("split_positions: plain: torch.arange(seq_len).tensor_split(cp)[rank]; "
    # STUB:                           "balanced: tensor_split into 2*cp chunks, cat chunks rank and 2*cp-1-rank")
    positions = torch.arange(seq_len)
    if not balanced:
        return positions.tensor_split(cp)[rank]        # the first seq_len % cp ranks get one token more
    chunks = positions.tensor_split(2 * cp)
    return torch.cat([chunks[rank], chunks[2 * cp - 1 - rank]])
    ### END SOLUTION


def unshard_sequence(local, positions, seq_len, group=None):
    """The whole ``[B, seq_len, F]`` sequence on every rank, from each rank's ``local`` at its ``positions``."""
    ### BEGIN SOLUTION
    # STUB: raise NotImplementedError("unshard_sequence: put `local` at its `positions` in a zero [B, seq_len, F] "
    # STUB:                           "tensor, then all_reduce it over the group (every position is on one rank)")
    full = local.new_zeros(local.shape[0], seq_len, *local.shape[2:])
    full[:, positions] = local
    dist.all_reduce(full, group=group)   # shards may differ in size: a sum of disjoint parts needs no padding
    return full
    ### END SOLUTION


class _GatherSequence(torch.autograd.Function):
    """All-gather along the sequence in forward; in backward each rank gets the sum of every rank's gradient for
    its own shard (reduce-scatter): other ranks' queries attended to this rank's keys too."""

    @staticmethod
    def forward(ctx, t, group):
        ### BEGIN SOLUTION
        # STUB: raise NotImplementedError("gather_sequence forward: all_gather every rank's t over the group, "
        # STUB:                           "torch.cat the parts along dim 1 (keep the group in ctx for backward)")
        ctx.group = group
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, t.contiguous(), group=group)
        return torch.cat(parts, dim=1)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        ### BEGIN SOLUTION
        # STUB: raise NotImplementedError("gather_sequence backward: reduce-scatter grad_output's cp slices along "
        # STUB:                           "dim 1 (dist.reduce_scatter): this rank gets the sum of its own slice")
        cp = dist.get_world_size(ctx.group)
        parts = [p.contiguous() for p in grad_output.chunk(cp, dim=1)]
        grad = torch.empty_like(parts[0])
        dist.reduce_scatter(grad, parts, group=ctx.group)   # sum over ranks of each rank's slice
        return grad, None
        ### END SOLUTION


def gather_sequence(t, group=None):
    """Every rank's equal-sized shard ``t`` ``[B, s, F]`` concatenated in rank order: ``[B, cp*s, F]``."""
    return _GatherSequence.apply(t, group)


def cp_attention(q, k, v, positions, group=None):
    """Causal attention of this rank's queries over every rank's keys and values (gathered)."""
    ### BEGIN SOLUTION
    # STUB: raise NotImplementedError("cp_attention: gather k and v with gather_sequence, all_gather the positions, "
    # STUB:                           "mask scores where key position > query position, softmax, times v")
    keys, values = gather_sequence(k, group), gather_sequence(v, group)
    parts = [torch.empty_like(positions) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, positions, group=group)    # the keys' global positions (a balanced split interleaves)
    key_positions = torch.cat(parts)
    scores = q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])
    future = key_positions[None, :] > positions[:, None]
    return scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ values
    ### END SOLUTION


def block_attention(q, k, v, q_positions, k_positions):
    """Causal attention of ``q`` over one block of keys: (output normalised over this block, lse ``[B, s]``).

    A query that sees no key of the block (all in its future) gets output 0 and lse -inf: it weighs nothing."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(k_positions[None, :] > q_positions[:, None], float("-inf"))
    lse = scores.logsumexp(dim=-1)
    weights = torch.exp(scores - lse.masked_fill(lse.isinf(), 0).unsqueeze(-1))   # 0, not nan, where all masked
    return weights @ v, lse


def merge_partials(out_a, lse_a, out_b, lse_b):
    """Attention over keys A and B from the attention over A and over B alone (each with its lse)."""
    ### BEGIN SOLUTION
    # STUB: raise NotImplementedError("merge_partials: lse = logaddexp(lse_a, lse_b); "
    # STUB:                           "out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b (per query)")
    lse = torch.logaddexp(lse_a, lse_b)
    # each part was divided by its own denominator exp(lse_x); rescale both to the joint one
    out = torch.exp(lse_a - lse).unsqueeze(-1) * out_a + torch.exp(lse_b - lse).unsqueeze(-1) * out_b
    return out, lse
    ### END SOLUTION


def ring_attention(q, k, v, positions, group=None):
    """cp_attention's output, with key/value blocks passed around the ring instead of gathered (forward only)."""
    ### BEGIN SOLUTION
    # STUB: raise NotImplementedError("ring_attention: start from block_attention on your own block; cp-1 times: "
    # STUB:                           "isend k, v, positions to the next rank and irecv the previous rank's (post "
    # STUB:                           "both, then wait), block_attention on what came, merge_partials")
    cp, me = dist.get_world_size(group), dist.get_rank(group)
    nxt, prev = [r if group is None else dist.get_global_rank(group, r) for r in ((me + 1) % cp, (me - 1) % cp)]
    out, lse = block_attention(q, k, v, positions, positions)
    block = [k.contiguous(), v.contiguous(), positions.contiguous()]
    for _ in range(cp - 1):
        incoming = [torch.empty_like(t) for t in block]
        # post every send and receive before waiting on any: blocking sends on every rank would all wait
        ops = [dist.P2POp(dist.isend, t, nxt, group) for t in block]
        ops += [dist.P2POp(dist.irecv, t, prev, group) for t in incoming]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        block = incoming
        out_b, lse_b = block_attention(q, block[0], block[1], positions, block[2])
        out, lse = merge_partials(out, lse, out_b, lse_b)
    return out
    ### END SOLUTION


def reduce_shared_grads(params, dp_group, cp_group):
    """Average each parameter's ``.grad`` over the dp x cp ranks, in place (params without a grad are skipped)."""
    ### BEGIN SOLUTION
    # STUB: raise NotImplementedError("reduce_shared_grads: all_reduce each grad over dp_group and over cp_group, "
    # STUB:                           "then divide by dp * cp")
    ranks = dist.get_world_size(dp_group) * dist.get_world_size(cp_group)
    for p in params:
        if p.grad is None:
            continue
        dist.all_reduce(p.grad, group=dp_group)
        dist.all_reduce(p.grad, group=cp_group)   # the weights are replicated over cp too
        p.grad /= ranks
    ### END SOLUTION
