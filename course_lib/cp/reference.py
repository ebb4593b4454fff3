"""The serial computations ``course check cp`` compares with, written out independently of the exercise file:
the split of a sequence, causal attention in one process, one block's attention, and an autograd-correct gather
(the checker's own cp attention, used where a case must not depend on the learner's)."""
import math


def positions(seq_len: int, cp: int, rank: int, balanced: bool = False):
    """Plain: contiguous, torch.tensor_split's sizes; balanced: of 2*cp chunks, chunks rank and 2*cp-1-rank."""
    import torch
    pos = torch.arange(seq_len)
    if not balanced:
        return pos.tensor_split(cp)[rank]
    chunks = pos.tensor_split(2 * cp)
    return torch.cat([chunks[rank], chunks[2 * cp - 1 - rank]])


def attention(q, k, v, q_pos, k_pos):
    """Causal softmax(q k^T / sqrt(F)) v, key j visible to query i when k_pos[j] <= q_pos[i]."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return scores.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf")).softmax(dim=-1) @ v


def serial(q, k, v):
    """Causal attention over the whole sequence in one process."""
    import torch
    pos = torch.arange(q.shape[1])
    return attention(q, k, v, pos, pos)


def block(q, k, v, q_pos, k_pos):
    """One block's causal attention and its log-sum-exp (a query that sees no key: output 0, lse -inf)."""
    import torch
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    lse = scores.logsumexp(dim=-1)
    return torch.exp(scores - lse.masked_fill(lse.isinf(), 0).unsqueeze(-1)) @ v, lse


def average(out_a, lse_a, out_b, lse_b):
    """The mistake: partial softmaxes averaged, without the log-sum-exp correction."""
    import torch
    return (out_a + out_b) / 2, torch.maximum(lse_a, lse_b)


def ring_order(q, blocks, me: int, merge_fn):
    """What rank ``me`` of a ring computes: its own block, then those of me-1, me-2, ... merged with ``merge_fn``;
    ``blocks``: every rank's (k, v, positions) and q with this rank's positions as blocks[me][2]."""
    cp, q_pos = len(blocks), blocks[me][2]
    out, lse = block(q, *blocks[me][:2], q_pos, blocks[me][2])
    for step in range(1, cp):
        k, v, k_pos = blocks[(me - step) % cp]
        out, lse = merge_fn(out, lse, *block(q, k, v, q_pos, k_pos))
    return out


def _gather_class():
    import torch
    import torch.distributed as dist

    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t, group):
            ctx.group = group
            parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
            dist.all_gather(parts, t.contiguous(), group=group)
            return torch.cat(parts, dim=1)

        @staticmethod
        def backward(ctx, grad):
            parts = [p.contiguous() for p in grad.chunk(dist.get_world_size(ctx.group), dim=1)]
            out = torch.empty_like(parts[0])
            dist.reduce_scatter(out, parts, group=ctx.group)
            return out, None
    return Gather


def cp_attention(q, k, v, pos, group):
    """The checker's own context-parallel attention (plain torch.distributed): all-gather K, V and positions."""
    import torch
    import torch.distributed as dist
    gather = _gather_class()
    parts = [torch.empty_like(pos) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, pos, group=group)
    return attention(q, gather.apply(k, group), gather.apply(v, group), pos, torch.cat(parts))
