"""The cases of ``course check pp`` (course_lib.checking runs them), on p = 2 and 4 real gloo ranks, one stage per
rank, a model of 2p blocks (Linear + Tanh, width 6, float64) cut into p stages:

- ``communicate``: forward along the chain, backward along it, then 1F1B's steady-state exchange (stage s sends an
  activation to s+1 while s+1 sends a gradient to s): what each stage receives is what its neighbour sent, of
  ``pipe.shape``; a blocking send first deadlocks there, and the harness names each rank's line in seconds;
- ``forward_step`` / ``backward_step`` on each rank alone: the output (the last stage: the loss divided by m), x's
  gradient, and the parameters' gradients accumulated over two micro-batches;
- ``afab`` / ``one_f_one_b`` (cases_schedule.py): the learner's schedule, with their communicate, forward_step and
  backward_step watched, against one process with the whole batch (loss and every gradient), plus the order of
  forwards and backwards on each stage and the micro-batches in flight (1F1B: warm-up p - stage - 1, at most
  p - stage held at once).
"""
from __future__ import annotations

import functools

from course_lib import checking
from course_lib.checking import case as harness
from course_lib.checking.case import Case, Fail, need
from course_lib.checking.learner import explain
from course_lib.pp import pipe as pp
from course_lib.pp.cases_schedule import case_schedule

FILE = LOAD_ITEM = "pp.py"
ITEMS = ("communicate", "forward_step", "backward_step", "afab", "one_f_one_b")
WORLDS = (2, 4)
CASE_TIMEOUT = 15.0
STOP_ITEM = FRESH_AFTER_FAILURE = True
COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "barrier", "all_to_all", "all_to_all_single", "scatter", "gather")
GUARD = (COLLECTIVES, "forbid")
BUILT_ON = {"afab": ITEMS[:3], "one_f_one_b": ITEMS[:3]}
WIDTH, MICRO = 6, 2
HANG_HINTS = {None: "with gloo a send waits for its matching receive. In 1F1B's steady state stage s sends an "
                    "activation to s+1 while s+1 sends a gradient back to s: if both send first, each waits for the "
                    "other's receive. In communicate post every send and receive at once (dist.P2POp + "
                    "dist.batch_isend_irecv, then wait on each request), and check that every send has a receive "
                    "on the stage it names",
              "one_f_one_b": "in the steady state stage s sends y forward while stage s+1 sends a gradient back: "
                             "send y and receive its gradient in ONE communicate(pipe, send_next=y, recv_next=True), "
                             "and check that each stage runs as many forwards (and backwards) as its neighbours "
                             "expect: warm-up p - stage - 1, then m - warm-up steady steps, then the cool-down"}
TOL = dict(rtol=1e-9, atol=1e-12)


def check(path, **options):
    """``course check pp PATH`` from Python: a Report."""
    return checking.check("pp", path, **options)


def cases(world: int) -> list[Case]:
    out = [Case("communicate:chain", "communicate", functools.partial(case_communicate, "chain"),
                f"p={world}, activations forward and gradients back along the chain"),
           Case("communicate:steady", "communicate", functools.partial(case_communicate, "steady"),
                f"p={world}, 1F1B's steady state: stage s sends forward while stage s+1 sends back"),
           Case("forward_step", "forward_step", case_forward, f"p={world}, m=3"),
           Case("backward_step", "backward_step", case_backward, f"p={world}, m=2")]
    for name in ("afab", "one_f_one_b"):
        for m in micro_batches(world):
            out.append(Case(f"{name}:m{m}", name, functools.partial(case_schedule, name, m), f"p={world}, m={m}"))
    return out


def pass_text(item: str, recs) -> str:
    worlds = ", ".join(str(w) for w in dict.fromkeys(r.world for r in recs))
    if item == "communicate":
        return f"p={worlds}: along the chain both ways, and 1F1B's steady-state exchange (both directions at once)"
    return f"p={worlds}: " + next((v["message"] for r in recs for v in r.verdicts.values() if v["message"]), "")


def micro_batches(world: int) -> tuple:
    """More micro-batches than stages (1F1B has a steady state on every stage), then fewer (warm-up cut at m)."""
    return (world + 2,) if world == 2 else (world + 2, 2)


