"""Distributed cases: ``unshard_sequence``, ``gather_sequence``, ``cp_attention``, ``ring_attention``. The whole
sequence is made in every rank from the setting's seed and rank r of the cp group takes its shard at the checker's
own positions, so a case never builds on the learner's split."""
import contextlib

from course_lib.checking.case import Fail
from course_lib.checking.p2p import RECV, P2PMeter
from course_lib.cp import reference
from course_lib.tp.numerics import as_tensor, close, diff, judge, rand

B, F = 2, 4
USED = "block_attention"   # in P2PMeter.events: a block went into the attention


def _mode(balanced):
    return "balanced split" if balanced else "plain split"


def case_unshard(c, balanced):
    fn = c.need("unshard_sequence")
    seq_len = 4 * c.cp + 1                        # divisible by neither cp (> 1) nor 2*cp
    full = rand(c.seed + 1, B, seq_len, F)
    pos = reference.positions(seq_len, c.cp, c.r, balanced)
    got = as_tensor(fn(full[:, pos].clone(), pos.clone(), seq_len, **c.kw), "unshard_sequence")
    if close(got, full):
        return None
    where = f"seq_len={seq_len}, cp={c.cp}, {_mode(balanced)}"
    if got.shape == full.shape:
        per_token = (got - full).abs().amax(dim=(0, 2))
        zero = [t for t in range(seq_len) if per_token[t] > 1e-10 and float(got[:, t].abs().max()) == 0]
        if zero:
            raise Fail(f"{where}: tokens {zero} are lost (zeros): each rank's shard goes at its own `positions`, "
                       f"and shards need not have the same size")
        twice = [t for t in range(seq_len) if close(got[:, t], 2 * full[:, t]) and per_token[t] > 1e-10]
        if twice:
            raise Fail(f"{where}: tokens {twice} are counted twice (twice their value)")
    raise Fail(f"{where}: the result differs from the whole sequence; {diff(got, full)}")


def case_gather(c):
    import torch
    fn = c.need("gather_sequence")
    s = 3
    parts = [rand(c.seed + 10 + r, B, s, F) for r in range(c.cp)]
    t = parts[c.r].clone().requires_grad_()
    got = as_tensor(fn(t, **c.kw), "gather_sequence")
    want = torch.cat(parts, dim=1)
    c.agree_or_fail(None if close(got.detach(), want) else
                    f"forward of gather_sequence must concatenate every rank's shard along dim 1 in rank order "
                    f"([B, cp*s, F]); {diff(got.detach(), want)}")
    if not got.requires_grad:
        raise Fail("gather_sequence's output does not require grad: a plain dist.all_gather has no backward, so the "
                   "keys' and values' gradients never reach the other ranks; write a torch.autograd.Function (call "
                   "it with .apply) whose backward reduce-scatters")
    grads = [rand(c.seed + 100 + r, B, c.cp * s, F) for r in range(c.cp)]   # rank r's upstream gradient
    (got * grads[c.r]).sum().backward()
    mine = slice(c.r * s, (c.r + 1) * s)
    want_grad = sum(g[:, mine] for g in grads)
    judge(t.grad, want_grad, "backward of gather_sequence must return the sum over the group of this rank's slice", [
        (grads[c.r][:, mine], "gather without its backward: the input's gradient is only this rank's own slice of "
                              "its gradient; every rank's queries used these keys, so backward must sum the slice "
                              "over the group (reduce-scatter: dist.reduce_scatter of grad_output's cp chunks)"),
        (want_grad / c.cp, "backward of gather_sequence averages over the group; it must sum (the gradient of a copy "
                           "used on cp ranks is the sum of the cp gradients)")] if c.cp > 1 else (),
        "backward of gather_sequence: no gradient reached the input")


def _inputs(c, balanced):
    seq_len = 4 * c.cp                              # divisible by 2*cp: equal shards in both splits
    full = [rand(c.seed + 20 + i, B, seq_len, F) for i in range(3)]
    pos = reference.positions(seq_len, c.cp, c.r, balanced)
    return seq_len, full, pos


def case_attention(c, balanced):
    fn = c.need("cp_attention")
    seq_len, full, pos = _inputs(c, balanced)
    q, k, v = (t[:, pos].clone().requires_grad_() for t in full)
    out = as_tensor(fn(q, k, v, pos.clone(), **c.kw), "cp_attention")
    serial_in = [t.clone().requires_grad_() for t in full]
    serial = reference.serial(*serial_in)
    where = f"seq_len={seq_len}, cp={c.cp}, {_mode(balanced)}, this rank's positions {pos.tolist()}"
    c.agree_or_fail(_forward_problem(c, out, serial, full, pos, where, balanced))
    upstream = rand(c.seed + 30, B, seq_len, F)
    (out * upstream[:, pos]).sum().backward()
    (serial * upstream).sum().backward()
    local_loss = [t.clone().requires_grad_() for t in full]
    (reference.serial(*local_loss)[:, pos] * upstream[:, pos]).sum().backward()
    for name, got, want, own in zip("qkv", (q.grad, k.grad, v.grad), serial_in, local_loss):
        judge(got, want.grad[:, pos], f"{where}: {name}.grad differs from one process", [
            (own.grad[:, pos], f"{where}: gather without its backward: {name}.grad holds only what this rank's "
                               f"queries contributed; the other ranks' queries used these keys and values too, so "
                               f"the gather's backward must reduce-scatter")] if c.cp > 1 else (),
            f"{where}: {name}.grad is None: the gather of k and v must be differentiable (gather_sequence, not a "
            f"bare dist.all_gather)")
    return None


