"""The ZeRO-1 / ZeRO-2 case of ``course check zero``: the learner's ZeroOptimizer against torch's own DDP, step by
step, with SGD + momentum (a gradient scaled by a constant shows) then AdamW (the state ZeRO shards); measured on
every rank: the optimizer state, the bytes held and sent (measure.py).
"""
import copy

from course_lib.checking.case import Fail, flat, need
from course_lib.checking.collectives import Collectives
from course_lib.checking.p2p import P2PMeter
from course_lib.zero import measure

STEPS = 3
ATOL = 1e-9
SLACK = 256          # bytes: the optimizers' per-parameter step counters are not sharded


def make_model():
    """10 -> 7 -> 3: 101 elements in 4 parameter tensors, not divisible by 2, 3 or 4: the shards differ in size."""
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).double()


def batch(step, rank):
    import torch
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 10, generator=g, dtype=torch.float64), torch.randn(4, 3, generator=g, dtype=torch.float64)


def optimizers():
    import torch
    return [("SGD(momentum=0.9)", torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
            ("AdamW", torch.optim.AdamW, {"lr": 0.01})]


def diagnose(c, before, after, want, shards, step, opt_name):
    """Why the learner's parameters differ from DDP's after ``step``, or None when they do not."""
    import torch
    bad = ~torch.isclose(after, want, rtol=0, atol=ATOL)
    if not bad.any():
        return None
    label = f"step {step + 1} with {opt_name}, rank {c.r}"
    a0, b0 = shards[c.r]
    mine = torch.zeros_like(bad)
    mine[a0:b0] = True
    if not bad[mine].any() and torch.equal(after[~mine], before[~mine]):
        return (f"{label}: only this rank's shard ({a0}..{b0}) of the parameters was updated, the rest kept their "
                "old values: all-gather the updated shards into every rank's parameters after the step")
    d_mine, d_ref = after - before, want - before
    if step == 0 and opt_name.startswith("SGD") and float(d_ref.norm()) > 0:
        ratio = float(d_mine @ d_ref / (d_ref @ d_ref))
        if abs(ratio * c.world - 1) < 1e-3:
            return f"{label}: the update is 1/W = 1/{c.world} of DDP's: the gradient is divided by W twice"
        if abs(ratio - c.world) < 1e-3 * c.world:
            return f"{label}: the update is W = {c.world} times DDP's: DDP averages the gradients; divide the sum by W"
    idx = bad.nonzero().reshape(-1)
    owned = torch.zeros_like(bad)
    for lo, hi in shards:
        owned[lo:hi] = True
    orphan = "" if owned[idx].any() else ("; these elements belong to no rank's shard (shard_range), so no rank "
                                          "updates them")
    return (f"{label}: {len(idx)} of the {len(bad)} parameter elements differ from DDP's (elements "
            f"{int(idx[0])}..{int(idx[-1])},"
            f" largest difference {float((after - want).abs().max()):.3g}){orphan}")


def _zero(c, stage, opt_cls, kw, collectives, model):
    Z = need(c.mod, "ZeroOptimizer", "zero.py")
    zero = Z(model.parameters(), opt_cls, stage=stage, collectives=collectives, **c.kw, **kw)
    if getattr(zero, "optimizer", None) is None or not hasattr(zero.optimizer, "state"):
        raise Fail("ZeroOptimizer has no `.optimizer` (the inner torch optimizer over this rank's shard): "
                   "the checker measures its state there")
    return zero


def _one_step(c, ref, ref_opt, mine, zero, step):
    """One step of both; returns (learner's collective counts, full-size gradient bytes left after step, what the
    learner's side holds after step (measure.held), what it sent: (bytes handed to point-to-point sends, the library
    collectives that ran (checking.collectives.Collectives)))."""
    import torch.nn.functional as F
    x, y = batch(step, c.rank)
    F.mse_loss(ref(x), y).backward()
    ref_opt.step()
    ref_opt.zero_grad()
    F.mse_loss(mine(x), y).backward()
    c.take_counts()
    with P2PMeter() as sent, Collectives() as lib, measure.NewTensors() as made:
        zero.step()
    counts = c.take_counts()
    left = sum(measure.nbytes(p.grad) for p in mine.parameters())
    params = list(mine.parameters())
    held = measure.held({"zero": zero, "model": mine}, params)
    held.update(measure.kept_elsewhere(made.tensors, held, params))
    zero.zero_grad()
    return counts, left, held, (sent.bytes, lib)


def _stage2_problem(left, total_bytes):
    if left:
        return (f"stage 2 keeps the full-size gradients after step() ({left} of {total_bytes} bytes on this rank): "
                "once reduce-scattered, free them (p.grad = None); the shard's gradient is all a rank needs")
    return None


def _stage1_problem(left):
    # the exercise: stage 1 shards the optimizer state only; freeing the full-size gradients is what stage 2 adds
    if left:
        return None
    return ("stage 1 freed the full-size gradients in step(): that is stage 2's job (the exercise: stage 2 *also* "
            "shards the gradients, freeing the full-size ones); with stage=1 leave p.grad as backward made it, so "
            "that ZeRO-1 and ZeRO-2 differ as they should")


# the work of a step: one reduce-scatter and one all-gather; a reduce or a broadcast per shard (W of them) does the
# same work with the same bytes, so those are counted as pieces of them
FAMILIES = (("reduce_scatter", "reduce_scatter", 1), ("all_gather", "all_gather", 1), ("reduce", "reduce", None),
            ("broadcast", "broadcast", None))


def other_collectives(c, lib):
    """None when the library collectives step() ran (``lib``: checking.collectives.Collectives) are at most one
    reduce-scatter, one all-gather and a reduce and a broadcast per rank; else the ones beyond, named."""
    counts, extra = {}, []
    for name, numel, size in lib.calls:
        family, most = next(((f, m) for prefix, f, m in FAMILIES if name.startswith(prefix)), (None, 0))
        counts[family] = counts.get(family, 0) + 1
        if family is None or counts[family] > (most or c.world):
            extra.append(f"dist.{name} of {numel} element{'s' * (numel != 1)} ({size:,} B)")
    if not extra:
        return None
    return (f"rank {c.r}: step() ran {', '.join(extra)} besides the reduce-scatter and the all-gather: a ZeRO step "
            "needs only those two (the gradients reduce-scattered, the updated shards all-gathered into every "
            "rank's parameters, which leaves them equal on every rank); remove the extra collective")


def held_problem(c, stage, held, n, elem, ddp_state):
    """Bytes held after step() beyond the parameters against ZeRO's count (Rajbhandari et al., 2020, sec. 5):
    stage 1: the full gradient (n), this rank's shard and its gradient (2 n/W) and the optimizer state of the shard
    (DDP's state / W); stage 2 the same without the full gradient. None when within it."""
    per = -(-n // c.world)
    allowed = (n * elem if stage == 1 else 0) + 2 * per * elem + ddp_state * per // n + SLACK
    total = sum(b for b, _, _ in held.values())
    if total <= allowed:
        return None, total
    grads = "the full gradient (n), " if stage == 1 else ""
    return (f"ZeRO-{stage} on rank {c.r} holds {total:,} B of tensors beyond the parameters after step(); its "
            f"count is {allowed:,} B ({grads}this rank's shard and its gradient (2 n/W), the shard's optimizer "
            f"state (DDP's / W), n = {n} elements of {elem} B, W = {c.world}). The largest: {measure.largest(held)}: "
            "a full-size tensor kept after step() is memory ZeRO exists to free; keep only the shard's (a flat "
            "buffer the parameters are views into is not counted: it is the parameters)"), total


def state_over(mine: int, ddp: int, n: int, world: int) -> bool:
    """More optimizer state than the shard's share of DDP's (about 1/W)."""
    return mine > ddp * -(-n // world) / n + SLACK


def sent_problem(c, sent, n, elem):
    """Bytes sent in one step against the rings' count: reduce-scatter and all-gather each send W-1 chunks of at
    most ceil(n/W) elements, 2 (W-1)/W n in all, what DDP's ring all-reduce sends. ``sent``: (bytes handed to
    point-to-point sends, checking.collectives.Collectives), the library's counted as a ring sends them."""
    p2p, lib = sent
    total = p2p + lib.ring_bytes(c.world)
    allowed = 2 * (c.world - 1) * -(-n // c.world) * elem
    if total <= allowed * (1 + 1e-9):
        return None, total
    calls = [f"dist.{name} of {k} elements ({b:,} B)" for name, k, b in lib.calls]
    measured = "; ".join(([f"{p2p:,} B handed to point-to-point sends"] if p2p else []) + calls)
    # the step needs one reduce-scatter and one all-gather; an all-reduce may stand in for either (of gradients or
    # of zero-padded parameters): the sizes alone do not say which, so the hint names both
    hint = (" An all-reduce of a tensor sends twice what a reduce-scatter or an all-gather of it does, and a step "
            "needs one of each: the gradient reduce-scattered (each rank receives only its shard's sum), then the "
            "updated shards all-gathered" if any(
                name.startswith("all_reduce") for name, _, _ in lib.calls) else "")
    return (f"rank {c.r} sent {total:,.0f} B in one step() (measured: {measured}; the library's collectives counted "
            f"as a ring sends them: an all-reduce 2 (W-1)/W of its bytes, the others (W-1)/W); a reduce-scatter and "
            f"an all-gather of the {n} elements send at most {allowed:,} B (2 (W-1)/W n elements of {elem} B, "
            f"W = {c.world}): the same as DDP's all-reduce, and ZeRO-1/2 must not send more "
            f"({total / allowed:.1f}x here).{hint}"), total


def run_optimizer(c, stage, opt_name, opt_cls, kw, collectives):
    """Train DDP and the learner's ZeroOptimizer side by side; returns (state bytes mine, DDP's, figures of what
    was measured: the collectives that ran, the bytes held and sent at most in one step)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = make_model()
    ref = DDP(copy.deepcopy(model))
    ref_opt = opt_cls(ref.parameters(), **kw)
    mine = copy.deepcopy(model)
    seen = {"ran": {}, "held": 0, "sent": 0}
    try:
        zero = _zero(c, stage, opt_cls, kw, collectives, mine)
        n = sum(p.numel() for p in mine.parameters())
        elem = next(mine.parameters()).element_size()
        shards = c.shards(n)
        for step in range(STEPS):
            before = flat(mine.parameters())
            counts, left, held, sent = _one_step(c, ref, ref_opt, mine, zero, step)
            for name, k in counts.items():
                seen["ran"][name] = seen["ran"].get(name, 0) + k
            problem = diagnose(c, before, flat(mine.parameters()), flat(ref.parameters()), shards,
                               step, opt_name)
            if problem is None:
                problem = _stage2_problem(left, elem * n) if stage == 2 else _stage1_problem(left)
            if problem is None and not state_over(measure.state_bytes(zero.optimizer), measure.state_bytes(ref_opt),
                                                  n, c.world):   # that has its own message
                problem, total = held_problem(c, stage, held, n, elem, measure.state_bytes(ref_opt))
                seen["held"] = max(seen["held"], total)
                if problem is None:
                    problem, total = sent_problem(c, sent, n, elem)
                    seen["sent"] = max(seen["sent"], round(total))
                    problem = problem or other_collectives(c, sent[1])
            c.agree_or_fail(problem)
        return measure.state_bytes(zero.optimizer), measure.state_bytes(ref_opt), seen
    finally:
        del ref   # drop the DDP model before the process group goes (gloo: a live DDP model can abort the exit)


def ran_text(collectives, ran: dict) -> str:
    """Which collectives the learner's ZeroOptimizer really used: counted while its step() ran, not assumed from
    the ``collectives`` it was given."""
    if not ran:
        return "on your own collectives: no torch collective ran in step()"
    names = ", ".join(f"dist.{name}" for name in sorted(ran))
    if collectives == "mine":
        return (f"on {names}, which step() called directly although it was given collectives=\"mine\": "
                "not on your own reduce_scatter and all_gather")
    return f"on the library's collectives ({names})"


def float32_problem(c, stage, collectives):
    """What one SGD step() sends with the model in float32 against the count for 4-byte elements, or None: the float64
    runs sent within theirs, so more here comes from the size of the elements sent."""
    import torch
    import torch.nn.functional as F
    model = make_model().float()
    zero = _zero(c, stage, torch.optim.SGD, {"lr": 0.1}, collectives, model)
    x, y = batch(0, c.rank)
    F.mse_loss(model(x.float()), y.float()).backward()
    with P2PMeter() as p2p, Collectives() as lib:
        zero.step()
    c.take_counts()
    problem, _ = sent_problem(c, (p2p.bytes, lib), sum(p.numel() for p in model.parameters()), 4)
    return problem and (f"with the model in float32 (the same step() sent no more than its count in float64): "
                        f"{problem} Send the gradients and parameters in their own dtype: converted to float64 "
                        "they cost twice the bytes")


def case_zero(c, stage):
    collectives = c.collectives()
    figures, ran, held, sent = [], {}, 0, 0
    for opt_name, opt_cls, kw in optimizers():
        mine, ddp, seen = run_optimizer(c, stage, opt_name, opt_cls, kw, collectives)
        c.agree_or_fail(f"optimizer state on rank {c.r}: {mine} bytes with {opt_name}, DDP's optimizer holds {ddp} "
                        f"(ratio {mine / ddp:.2f}; ZeRO: about 1/W = {1 / c.world:.2f}): build the inner optimizer "
                        "over this rank's shard only, not over the whole model" if state_over(mine, ddp, 101, c.world)
                        else None)
        figures.append((opt_name, mine, ddp))
        ran.update(seen["ran"])
        held, sent = max(held, seen["held"]), max(sent, seen["sent"])
    c.agree_or_fail(float32_problem(c, stage, collectives))
    ratios = ", ".join(f"{name.split('(')[0]} {m}/{d} B = {m / d:.2f}" for name, m, d in figures)
    measured = f"held after step() beyond the parameters: at most {held:,} B"
    measured += f"; sent in one step(): at most {sent:,} B"
    return (f"equals DDP within {ATOL:g} for {STEPS} steps with SGD(momentum) and AdamW ({ran_text(collectives, ran)})"
            f"; optimizer state on rank {c.r}: {ratios} of DDP's; {measured}"), {
                "ratio": figures[-1][1] / figures[-1][2], "collectives": collectives, "ran": sorted(ran),
                "held": held, "sent": sent}