class Ctx(harness.Ctx):
    """The harness's context, with the learner's functions looked up by name in ``FILE``."""

    def need(self, name: str):
        return need(self.mod, name, FILE)

    def explain(self, e: BaseException) -> str:
        """What went wrong, with its line in the learner's file; a stub's NotImplementedError quotes the stub's
        own words (what to write)."""
        return explain(e, self.path, FILE)

    def calling(self, name: str):
        """The learner's ``name``, where a stub's NotImplementedError becomes a verdict that says what to write."""
        fn = self.need(name)

        def call(*args, **kw):
            try:
                return fn(*args, **kw)
            except NotImplementedError as e:
                raise Fail(self.explain(e), kind="todo") from e
        return call


def setting(ctx, m: int):
    """The model, this rank's Pipe, the micro-batches and the serial reference (the same on every rank)."""
    model = pp.make_model(2 * ctx.world, WIDTH)
    xs, ys = pp.make_batch(m, MICRO, WIDTH)
    ref = pp.reference(model, ctx.world, xs, ys)
    return model, pp.make_pipe(model, ctx.world, ctx.rank, m, MICRO), xs, ys, ref


def pattern(sender: int, tag: int):
    """The tensor stage ``sender`` sends in exchange ``tag``: different for every sender and exchange."""
    import torch
    return torch.arange(WIDTH * MICRO, dtype=torch.float64).reshape(MICRO, WIDTH) + 100 * sender + 1000 * tag


def case_communicate(part: str, ctx):
    _, pipe, _, _, _ = setting(ctx, 3)
    fn = ctx.calling("communicate")
    s = ctx.rank
    # 1: activations forward along the chain; 2: gradients backward; 3: 1F1B's steady state, pairs (s, s+1) with
    # s even: s sends forward and receives backward while s+1 does the opposite (then the odd pairs)
    steps = [("forward", dict(send_next=None if pipe.last else pattern(s, 1), recv_prev=not pipe.first)),
             ("backward", dict(send_prev=None if pipe.first else pattern(s, 2), recv_next=not pipe.last))]
    for parity in (0, 1):
        if s % 2 == parity and not pipe.last:
            kw = dict(send_next=pattern(s, 3 + parity), recv_next=True)
        elif s % 2 != parity and not pipe.first:
            kw = dict(send_prev=pattern(s, 3 + parity), recv_prev=True)
        else:
            kw = {}
        steps.append((f"steady state (stage s sends forward while s+1 sends back{', odd s' if parity else ''})", kw))
    for tag, (what, kw) in enumerate(steps, 1):
        if (part == "chain") != (tag <= 2):
            continue
        got = fn(pipe, **kw)
        problem = judge_exchange(got, kw, s, tag, what, pipe)
        ctx.agree_or_fail(problem)
    return ("forward and backward along the chain" if part == "chain"
            else "1F1B's steady-state exchange: both directions at once")


def judge_exchange(got, kw, s, tag, what, pipe) -> str | None:
    import torch
    if not (isinstance(got, tuple) and len(got) == 2):
        return f"communicate must return (from_prev, from_next); it returned {type(got).__name__}"
    for side, asked, peer, t in (("from_prev", kw.get("recv_prev"), s - 1, got[0]),
                                 ("from_next", kw.get("recv_next"), s + 1, got[1])):
        if not asked:
            if t is not None:
                return f"{what}: {side} should be None when it was not asked for"
            continue
        if not isinstance(t, torch.Tensor):
            return f"{what}: stage {s} asked for {side} and got {t!r}"
        if tuple(t.shape) != tuple(pipe.shape):
            return (f"{what}: stage {s} received a tensor of shape {tuple(t.shape)} from stage {peer}, which sent "
                    f"{tuple(pipe.shape)} (pipe.shape): the sent and expected shapes disagree. Allocate each receive "
                    f"buffer as torch.empty(pipe.shape, dtype=pipe.dtype): one micro-batch's activation")
        sent = pattern(peer, tag)
        if not torch.equal(t.to(sent.dtype), sent):
            return (f"{what}: stage {s} received from stage {peer} values that are not what it sent "
                    f"(first elements {t.reshape(-1)[:3].tolist()}, sent {sent.reshape(-1)[:3].tolist()})"
                    f": does {side} come from pipe.{'prev' if side == 'from_prev' else 'next'}?")
    return None


