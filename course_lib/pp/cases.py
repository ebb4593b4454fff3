"""The cases of ``course check pp`` (course_lib.checking runs them) on p = 2 and 4 real gloo ranks, one stage per
rank, a model of 2p blocks cut into p stages: ``communicate`` along the chain and in 1F1B's steady-state exchange,
``forward_step`` / ``backward_step`` on each rank alone, then the schedules ``afab`` and ``one_f_one_b``, their
forward_step and backward_step watched (the module's names swapped while the schedule runs) and the result compared
with one process with the whole batch. The watcher tells micro-batches apart by value (against each micro-batch's
serial activation and gradient at this stage), counts those in flight, and notes the first thing out of order but
lets the schedule go on: a rank that stopped would leave its neighbours waiting. What values cannot show is measured:
the tensors each micro-batch leaves alive after its backward and after the step (held.py), the messages each
stage sends and receives, to whom and when against its forwards and backwards (traffic.py, received.py), how
communicate posts them (peers.py; also on a pipeline whose stage s is rank p - 1 - s, as in a dp x pp grid), and
what the schedule returns and leaves (outcome.py)."""
import functools

from course_lib import checking
from course_lib.checking.case import Case, Fail
from course_lib.checking.learner import error_where, explain
from course_lib.checking.p2p import P2PMeter
from course_lib.checking.worker import peer_gone
from course_lib.pp import held, outcome, peers, traffic
from course_lib.pp import pipe as pp

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
                    "dist.batch_isend_irecv), wait on every request it returns, sends included (gloo may drop a "
                    "send whose request is never waited on), and check that every send has a receive on the stage "
                    "it names",
              "one_f_one_b": "in the steady state stage s sends y forward while stage s+1 sends a gradient back: "
                             "send y and receive its gradient in ONE communicate(pipe, send_next=y, recv_next=True), "
                             "and check that each stage runs as many forwards (and backwards) as its neighbours "
                             "expect: warm-up p - stage - 1, then m - warm-up steady steps, then the cool-down"}
TOL = dict(rtol=1e-9, atol=1e-12)
hint = peers.crash_hint
check = functools.partial(checking.check, "pp")   # course check pp PATH, from Python


def cases(world: int) -> list[Case]:
    out = [Case("communicate:chain", "communicate", functools.partial(case_communicate, "chain"),
                f"p={world}, activations forward and gradients back along the chain"),
           Case("communicate:steady", "communicate", functools.partial(case_communicate, "steady"),
                f"p={world}, 1F1B's steady state: stage s sends forward while stage s+1 sends back"),
           Case("communicate:reversed", "communicate", functools.partial(case_communicate, "reversed"),
                f"p={world}, stage s on global rank {world - 1} - s"),
           Case("forward_step", "forward_step", case_forward, f"p={world}, m=3"),
           Case("backward_step", "backward_step", case_backward, f"p={world}, m=2")]
    for name in ("afab", "one_f_one_b"):
        # more micro-batches than stages (1F1B has a steady state on every stage), then fewer (warm-up cut at m)
        for m in (world + 2,) if world == 2 else (world + 2, 2):
            out.append(Case(f"{name}:m{m}", name, functools.partial(case_schedule, name, m), f"p={world}, m={m}"))
    return out


def pass_text(item: str, recs) -> str:
    worlds = ", ".join(str(w) for w in dict.fromkeys(r.world for r in recs))
    if item == "communicate":
        return (f"p={worlds}: along the chain both ways, 1F1B's steady-state exchange (both directions at once), "
                f"and stage s on rank p - 1 - s")
    return f"p={worlds}: " + next((v["message"] for r in recs for v in r.verdicts.values() if v["message"]), "")


def setting(ctx, m: int, ranks: list | None = None):
    """This rank's Pipe, the micro-batches and the serial reference (the same on every rank); ``ranks``: the global
    rank of each stage (default: stage s on rank s)."""
    model = pp.make_model(2 * ctx.world, WIDTH)
    xs, ys = pp.make_batch(m, MICRO, WIDTH)
    stage = ranks.index(ctx.rank) if ranks else ctx.rank
    return (pp.make_pipe(model, ctx.world, stage, m, MICRO, ranks), xs, ys, pp.reference(model, ctx.world, xs, ys))


def pattern(sender: int, tag: int):
    """The tensor stage ``sender`` sends in exchange ``tag``: different for every sender and exchange."""
    import torch
    return torch.arange(WIDTH * MICRO, dtype=torch.float64).reshape(MICRO, WIDTH) + 100 * sender + 1000 * tag


