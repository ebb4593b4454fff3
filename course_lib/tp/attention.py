"""What a ParallelSelfAttention whose output differs from serial got wrong: the serial reference stated, and the
usual mistakes (the scale, a missing transpose of the heads) each tried on the same weights, shard by shard as the
ranks compute it; a mistake whose output matches the learner's is named."""
from __future__ import annotations


def sharded(serial, xs, shape, tp: int, scale=None, split_t: bool = True, merge_t: bool = True):
    """Attention as ``tp`` ranks compute it with ``serial``'s weights (rank r: heads r*H/tp ..; q, k, v column
    shards, proj a row shard, its bias once), ``scale`` and the two transposes as given; ``tp`` = 1: the serial
    layer."""
    import torch.nn.functional as F
    b, t, h, heads = shape
    d, lh = h // heads, heads // tp
    out = serial["proj"].bias.expand(b, t, h)
    for r in range(tp):
        sl = slice(r * h // tp, (r + 1) * h // tp)
        q, k, v = (F.linear(xs, serial[n].weight[sl], serial[n].bias[sl]).view(b, t, lh, d) for n in "qkv")
        if split_t:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, scale=scale)
        o = o.transpose(1, 2) if merge_t else o
        out = out + F.linear(o.reshape(b, t, lh * d), serial["proj"].weight[:, sl])
    return out


def reference(shape, tp: int) -> str:
    b, t, h, heads = shape
    d = h // heads
    return (f"the serial reference: per head softmax(q k^T / sqrt(head_dim)) v, head_dim = hidden_size/num_heads = "
            f"{h}/{heads} = {d}; q, k, v split into heads as .view(b, t, heads, head_dim).transpose(1, 2) (rank r "
            f"computes heads r*{heads}/tp .. (r+1)*{heads}/tp - 1, tp={tp}), merged back as .transpose(1, 2)"
            f".reshape(b, t, ...), then proj")


def mistakes(shape, tp: int) -> list[tuple[str, dict]]:
    """(what the learner did, how to compute it) for the usual mistakes, the scales grouped by value."""
    _, _, h, heads = shape
    d = h // heads
    scales: dict = {}
    for label, value in ((f"1/sqrt(hidden_size) = 1/sqrt({h})", h ** -0.5),
                         (f"1/sqrt(hidden_size/tp) = 1/sqrt({h // tp})", (h // tp) ** -0.5),
                         (f"1/head_dim = 1/{d}", 1 / d), ("1 (no scale)", 1.0)):
        if abs(value - d ** -0.5) > 1e-12:
            scales.setdefault(round(value, 12), []).append(label)
    out = [(f"the scores scaled by {' = '.join(labels)} instead of 1/sqrt(head_dim) = 1/sqrt({d}) (the default "
            f"of F.scaled_dot_product_attention): a head's dot products sum head_dim terms, not hidden_size",
            {"scale": value})
           for value, labels in scales.items()]
    return out + [
        ("the heads split without .transpose(1, 2): on [b, t, heads, head_dim] attention runs across the heads at "
         "each position, not across the sequence", {"split_t": False, "merge_t": False}),
        ("the heads split without .transpose(1, 2) (and merged back with it): attention runs across the heads, "
         "not the sequence", {"split_t": False}),
        ("the heads merged back without .transpose(1, 2) before .reshape(b, t, ...): the reshape mixes heads and "
         "positions", {"merge_t": False})]


def explain(y, serial, xs, shape, tp: int) -> str:
    """The message for an output ``y`` that differs from serial: the reference, then the mistake it matches, or
    the usual causes."""
    from course_lib.tp.numerics import close
    for what, how in mistakes(shape, tp):
        if close(y, sharded(serial, xs, shape, tp, **how).detach()):
            return f"{reference(shape, tp)}. Your output matches {what}"
    return (f"{reference(shape, tp)}. Usual causes: the scale (1/sqrt(head_dim), not 1/sqrt(hidden_size)), a "
            f"missing .transpose(1, 2) when splitting q, k, v into heads or merging them back, or this rank's heads "
            f"taken from the wrong slice")
