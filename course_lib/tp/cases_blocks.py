"""Cases for the blocks built from the layers: ParallelMLP (column, GELU, row) and ParallelSelfAttention, whose
output, where it differs from serial, is compared with the usual mistakes (the scale, a missing transpose of the
heads), each computed on the same weights shard by shard as the ranks do."""
from course_lib.checking.case import Fail
from course_lib.checking.collectives import Collectives, ring
from course_lib.tp.cases_linear import BIAS_SHARE, N_IN, ONE_F
from course_lib.tp.meter import check_held, check_sent
from course_lib.tp.numerics import as_tensor, close, compare_grads, diff, judge, rand
from course_lib.tp.shards import check_column_shapes, check_row_shapes, load_column, load_row, serial_linear


def _mlp_communication(fwd, bwd):
    """Column then row needs one all-reduce each way; more is right but wasteful."""
    for when, counts, which in (("forward", fwd, "g after fc2): keep fc1's output split (gather_output=False, "
                                                 "input_is_parallel=True"), ("backward", bwd, "f before fc1")):
        if any(v and not (k == "all_reduce" and v <= 1) for k, v in counts.items()):
            calls = ", ".join(f"{v} x {k}" for k, v in counts.items() if v)
            raise Fail(f"ParallelMLP is right but communicates more than it needs in {when}: {calls}; column then "
                       f"row needs ONE all-reduce ({which})")


