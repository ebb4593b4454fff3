"""What a schedule leaves, measured after it returned: its return value (the step's loss on the last stage, None
on the others), every parameter's gradient against one process with the whole batch, the caller's inputs untouched
(the first stage's input needs no gradient), and the order its backwards ran in (micro-batch order 0..m-1, as the
module's docstring asks: in AFAB newest-first backwards would hold the oldest micro-batch's activations longest)."""


def problem(pipe, xs: list, loss, backwards: list) -> str | None:
    """``xs``: the inputs given to the schedule; ``backwards``: the micro-batch of each backward_step, in order."""
    if not pipe.last and loss is not None:
        return (f"stage {pipe.stage} returned {loss!r}: the schedules return the step's loss on the last stage only, "
                f"None on every other stage (the caller tells the stage that has the loss by it)")
    if pipe.first and any(x.requires_grad or x.grad is not None for x in xs):
        return ("the caller's inputs require their gradient after the step (x.requires_grad_() on the first stage): "
                "autograd then computes and stores the gradient of the data, for nothing. forward_step makes x "
                "require its gradient only when not pipe.first: only a received activation's gradient is sent back")
    if backwards != sorted(backwards):
        return (f"stage {pipe.stage} ran its backwards in the order {backwards}: every stage runs them in micro-batch "
                f"order 0..m-1, the oldest kept (x, y) first (saved.pop(0), not saved.pop())")
    return None


def unlike(t, candidates) -> str:
    """Why ``t`` is none of ``candidates``: another shape, or the nearest one's relative difference (float32
    rounding shows as about 1e-8 to 1e-7; the checker's stages work in float64)."""
    import torch
    want = candidates[0]
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(want.shape):
        return f" (shape {tuple(getattr(t, 'shape', ()))}; expected {tuple(want.shape)})"
    t = t.detach().to(want.dtype)
    rel = min(float((t - c).abs().max() / c.abs().max().clamp_min(1e-300)) for c in candidates)
    if rel < 1e-5:
        return (f" (a relative difference of {rel:.1e} from the nearest: float32 rounding, where the checker's "
                f"stages work in float64? A number or tensor made without dtype= is float32, e.g. "
                f"torch.tensor(1 / pipe.m); divide by the int pipe.m instead)")
    return f" (a relative difference of {rel:.1e} from the nearest)"


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