def case_communicate(part: str, ctx):
    ranks = list(range(ctx.world))[::-1] if part == "reversed" else None
    pipe = setting(ctx, 3, ranks)[0]
    fn = ctx.need("communicate")
    s = pipe.stage
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
        if part != "reversed" and (part == "chain") != (tag <= 2):
            continue
        posted = peers.Posted(pipe, ranks)
        try:   # its sends kept until waited for: the check names a dropped one before its partner hangs
            with P2PMeter(posted, keep_sends=True) as meter:
                got = fn(pipe, **kw)
        except peers.Refused as e:
            ctx.agree_or_fail(f"{what}: {e}")
        # separate sends and receives run on gloo along the chain: only the steady state's exchange tells
        ctx.agree_or_fail(peers.problem(posted, meter.unwaited_sends, s, loose=part != "chain")
                          or judge_exchange(got, kw, s, tag, what, pipe))
    return {"chain": "forward and backward along the chain", "reversed": "stage s on rank p - 1 - s",
            "steady": "1F1B's steady-state exchange: both directions at once"}[part]


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
    pipe, _, ys, ref = setting(ctx, 3)
    fn = ctx.need("forward_step")
    x = ref.inputs[pipe.stage][1].clone()
    y = fn(pipe, x, ys[1] if pipe.last else None)
    if not isinstance(y, torch.Tensor):
        raise Fail(f"stage {pipe.stage}: forward_step returned {type(y).__name__}, not a tensor")
    if pipe.first and x.requires_grad:
        raise Fail("first stage: forward_step made its input x require its gradient: autograd then computes and "
                   "stores the gradient of the caller's data, for nothing. Call x.requires_grad_() only when not "
                   "pipe.first: only a received activation's gradient is sent back")
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
                       f"pipe.loss_fn(y, target) / pipe.m = {float(loss / pipe.m)!r}"
                       + outcome.unlike(y, [loss / pipe.m]))
    elif tuple(y.shape) != tuple(out.shape) or not torch.allclose(y.detach(), out, **TOL):
        raise Fail(f"stage {pipe.stage}: forward_step's output differs from pipe.module(x)")
    return "the stage's output; on the last stage the micro-batch's loss / m"


def case_backward(ctx):
    import torch
    pipe, _, ys, ref = setting(ctx, 2)
    fn = ctx.need("backward_step")
    for i in range(2):
        x = ref.inputs[pipe.stage][i].clone().requires_grad_(not pipe.first)
        y = pipe.module(x)
        y = pp.mse(y, ys[i]) / pipe.m if pipe.last else y
        dx = fn(pipe, x, y, None if pipe.last else ref.out_grads[pipe.stage][i])
        if pipe.first:
            continue
        want_dx = ref.out_grads[pipe.stage - 1][i]      # what the previous stage's output needs: x's gradient
        if dx is None or tuple(dx.shape) != tuple(want_dx.shape) or not torch.allclose(dx, want_dx, **TOL):
            raise Fail(f"stage {pipe.stage}, micro-batch {i}: backward_step returned "
                       f"{None if dx is None else tuple(dx.shape)}, not x's gradient (x.grad, {tuple(x.shape)}) "
                       f"that the previous stage needs")
    # the reference with these two micro-batches: both shares of every gradient, and the second's alone
    for p, total, last in zip(pipe.module.parameters(), ref.grads[pipe.stage], ref.last_share[pipe.stage]):
        if p.grad is None:
            raise Fail(f"stage {pipe.stage}: a parameter has no .grad after backward_step")
        if not torch.allclose(p.grad, total, **TOL):
            if torch.allclose(p.grad, last, **TOL):
                raise Fail(f"stage {pipe.stage}: after two micro-batches .grad holds the second one's gradient only: "
                           f"backward_step zeroes the gradients between micro-batches (zero_grad or .grad = None). "
                           f"They must accumulate; zero them once per step, before the schedule")
            raise Fail(f"stage {pipe.stage}: after two micro-batches .grad is not the sum of their gradients")
    return "x's gradient back, parameters' gradients accumulated over micro-batches"