def case_mlp(c):
    import torch.nn.functional as F
    cls = c.need("ParallelMLP")
    h, ffn = N_IN, 16
    mlp = cls(h, ffn, **c.kw).double()
    if getattr(mlp, "fc1", None) is None or getattr(mlp, "fc2", None) is None:
        raise Fail("ParallelMLP must keep its layers as .fc1 (a ColumnParallelLinear) and .fc2 (a RowParallelLinear)")
    w1, b1 = check_column_shapes(mlp.fc1, h, ffn, c.tp, "ParallelMLP.fc1")
    w2, b2 = check_row_shapes(mlp.fc2, ffn, h, c.tp, "ParallelMLP.fc2")
    fc1, fc2 = serial_linear(c.seed + 11, h, ffn), serial_linear(c.seed + 12, ffn, h)
    load_column(mlp.fc1, fc1, c.tp, c.r)
    load_row(mlp.fc2, fc2, c.tp, c.r)
    x0 = rand(c.seed + 13, 3, 5, h)   # [batch, sequence, hidden]
    x, xs = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    c.take_counts()
    with Collectives() as fwd_sent:
        y = as_tensor(mlp(x), "ParallelMLP")
    fwd = c.take_counts()
    want = fc2(F.gelu(fc1(xs)))
    judge(y.detach(), want.detach(), "ParallelMLP: forward output differs from serial fc2(gelu(fc1(x)))", [
        (fc2(F.relu(fc1(xs))).detach(), "ParallelMLP uses ReLU; the course's MLP (and its serial twin) uses GELU: "
                                        "F.gelu")])
    grad_out = rand(c.seed + 14, 3, 5, h)
    with Collectives() as bwd_sent:
        (y * grad_out).sum().backward()
    bwd = c.take_counts()
    (want * grad_out).sum().backward()
    s1 = slice(c.r * ffn // c.tp, (c.r + 1) * ffn // c.tp)
    compare_grads("ParallelMLP", [
        ("input grads", x.grad, xs.grad, None, "no gradient reached the input"),
        ("fc1 weight grads", w1.grad, fc1.weight.grad[s1], None, "is fc1 used?"),
        ("fc1 bias grads", b1.grad, fc1.bias.grad[s1], None, "is fc1's bias used?"),
        ("fc2 weight grads", w2.grad, fc2.weight.grad[:, s1], None, "is fc2 used?"),
        ("fc2 bias grads", b2.grad, fc2.bias.grad, (1 / c.tp, BIAS_SHARE), "is fc2's bias used?"),
    ])
    _mlp_communication(fwd, bwd)
    one = ring("all_reduce", x0.numel(), c.tp)
    check_sent("ParallelMLP", "forward", fwd_sent.calls, one, c.tp, "column then row needs ONE all-reduce (g)")
    check_sent("ParallelMLP", "backward", bwd_sent.calls, one, c.tp, ONE_F)
    check_held("ParallelMLP", mlp, {"fc1.weight": [ffn // c.tp, h], "fc1.bias": [ffn // c.tp],
                                    "fc2.weight": [h, ffn // c.tp], "fc2.bias": [h]})


def case_attention(c):
    import torch
    cls = c.need("ParallelSelfAttention")
    h, heads, b, t = N_IN, 4, 2, 5
    attn = cls(h, heads, **c.kw).double()
    for nm in ("q", "k", "v", "proj"):
        if not hasattr(attn, nm):
            raise Fail("ParallelSelfAttention must keep its layers as .q, .k, .v (column-parallel) and .proj "
                       "(row-parallel)")
    serial = {nm: serial_linear(c.seed + 20 + i, h, h) for i, nm in enumerate(("q", "k", "v", "proj"))}
    for nm in ("q", "k", "v"):
        check_column_shapes(getattr(attn, nm), h, h, c.tp, f"ParallelSelfAttention.{nm}")
        load_column(getattr(attn, nm), serial[nm], c.tp, c.r)
    check_row_shapes(attn.proj, h, h, c.tp, "ParallelSelfAttention.proj")
    load_row(attn.proj, serial["proj"], c.tp, c.r)
    x0 = rand(c.seed + 25, b, t, h)
    x, xs = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    with Collectives() as fwd:
        y = as_tensor(attn(x), "ParallelSelfAttention")
    want = sharded(serial, xs, (b, t, h, heads), 1)   # one rank: serial multi-head attention
    if not close(y.detach(), want.detach()):
        with torch.no_grad():
            why = explain(y.detach(), serial, xs, (b, t, h, heads), c.tp)
        raise Fail(f"ParallelSelfAttention: forward output differs from serial multi-head attention with "
                   f"{heads} heads ({diff(y.detach(), want.detach())}); {why}")
    grad_out = rand(c.seed + 26, b, t, h)
    with Collectives() as bwd:
        (y * grad_out).sum().backward()
    (want * grad_out).sum().backward()
    sl = slice(c.r * h // c.tp, (c.r + 1) * h // c.tp)
    pairs = [("input grads", x.grad, xs.grad, None, "no gradient reached the input")]
    for nm in ("q", "k", "v"):
        pairs.append((f"{nm} weight grads", getattr(attn, nm).weight.grad, serial[nm].weight.grad[sl], None,
                      "unused?"))
    pairs.append(("proj weight grads", attn.proj.weight.grad, serial["proj"].weight.grad[:, sl], None, "unused?"))
    pairs.append(("proj bias grads", attn.proj.bias.grad, serial["proj"].bias.grad, (1 / c.tp, BIAS_SHARE),
                  "unused?"))
    compare_grads("ParallelSelfAttention", pairs)
    _attention_costs(c, attn, fwd.calls, bwd.calls, x0.numel(), h)


def _attention_costs(c, attn, fwd, bwd, n, h):
    """One all-reduce forward (g after proj), one per f backward (q, k, v); only this rank's heads kept."""
    name, one = "ParallelSelfAttention", ring("all_reduce", n, c.tp)
    check_sent(name, "forward", fwd, one, c.tp, "each rank computes its own heads from its own q, k, v shards (no "
               "gather: a rank that computes every head repeats the others' work) and the forward needs ONE "
               "all-reduce (g after proj)")
    check_sent(name, "backward", bwd, 3 * one, c.tp, "its backward needs one all-reduce per f (q, k and v)")
    col = {"weight": [h // c.tp, h], "bias": [h // c.tp]}
    shards = {f"{nm}.{k}": s for nm in "qkv" for k, s in col.items()}
    check_held(name, attn, {**shards, "proj.weight": [h, h // c.tp], "proj.bias": [h]})


def sharded(serial, xs, shape, tp: int, scale=None, split_t: bool = True, merge_t: bool = True,
            causal: bool = False):
    """Attention as ``tp`` ranks compute it with ``serial``'s weights (rank r: heads r*H/tp ..; q, k, v column
    shards, proj a row shard, its bias once), ``scale``, the two transposes and a causal mask as given; ``tp`` = 1:
    the serial layer."""
    import torch.nn.functional as F
    b, t, h, heads = shape
    d, lh = h // heads, heads // tp
    out = serial["proj"].bias.expand(b, t, h)
    for r in range(tp):
        sl = slice(r * h // tp, (r + 1) * h // tp)
        q, k, v = (F.linear(xs, serial[n].weight[sl], serial[n].bias[sl]).view(b, t, lh, d) for n in "qkv")
        if split_t:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=causal)
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
         "positions", {"merge_t": False}),
        ("a causal mask (is_causal=True or a triangular attn_mask): the exercise's attention has none, every "
         "position attends to every other", {"causal": True})]


def explain(y, serial, xs, shape, tp: int) -> str:
    """The message for an output ``y`` that differs from serial: the reference, then the mistake it matches, or
    the usual causes."""
    for what, how in mistakes(shape, tp):
        if close(y, sharded(serial, xs, shape, tp, **how).detach()):
            return f"{reference(shape, tp)}. Your output matches {what}"
    return (f"{reference(shape, tp)}. Usual causes: the scale (1/sqrt(head_dim), not 1/sqrt(hidden_size)), a "
            f"missing .transpose(1, 2) when splitting q, k, v into heads or merging them back, a mask (there is "
            f"none), or this rank's heads taken from the wrong slice")