def case_forward(ctx):
    import torch
    model, pipe, xs, ys, ref = setting(ctx, 3)
    fn = ctx.calling("forward_step")
    x = ref.inputs[pipe.stage][1].clone()
    y = fn(pipe, x, ys[1] if pipe.last else None)
    if not isinstance(y, torch.Tensor):
        raise Fail(f"stage {pipe.stage}: forward_step returned {type(y).__name__}, not a tensor")
    if not pipe.first and not x.requires_grad:
        raise Fail(f"stage {pipe.stage}: x does not require its gradient after forward_step: call "
                   f"x.requires_grad_() before the forward, so that backward_step can return x.grad")
    with torch.no_grad():
        out = pipe.module(ref.inputs[pipe.stage][1])
    if pipe.last:
        loss = pp.mse(out, ys[1])
        if torch.allclose(y.detach(), loss, **TOL) and pipe.m > 1:
            raise Fail(f"last stage: forward_step returned the micro-batch's loss {float(loss):.6g}, not divided by "
                       f"the number of micro-batches m = {pipe.m}: the whole batch's loss is the mean of the m "
                       f"micro-batch losses, so each gradient would come out m times too large")
        if not torch.allclose(y.detach(), loss / pipe.m, **TOL):
            raise Fail(f"last stage: forward_step returned {y.detach().reshape(-1)[:3].tolist()}, expected the loss "
                       f"pipe.loss_fn(y, target) / pipe.m = {float(loss / pipe.m):.6g}")
        return "the stage's output; on the last stage the micro-batch's loss / m"
    if tuple(y.shape) != tuple(out.shape) or not torch.allclose(y.detach(), out, **TOL):
        raise Fail(f"stage {pipe.stage}: forward_step's output differs from pipe.module(x)")
    return "the stage's output; on the last stage the micro-batch's loss / m"


def case_backward(ctx):
    import torch
    model, pipe, xs, ys, ref = setting(ctx, 2)
    fn = ctx.calling("backward_step")
    params = list(pipe.module.parameters())
    shares = []
    for i in range(2):
        x = ref.inputs[pipe.stage][i].clone().requires_grad_(not pipe.first)
        y = pipe.module(x)
        y = pp.mse(y, ys[i]) / pipe.m if pipe.last else y
        grad = None if pipe.last else ref.out_grads[pipe.stage][i]
        # this micro-batch's share of every gradient, on its own
        shares.append(torch.autograd.grad(y, params, grad, retain_graph=True))
        want_dx = None if pipe.first else torch.autograd.grad(y, x, grad, retain_graph=True)[0]
        dx = fn(pipe, x, y, grad)
        if pipe.first:
            continue
        if dx is None or tuple(dx.shape) != tuple(want_dx.shape) or not torch.allclose(dx, want_dx, **TOL):
            raise Fail(f"stage {pipe.stage}, micro-batch {i}: backward_step returned "
                       f"{None if dx is None else tuple(dx.shape)}, not x's gradient (x.grad, {tuple(x.shape)}) "
                       f"that the previous stage needs")
    for k, p in enumerate(params):
        total, last = shares[0][k] + shares[1][k], shares[1][k]
        if p.grad is None:
            raise Fail(f"stage {pipe.stage}: a parameter has no .grad after backward_step")
        if not torch.allclose(p.grad, total, **TOL):
            if torch.allclose(p.grad, last, **TOL):
                raise Fail(f"stage {pipe.stage}: after two micro-batches .grad holds the second one's gradient only: "
                           f"backward_step zeroes the gradients between micro-batches (zero_grad or .grad = None). "
                           f"They must accumulate; zero them once per step, before the schedule")
            raise Fail(f"stage {pipe.stage}: after two micro-batches .grad is not the sum of their gradients")
    return "x's gradient back, parameters' gradients accumulated over micro-batches"
