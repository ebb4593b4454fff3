"""Distributed cases: ``unshard_sequence``, ``gather_sequence``, ``cp_attention`` (``ring_attention`` is in
cases_ring). The whole sequence is made in every rank from the setting's seed and rank r of the cp group takes
its shard at the checker's own positions, so a case never builds on the learner's split."""
from course_lib.checking.case import Fail
from course_lib.checking.collectives import Collectives
from course_lib.checking.guard import GROUP_METHODS
from course_lib.cp import reference
from course_lib.tp.numerics import as_tensor, close, diff, judge, rand

B, F = 2, 4


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
    with Collectives() as fwd:
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
    loss = (got * grads[c.r]).sum()
    with Collectives() as bwd:
        loss.backward()
    mine = slice(c.r * s, (c.r + 1) * s)
    want_grad = sum(g[:, mine] for g in grads)
    judge(t.grad, want_grad, "backward of gather_sequence must return the sum over the group of this rank's slice", [
        (grads[c.r][:, mine], "gather without its backward: the input's gradient is only this rank's own slice of "
                              "its gradient; every rank's queries used these keys, so backward must sum the slice "
                              "over the group (reduce-scatter: dist.reduce_scatter of grad_output's cp chunks)"),
        (want_grad / c.cp, "backward of gather_sequence averages over the group; it must sum (the gradient of a copy "
                           "used on cp ranks is the sum of the cp gradients)")] if c.cp > 1 else (),
        "backward of gather_sequence: no gradient reached the input")
    if c.cp > 1:
        _gather_traffic(c, fwd, "forward", "an all-gather", "dist.all_gather of the shards", t.nbytes)
        _gather_traffic(c, bwd, "backward", "a reduce-scatter", "dist.reduce_scatter of grad_output's cp slices "
                                                                "(this rank gets the sum of its own)", t.nbytes)
    return None


def _gather_traffic(c, lib, way, right, how, shard):
    """What one rank sends in a ring for the collectives gather_sequence called one way (``Collectives``, measured
    where they reach the process group): an all-gather of the shards, or a reduce-scatter of the slices of the
    whole gradient, sends cp-1 shards. An all-reduce of a zero-padded whole sends 2(cp-1)/cp of the whole, twice
    that. Judged from half a shard more on (a few bytes of bookkeeping pass)."""
    need, sent = (c.cp - 1) * shard, lib.ring_bytes(c.cp)
    if sent >= need + shard // 2:
        calls = ", ".join(f"{name} of {size} bytes" for name, _, size in lib.calls)
        reduced = any(name.startswith("all_reduce") for name, *_ in lib.calls)
        raise Fail(f"{way} of gather_sequence called {calls}: in a ring a rank sends {sent:.0f} bytes for that, "
                   f"{sent / need:.3g} times the {need} bytes of {right} (cp-1 = {c.cp - 1} x {shard} bytes); "
                   f"gather_sequence's {way} is {right}, {how}"
                   + (": an all-reduce of the whole [B, cp*s, F] tensor sends about twice that, 2(cp-1)/cp of the "
                      "whole against (cp-1)/cp" if reduced else ""))


def _inputs(c, balanced):
    seq_len = 4 * c.cp                              # divisible by 2*cp: equal shards in both splits
    full = [rand(c.seed + 20 + i, B, seq_len, F) for i in range(3)]
    pos = reference.positions(seq_len, c.cp, c.r, balanced)
    return seq_len, full, pos


def case_attention(c, balanced):
    fn = c.need("cp_attention")
    seq_len, full, pos = _inputs(c, balanced)
    q, k, v = (t[:, pos].clone().requires_grad_() for t in full)
    with _AllGathered(c.mod) as gathered:
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
    _gathered_bytes(c, gathered.bytes, k, v, where)
    _other_bytes(c, gathered, q, where)
    return None


