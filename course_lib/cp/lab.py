"""Notebook 11's measurements on real gloo ranks: per-rank activation memory, bytes per step, causal work per rank.

    (4 ranks)  python -m course_lib.cp.lab --seq-lens 64,128,256

With the checker's own cp attention (course_lib.cp.reference), so the figures do not depend on the learner's cp.py:
for cp = 1, 2, 4 and each sequence length, one forward and backward of course_lib.cp.train's model (float32, the
load-balanced split). Memory: the storages autograd saves for backward (parameters left out), each once;
communication: the payload each call hands to torch.distributed (all-gather: what the rank receives;
reduce-scatter: what it sends; all-reduce: 2 (n-1)/n of the tensor, the ring's bound). Rank 0 prints one
``@cp {json}`` line per measurement.
"""
import argparse
import contextlib
import json

from course_lib import gridrun
from course_lib.cp import reference
from course_lib.cp.train import forward, model

BATCH, FEATURES = 2, 16


def formula_memory(seq_len: int, cp: int, batch: int = BATCH, features: int = FEATURES) -> dict:
    """Bytes autograd saves per rank (float32, s = S / cp tokens here): per token x, the q|k|v output, the attention
    output (5 B s F); the gathered K and V (2 B S F: whole, whatever cp); the softmax probabilities (B s S floats)
    and the causal mask (s S bools)."""
    s = seq_len // cp
    return {"tokens": 4 * 5 * batch * s * features, "gathered": 4 * 2 * batch * seq_len * features,
            "scores": 4 * batch * s * seq_len + s * seq_len}


def formula_bytes(seq_len: int, cp: int, params: int, batch: int = BATCH, features: int = FEATURES) -> dict:
    """Payload per rank and step: K and V gathered forward and reduce-scattered backward (4 (cp-1) B s F floats), the
    positions gathered ((cp-1) s int64), the weights' gradients all-reduced over cp (2 (cp-1)/cp of them)."""
    s = seq_len // cp
    return {"activations": 4 * 4 * (cp - 1) * batch * s * features + 8 * (cp - 1) * s,
            "gradients": round(4 * 2 * (cp - 1) / cp * params)}


def causal_pairs(seq_len: int, cp: int, balanced: bool) -> list[int]:
    """Per rank, the (query, key) pairs a causal mask keeps: sum over its positions p of p + 1."""
    return [int((reference.positions(seq_len, cp, r, balanced) + 1).sum()) for r in range(cp)]


@contextlib.contextmanager
def saved_bytes(exclude):
    """{"bytes": ...} filled with the bytes of every storage autograd saves inside, each once."""
    import torch
    seen, out = set(), {"bytes": 0}
    skip = {p.untyped_storage().data_ptr() for p in exclude}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen and ptr not in skip:
            seen.add(ptr)
            out["bytes"] += t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield out


@contextlib.contextmanager
def counted_payload():
    """{"activations": bytes, "gradients": bytes} handed to torch.distributed inside (see the module docstring)."""
    import torch.distributed as dist
    out = {"activations": 0, "gradients": 0}
    real = {name: getattr(dist, name) for name in ("all_gather", "reduce_scatter", "all_reduce")}
    size = lambda t: t.numel() * t.element_size()   # noqa: E731

    def counted(name, kind, payload):
        def call(*args, group=None, **kw):
            out[kind] += payload(*args, dist.get_world_size(group))
            return real[name](*args, group=group, **kw)
        return call
    for name, kind, payload in (("all_gather", "activations", lambda parts, t, n: sum(map(size, parts)) - size(t)),
                                ("reduce_scatter", "activations", lambda t, parts, n: sum(map(size, parts)) - size(t)),
                                ("all_reduce", "gradients", lambda t, n: round(2 * (n - 1) / n * size(t)))):
        setattr(dist, name, counted(name, kind, payload))
    try:
        yield out
    finally:
        for name, fn in real.items():
            setattr(dist, name, fn)


def one_step(net, x, y, pos, group):
    """Forward and backward on this rank's tokens; the grads averaged over the cp group. (saved, payload) bytes."""
    import torch.distributed as dist
    import torch.nn.functional as F
    params = list(net.parameters())
    with counted_payload() as payload:
        with saved_bytes(params) as saved:
            out = forward(net, x[:, pos], lambda q, k, v: reference.cp_attention(q, k, v, pos, group))
        F.mse_loss(out, y[:, pos]).backward()
        cp = dist.get_world_size(group)
        for p in params:
            dist.all_reduce(p.grad, group=group)
            p.grad /= cp
    return saved["bytes"], payload


def measure(seq_lens) -> list[dict]:
    import torch
    import torch.distributed as dist
    rank, rows = dist.get_rank(), []
    for cp in (1, 2, 4):
        group = dist.new_group(list(range(cp)))
        if rank >= cp:
            continue
        for seq_len in seq_lens:
            net = model(FEATURES, 1).float()
            g = torch.Generator().manual_seed(seq_len)
            x, y = (torch.randn(BATCH, seq_len, FEATURES, generator=g) for _ in range(2))
            pos = reference.positions(seq_len, cp, rank, balanced=True)
            saved, payload = one_step(net, x, y, pos, group)
            params = sum(p.numel() for p in net.parameters())
            rows.append({"cp": cp, "seq_len": seq_len, "rank": rank, "saved": saved, "payload": payload,
                         "formula_memory": formula_memory(seq_len, cp), "formula_bytes": formula_bytes(
                             seq_len, cp, params)})
    return rows


def main(argv=None):
    import torch.distributed as dist
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-lens", default="64,128,256")
    a = p.parse_args(argv)
    rank, world = gridrun.start()
    rows = measure([int(s) for s in a.seq_lens.split(",")])
    everyone = [None] * world
    dist.all_gather_object(everyone, rows)
    if rank == 0:
        for row in sorted((r for rs in everyone for r in rs), key=lambda r: (r["cp"], r["seq_len"], r["rank"])):
            print("@cp " + json.dumps(row), flush=True)
    dist.destroy_process_group()


def parse_output(lines) -> list[dict]:
    return [json.loads(line[4:]) for line in lines if line.startswith("@cp ")]


if __name__ == "__main__":
    main()