class Watcher:
    """One stage's view of a schedule: the events in order, the micro-batches in flight, the first problem."""

    def __init__(self, mod, pipe, ref):
        self.pipe, self.ref = pipe, ref
        self.events: list = []           # ("F", i) / ("B", i)
        self.meter, self.sent = None, []  # the schedule's P2PMeter; its event count at each call's start
        self.by_output: dict = {}        # id(y) -> (micro-batch, y): which forward a backward belongs to
        self.in_flight = self.peak = 0
        self.first_backward_after = None   # forwards run before the first backward
        self.problem: str | None = None
        self.kept = held.Kept()            # the storages of each micro-batch's tensors: what the stage still holds
        self.held_problem: str | None = None   # told after the values: a wrong value explains more
        self.inside: str | None = None     # the watched call running now
        self.originals = {name: getattr(mod, name) for name in ("forward_step", "backward_step")}

    def note(self, text: str) -> None:
        self.problem = self.problem or text

    def which(self, t, candidates) -> int | None:
        import torch
        for i, want in enumerate(candidates):
            if (isinstance(t, torch.Tensor) and want is not None and t.shape == want.shape
                    and torch.allclose(t.detach().to(want.dtype), want, rtol=1e-9, atol=1e-12)):
                return i
        return None

    def forward(self, pipe, x, target=None):
        s, done = self.pipe.stage, sum(1 for e in self.events if e[0] == "F")
        self.sent.append(len(self.meter.events) if self.meter else 0)
        i = self.which(x, self.ref.inputs[s])
        if i is None:
            shape = tuple(x.shape) if hasattr(x, "shape") else type(x).__name__
            self.note(f"stage {s}'s forward number {done} got an input of shape {shape} that is no micro-batch's "
                      f"activation at this stage (expected shape {tuple(self.ref.inputs[s][0].shape)}, "
                      f"pipe.shape): the tensor sent and the one received disagree")
        elif i != done:
            self.note(f"stage {s} received micro-batch {i} for its forward number {done}: every stage runs the "
                      f"micro-batches in order 0..m-1 (the wrong micro-batch reached it)")
        late = self.kept.after_backward(held.LINGER)
        if late and self.held_problem is None:
            self.held_problem = held.during_text(s, self.pipe.stages, done if i is None else i, late, self.in_flight)
        self.inside = "forward_step"          # left set if it raises: a crash in it is not a schedule's
        y = self.originals["forward_step"](pipe, x, target)
        self.inside = None
        # the last stage's y is the loss: the schedule keeps it (detached) as a number; its graph holds x
        self.kept.add(done if i is None else i, None if self.pipe.first else x, None if self.pipe.last else y)
        self.events.append(("F", done if i is None else i))
        self.by_output[id(y)] = (done if i is None else i, y)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        return y

    def backward(self, pipe, x, y, grad):
        s, p = self.pipe.stage, self.pipe.stages
        self.sent.append(len(self.meter.events) if self.meter else 0)
        if self.first_backward_after is None:
            self.first_backward_after = sum(1 for e in self.events if e[0] == "F")
        i, _ = self.by_output.pop(id(y), (None, None))
        done = sum(1 for e in self.events if e[0] == "B")
        if i is None:
            self.note(f"stage {s}'s backward number {done} got a y that no forward_step of this stage returned"
                      + (" (on the last stage its backward started before its loss)" if s == p - 1 else ""))
        elif not self.pipe.last:
            j = self.which(grad, self.ref.out_grads[s])
            if grad is None:
                self.note(f"stage {s}'s backward of micro-batch {i} got grad=None: the gradient of y comes from "
                          f"the next stage (communicate(pipe, recv_next=True))")
            elif j is None and self.which(grad / self.pipe.m, self.ref.out_grads[s][i:i + 1]) == 0:
                self.note(f"the gradient of micro-batch {i} that stage {s} received is m = {self.pipe.m} times one "
                          f"process's: each micro-batch's loss must be divided by the number of micro-batches m")
            elif j is None:
                self.note(f"stage {s}'s backward of micro-batch {i} got a gradient that is no micro-batch's"
                          + outcome.unlike(grad, self.ref.out_grads[s]))
            elif j != i:
                self.note(f"stage {s} applied the gradient of micro-batch {j} (received from stage {s + 1}) to the "
                          f"activations of micro-batch {i}: it received the wrong micro-batch; backwards go in the "
                          f"order the forwards went, the oldest kept (x, y) first")
        self.inside = "backward_step"
        dx = self.originals["backward_step"](pipe, x, y, grad)
        self.inside = None
        self.kept.add(i, grad, dx)
        self.kept.backward_done(i)
        self.events.append(("B", i))
        self.in_flight -= 1
        return dx


