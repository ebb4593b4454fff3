"""The schedule cases of ``course check pp``: the learner's ``afab`` or ``one_f_one_b`` run as real ranks, their
``forward_step``, ``backward_step`` and ``communicate`` watched (the module's names are wrapped while the schedule
runs, so the schedule's own calls go through the watcher), then compared with one process with the whole batch.

The watcher tells micro-batches apart by value: the activation a forward gets is compared with what the serial
model gives each micro-batch at this stage, and the gradient a backward gets with each micro-batch's serial
gradient, so a stage that takes the wrong micro-batch is named with both numbers. It counts the micro-batches whose
activations a stage holds (forwards minus backwards) and notes the first thing out of order; the schedule goes on
(a rank that stopped would leave its neighbours waiting) and the first note is the verdict.
"""
from __future__ import annotations

from course_lib.checking.case import Fail
from course_lib.checking.learner import error_where
from course_lib.checking.worker import peer_gone

WATCHED = ("forward_step", "backward_step", "communicate")


class Watcher:
    """One stage's view of a schedule: the events in order, the micro-batches in flight, the first problem."""

    def __init__(self, mod, pipe, ref):
        self.mod, self.pipe, self.ref = mod, pipe, ref
        self.events: list = []           # ("F", i) / ("B", i)
        self.by_output: dict = {}        # id(y) -> (micro-batch, y): which forward a backward belongs to
        self.in_flight = self.peak = 0
        self.first_backward_after = None   # forwards run before the first backward
        self.problem: str | None = None
        self.inside: str | None = None     # the watched call running now
        self.originals = {name: getattr(mod, name) for name in WATCHED}

    def note(self, text: str) -> None:
        self.problem = self.problem or text

    def __enter__(self):
        self.mod.forward_step, self.mod.backward_step = self.forward, self.backward
        return self

    def __exit__(self, *exc):
        for name, fn in self.originals.items():
            setattr(self.mod, name, fn)

    def which(self, t, candidates) -> int | None:
        import torch
        for i, want in enumerate(candidates):
            if (isinstance(t, torch.Tensor) and want is not None and t.shape == want.shape
                    and torch.allclose(t.detach().to(want.dtype), want, rtol=1e-9, atol=1e-12)):
                return i
        return None

    def forward(self, pipe, x, target=None):
        s, done = self.pipe.stage, sum(1 for e in self.events if e[0] == "F")
        i = self.which(x, self.ref.inputs[s])
        if i is None:
            shape = tuple(x.shape) if hasattr(x, "shape") else type(x).__name__
            self.note(f"stage {s}'s forward number {done} got an input of shape {shape} that is no micro-batch's "
                      f"activation at this stage (expected shape {tuple(self.ref.inputs[s][0].shape)}, "
                      f"pipe.shape): the tensor sent and the one received disagree")
        elif i != done:
            self.note(f"stage {s} received micro-batch {i} for its forward number {done}: every stage runs the "
                      f"micro-batches in order 0..m-1 (the wrong micro-batch reached it)")
        self.inside = "forward_step"          # left set if it raises: a crash in it is not a schedule's
        y = self.originals["forward_step"](pipe, x, target)
        self.inside = None
        self.events.append(("F", done if i is None else i))
        self.by_output[id(y)] = (done if i is None else i, y)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        return y

    def backward(self, pipe, x, y, grad):
        s, p = self.pipe.stage, self.pipe.stages
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
                self.note(f"stage {s}'s backward of micro-batch {i} got a gradient that is no micro-batch's "
                          f"(shape {tuple(grad.shape)}; expected {tuple(self.ref.out_grads[s][i].shape)})")
            elif j != i:
                self.note(f"stage {s} applied the gradient of micro-batch {j} (received from stage {s + 1}) to the "
                          f"activations of micro-batch {i}: it received the wrong micro-batch; backwards go in the "
                          f"order the forwards went, the oldest kept (x, y) first")
        self.inside = "backward_step"
        dx = self.originals["backward_step"](pipe, x, y, grad)
        self.inside = None
        self.events.append(("B", i))
        self.in_flight -= 1
        return dx


def case_schedule(name: str, m: int, ctx):
    from course_lib.pp.cases import TOL, setting
    model, pipe, xs, ys, ref = setting(ctx, m)
    schedule = ctx.need(name)
    for fn in WATCHED:
        ctx.need(fn)
    watcher = Watcher(ctx.mod, pipe, ref)
    with watcher:
        try:
            loss = schedule(pipe, list(xs), list(ys))
        except NotImplementedError as e:
            raise Fail(ctx.explain(e), kind="todo") from e
        except Exception as e:
            if peer_gone(e):     # a neighbour's process ended first: the harness reports the neighbour
                raise
            raise Fail(crash_text(name, watcher, e, ctx), kind="error", where=error_where(e, ctx.path)) from e
    problem = watcher.problem or order_problem(name, watcher, m) or result_problem(pipe, ref, loss, TOL, m)
    if problem:
        raise Fail(f"stage {pipe.stage} of {pipe.stages}: {problem}" if not problem.startswith("stage") else problem,
                   figures=figures(watcher))
    held = {"afab": "m", "one_f_one_b": "min(p - stage, m)"}[name]
    return f"loss and every gradient equal one process; {held} micro-batches held per stage", figures(watcher)


def figures(w: Watcher) -> dict:
    return {"peak_in_flight": w.peak, "warmup": (w.first_backward_after or 0) - 1,
            "order": "".join(e[0] for e in w.events)}


def crash_text(name, w: Watcher, e, ctx) -> str:
    text = ctx.explain(e)
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


def result_problem(pipe, ref, loss, tol, m) -> str | None:
    import torch
    if pipe.last:
        if not isinstance(loss, (float, int)) and not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
            return f"the last stage returned {loss!r}, not the step's loss (the sum of the m returned losses)"
        got = float(loss)
        if abs(got - ref.loss * m) <= 1e-9 * abs(ref.loss * m) and m > 1:
            return (f"the step's loss is {got:.6g}, m = {m} times one process's {ref.loss:.6g}: each micro-batch's "
                    f"loss must be divided by the number of micro-batches m")
        if abs(got - ref.loss) > 1e-9 * max(1.0, abs(ref.loss)):
            return f"the step's loss is {got:.6g}, one process with the whole batch has {ref.loss:.6g}"
    for k, (p, want) in enumerate(zip(pipe.module.parameters(), ref.grads[pipe.stage])):
        if p.grad is None:
            return f"parameter {k} of this stage has no gradient after the step"
        if torch.allclose(p.grad, want, **tol):
            continue
        if m > 1 and torch.allclose(p.grad, want * m, **tol):
            return (f"every gradient is m = {m} times one process's: each micro-batch's loss must be divided by "
                    f"the number of micro-batches m")
        if m > 1 and torch.allclose(p.grad, ref.last_share[pipe.stage][k], **tol):
            return (f"parameter {k}'s gradient is the last micro-batch's share alone: the gradients were zeroed "
                    f"between micro-batches (zero_grad or .grad = None inside the schedule or backward_step). The m "
                    f"micro-batches' gradients must add up in .grad; zero them once per step, before the schedule")
        return (f"parameter {k}'s gradient differs from one process with the whole batch (max |difference| "
                f"{float((p.grad - want).abs().max()):.3g}): the gradients of the m micro-batches must add up in "
                f".grad (zeroed once per step, never between micro-batches)")
    return None