def _gathered_bytes(c, sent, k, v, where):
    """Each rank computes its own queries' rows, so its forward all-gathers only k and v (and the positions, not
    floating point). Judged from half a k block more on, so that a float copy of the positions beside them passes:
    q or the output gathered as well is a whole block more."""
    need = k.nbytes + v.nbytes
    if c.cp > 1 and sent >= need + k.nbytes // 2:
        raise Fail(f"{where}: cp_attention gave {sent} bytes of floating-point tensors to all-gathers in forward; "
                   f"the keys and values need only this rank's k and v, {need} bytes: each rank computes only its "
                   f"own queries' rows, so gather k and v (and the positions), not q, and compute no other rank's "
                   f"output")


def _other_bytes(c, given, q, where):
    """Besides gather_sequence's (judged in its own case), cp_attention needs no collective of floating-point
    tensors: the queries it attends with are its own shard. Judged from half a q block on (as above)."""
    sent = sum(given.other.values())
    if c.cp > 1 and sent >= q.nbytes // 2:
        calls = ", ".join(f"{n} bytes of floating-point tensors to {name}" for name, n in given.other.items())
        raise Fail(f"{where}: cp_attention gave {calls} in forward, besides gather_sequence's gathers of k and v "
                   f"(the whole sequence's queries are {c.cp * q.nbytes} bytes): the queries it attends with are "
                   f"its own shard only, q as given; it computes only its own queries' rows, so it needs no other "
                   f"rank's queries (unshard_sequence is for logging a whole output, not for attention): gather k "
                   f"and v (and the positions), nothing else")


class _AllGathered:
    """``with _AllGathered(mod) as g:`` -> ``g.bytes``: the floating-point bytes this rank gave to all-gathers;
    ``g.other``: {collective: floating-point bytes} given to every other collective outside ``mod``'s
    gather_sequence (whose own traffic is its case's to judge). Measured where every collective reaches gloo (the
    ProcessGroup's methods, whatever wraps them)."""
    NAMES = ("allgather", "_allgather_base", "allgather_coalesced", "allgather_into_tensor_coalesced")
    IN_PLACE = ("allreduce", "allreduce_coalesced", "broadcast", "reduce")   # the tensors given: the first argument

    def __init__(self, mod):
        self.mod, self.bytes, self.other, self._inside = mod, 0, {}, 0

    def __enter__(self):
        import torch.distributed.distributed_c10d as c10d
        self._cls = c10d.ProcessGroup
        self._real = {n: vars(self._cls)[n] for n in GROUP_METHODS if n in vars(self._cls)}
        for name, real in self._real.items():
            setattr(self._cls, name, self._metered(name, real))
        self._gather = gather = getattr(self.mod, "gather_sequence", None)

        def gather_sequence(*args, **kwargs):
            self._inside += 1
            try:
                return gather(*args, **kwargs)
            finally:
                self._inside -= 1
        if callable(gather):
            self.mod.gather_sequence = gather_sequence
        return self

    def _metered(self, method, real):
        def metered(pg, *args, **kwargs):
            given = args[0] if method in self.IN_PLACE else args[1] if len(args) > 1 else None
            n = _float_bytes(given)
            if method in self.NAMES:
                self.bytes += n
            elif n and not self._inside:
                self.other[GROUP_METHODS[method]] = self.other.get(GROUP_METHODS[method], 0) + n
            return real(pg, *args, **kwargs)
        return metered

    def __exit__(self, *exc):
        for name, real in self._real.items():
            setattr(self._cls, name, real)
        if callable(self._gather):
            self.mod.gather_sequence = self._gather
        return False


def _float_bytes(x) -> int:
    """The bytes of the floating-point tensors in ``x`` (a tensor, or lists of them, as ProcessGroup methods take)."""
    import torch
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size() if x.is_floating_point() else 0
    return sum(map(_float_bytes, x)) if isinstance(x, (list, tuple)) else 0


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