def case_schedule(name: str, m: int, ctx):
    pipe, xs, ys, ref = setting(ctx, m)
    schedule = ctx.need(name)
    for fn in ("forward_step", "backward_step", "communicate"):
        ctx.need(fn)
    watcher = Watcher(ctx.mod, pipe, ref)
    ctx.mod.forward_step, ctx.mod.backward_step = watcher.forward, watcher.backward
    try:
        with P2PMeter() as watcher.meter:
            loss = schedule(pipe, list(xs), list(ys))
    except NotImplementedError:   # a stub: the harness says what to write
        raise
    except Exception as e:
        if peer_gone(e):     # a neighbour's process ended first: the harness reports the neighbour
            raise
        raise Fail(crash_text(name, watcher, explain(e, ctx.path, FILE)), kind="error",
                   where=error_where(e, ctx.path)) from e
    finally:
        ctx.mod.forward_step, ctx.mod.backward_step = watcher.originals.values()
    problem = (watcher.problem or order_problem(name, watcher, m) or outcome.result_problem(pipe, ref, loss, TOL, m)
               or outcome.problem(pipe, xs, loss, [i for kind, i in watcher.events if kind == "B"])
               or traffic.problem(pipe, watcher.events, watcher.sent, watcher.meter)
               or watcher.held_problem or left_problem(pipe, watcher))
    if problem:
        raise Fail(f"stage {pipe.stage} of {pipe.stages}: {problem}" if not problem.startswith("stage") else problem,
                   figures=figures(watcher))
    held = {"afab": "m", "one_f_one_b": "min(p - stage, m)"}[name]
    return f"loss and every gradient equal one process; {held} micro-batches held per stage", figures(watcher)


def left_problem(pipe, w: Watcher) -> str | None:
    left = w.kept.after_backward(0)   # the schedule has returned: none of its tensors should be alive
    if left:
        return held.after_text(pipe.stage, left)
    return held.reused_text(pipe.stage, w.kept.reused()) if w.kept.reused() else None


def figures(w: Watcher) -> dict:
    return {"peak_in_flight": w.peak, "warmup": (w.first_backward_after or 0) - 1,
            "order": "".join(e[0] for e in w.events)}


def crash_text(name, w: Watcher, text: str) -> str:
    if w.problem:                 # what the watcher saw first explains the crash
        return f"{w.problem}\n(then {text})"
    if w.inside:
        return f"stage {w.pipe.stage}: {text}"
    if w.pipe.last and name == "one_f_one_b" and w.in_flight == 0 and len(w.events) < 2 * w.pipe.m:
        return (f"last stage: {text}: it tried a backward with no micro-batch in flight; its backward started "
                f"before its loss. On the last stage 1F1B's warm-up is p - stage - 1 = 0: each steady step runs the "
                f"forward (which computes the loss) first, then that micro-batch's backward")
    p, s = w.pipe.stages, w.pipe.stage
    forwards = sum(e[0] == "F" for e in w.events)
    if name == "one_f_one_b" and w.first_backward_after is None and forwards > min(p - s - 1, w.pipe.m):
        return (f"stage {s}: {text}, after {forwards} forwards and no backward: more than 1F1B's warm-up of "
                f"p - stage - 1 = {p - s - 1} forwards before its first backward (the last stage has no warm-up "
                f"and sends nothing on)")
    return f"stage {s}: {text}"


def order_problem(name: str, w: Watcher, m: int) -> str | None:
    p, s = w.pipe.stages, w.pipe.stage
    if len(w.events) != 2 * m or sum(e[0] == "F" for e in w.events) != m:
        return (f"{name} ran {sum(e[0] == 'F' for e in w.events)} forward_step and "
                f"{sum(e[0] == 'B' for e in w.events)} backward_step calls for m = {m} micro-batches (one of each "
                f"per micro-batch, through the module's forward_step and backward_step)")
    if name == "afab":
        if w.peak != m:
            return (f"afab held at most {w.peak} micro-batches' activations at once: all m = {m} forwards come "
                    f"before any backward")
        return None
    warmup, want = w.first_backward_after - 1, min(p - s - 1, m)
    if w.first_backward_after != min(p - s, m):
        return (f"stage {s} ran {w.first_backward_after} forwards before its first backward, a warm-up of {warmup}: "
                f"1F1B's warm-up is p - stage - 1 = {p - s - 1} forwards (at most m), then one forward and one "
                f"backward per step, so that a stage holds at most p - stage = {p - s} micro-batches")
    if w.peak > min(p - s, m):
        return (f"stage {s} held {w.peak} micro-batches' activations at once; 1F1B holds at most p - stage = "
                f"{p - s} (order of its calls: {''.join(e[0] for e in w.events)})")
    steady = "".join(e[0] for e in w.events)[want:2 * m - want]
    if steady != "FB" * (m - want):
        return (f"stage {s}'s steady state ran {steady}: after the {want} warm-up forwards, one forward then one "
                f"backward per step ({'FB' * (m - want)})")
    return None
