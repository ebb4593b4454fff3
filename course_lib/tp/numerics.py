"""Tensors for the cases and comparisons with serial: float64, within ``TOL``; the context the tp and cp cases
get."""
from course_lib.checking import case as harness
from course_lib.checking.case import Fail

TOL = 1e-10


class Ctx(harness.Ctx):
    """The harness's context in float64."""

    def __init__(self, *args):
        import torch
        super().__init__(*args)
        torch.set_default_dtype(torch.float64)


def rand(seed, *shape):
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def close(a, b):
    import torch
    return a is not None and b is not None and a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=TOL)


def diff(a, b):
    if a is None:
        return "it is None"
    if a.shape != b.shape:
        return f"its shape is {list(a.shape)}, expected {list(b.shape)}"
    return f"max |difference| = {(a - b).abs().max().item():.3g}"


def as_tensor(y, what):
    import torch
    if not isinstance(y, torch.Tensor):
        raise Fail(f"{what} must return a tensor; it returned {type(y).__name__}")
    return y


def judge(got, want, otherwise: str, mistakes=(), none: str = ""):
    """Nothing when ``got`` equals ``want``; else Fail with ``none`` if it is None, the text of the first of
    ``mistakes`` ((value, text)) it equals, or ``otherwise`` and the difference."""
    if close(got, want):
        return
    if got is None and none:
        raise Fail(none)
    for value, text in mistakes:
        if close(got, value):
            raise Fail(text)
    raise Fail(f"{otherwise}; {diff(got, want)}")


def compare_grads(cls, pairs):
    """pairs: (what, got, want, (tp or 1/tp, hint for that times serial) or None, hint for None)."""
    for what, got, want, tp_times, none_hint in pairs:
        times = "tp times" if tp_times and tp_times[0] > 1 else "1/tp of"
        tp_mistake = [(tp_times[0] * want, f"{cls}: {what} are {times} serial: {tp_times[1]}")] if tp_times else []
        judge(got, want, f"{cls}: {what} differ from serial", tp_mistake, f"{cls}: {what} is None: {none_hint}")