def _forward_problem(c, out, serial, full, pos, where, balanced):
    """What is wrong with cp_attention's output on this rank, or None."""
    import torch
    seq_len = serial.shape[1]
    if close(out.detach(), serial.detach()[:, pos]):
        return None
    gathered = [torch.cat([t[:, reference.positions(seq_len, c.cp, r, balanced)] for r in range(c.cp)], 1)
                for t in full[1:]]
    local = reference.attention(full[0][:, pos], *gathered, torch.arange(pos.numel()), torch.arange(seq_len))
    if close(out.detach(), local):
        return (f"{where}: the causal mask is taken at local indices (query i of the shard against key j of the "
                f"gathered keys): the query at global position p sees the keys at global positions <= p; compare "
                f"`positions` with the gathered keys' positions (all-gather them too)")
    return f"{where}: the output differs from causal attention in one process; {diff(out.detach(), serial[:, pos])}"


def _ring_peers(c, p2p, where):
    """In a ring a rank sends only to the next rank and receives only from the previous one, one block at a time,
    so that it holds at most two key/value blocks; exchanging blocks with every rank holds all cp of them, the memory
    ring attention exists to save. (At cp = 2 the next rank is the previous one: only cp >= 3 shows it.)"""
    me = c.r
    nxt, prev = (me + 1) % c.cp, (me - 1) % c.cp
    if p2p.off_ring(me, c.cp):
        raise Fail(f"{where}: rank {me} of the cp group sent to ranks {sorted(p2p.sent_to, key=str)} and received "
                   f"from {sorted(p2p.received_from, key=str)}; in a ring each rank sends only to the next (rank "
                   f"{nxt}) and receives only from the previous (rank {prev}), one block per step, so that it holds "
                   f"at most two key/value blocks: exchanging blocks with every rank holds all {c.cp}")


def _ring_holds(c, p2p, where):
    """What the peers cannot show: a ring that first receives every block and only then computes holds all cp of
    them too. Each call of the file's block_attention uses a block; a ring uses each one as it arrives, so it never
    has two received blocks waiting. Judged when every block went through block_attention and every receive was
    waited for (a receive counts when its wait returns); only cp >= 3 has two blocks to receive."""
    recvs = sum(1 for kind, *_ in p2p.events if kind == RECV)
    if (c.cp < 3 or p2p.unwaited or recvs % (c.cp - 1)
            or sum(1 for kind, *_ in p2p.events if kind == USED) < c.cp):
        return
    per_block, waiting, most = recvs // (c.cp - 1), 0, 0
    for kind, *_ in p2p.events:
        if kind == RECV:
            waiting += 1
            most = max(most, -(-waiting // per_block))
        elif kind == USED:
            waiting = max(0, waiting - per_block)
    if most >= 2:
        raise Fail(f"{where}: rank {c.r} of the cp group received {most} key/value blocks before it used one of them "
                   f"(block_attention); a ring computes with each block as it arrives and then passes it on, so "
                   f"that it holds at most two: receiving them all first holds all {c.cp}, the memory ring "
                   f"attention exists to save")


@contextlib.contextmanager
def _noting_uses(mod, events: list):
    """The file's block_attention, each call noted in ``events`` (ring_attention looks it up at each call)."""
    real = getattr(mod, "block_attention", None)

    def block_attention(*args, **kwargs):
        events.append((USED, None, None))
        return real(*args, **kwargs)
    if real is not None:
        mod.block_attention = block_attention
    try:
        yield
    finally:
        if real is not None:
            mod.block_attention = real


def case_ring(c, balanced):
    import torch
    fn = c.need("ring_attention")
    seq_len, full, pos = _inputs(c, balanced)
    with torch.no_grad():
        blocks = [[t[:, reference.positions(seq_len, c.cp, r, balanced)] for t in full[1:]]
                  + [reference.positions(seq_len, c.cp, r, balanced)] for r in range(c.cp)]
        c.take_counts()
        with P2PMeter() as p2p, _noting_uses(c.mod, p2p.events):
            out = as_tensor(fn(*(t[:, pos].clone() for t in full), pos.clone(), **c.kw), "ring_attention")
        used = {k: n for k, n in c.take_counts().items() if n}
        want = reference.serial(*full)[:, pos]
        where = f"seq_len={seq_len}, cp={c.cp}, {_mode(balanced)}"
        if used:
            raise Fail(f"{where}: ring_attention called {', '.join(f'{n} x {k}' for k, n in used.items())}: pass the "
                       f"key/value blocks around the ring with send/recv (isend/irecv), no collective")
        _ring_peers(c, p2p, where)
        _ring_holds(c, p2p, where)
        judge(out, want, f"{where}: the output differs from causal attention in one process", [
            (reference.ring_order(full[0][:, pos], blocks, c.r, reference.average),
             f"{where}: ring attention without the log-sum-exp correction: the partial results are averaged; merge "
             f"them with merge_partials (weights exp(lse_x - lse))")] if c.cp > 1 else ())
        return None
