"""Check notebook 01's exercise, ``01_tuning/step.py``: ``time_steps`` and ``train_step``.

Pure functions on one process, so they run here, in the caller's process: ``check(path)`` returns a Report.
``time_steps`` is judged by the order of its calls (warm-up steps, a device sync, the clock, the timed steps, a sync,
the clock), recorded with the clock and ``torch.cuda.synchronize`` replaced by recorders, so it is judged for a GPU
on a machine without one. ``train_step`` by the dtype its model computes in and the GradScaler calls it makes.
"""
import time
from contextlib import contextmanager
from unittest import mock

from course_lib.lessons.checking import run_parts

WARMUP, TIMED = 2, 3
EXPECTED = ["step"] * WARMUP + ["sync", "clock"] + ["step"] * TIMED + ["sync", "clock"]


@contextmanager
def _recording(events):
    import torch
    real = time.perf_counter

    def clock():
        events.append("clock")
        return real()
    with mock.patch.object(time, "perf_counter", clock), \
            mock.patch.object(torch.cuda, "synchronize", lambda *a, **k: events.append("sync")):
        yield


def _timing(mod, report):
    import torch
    events: list[str] = []
    try:
        with _recording(events):
            seconds = mod.time_steps(lambda: events.append("step"), TIMED, torch.device("cuda"), warmup=WARMUP)
    except NotImplementedError:
        report.add("time_steps", False, "not written yet (raise NotImplementedError)")
        return
    except Exception as e:          # the learner's code: any error is the verdict
        report.add("time_steps", False, f"raised {type(e).__name__}: {e}")
        return
    if events[:len(EXPECTED)] != EXPECTED or len(events) != len(EXPECTED):
        report.add("time_steps on a GPU", False,
                   f"calls in this order: {', '.join(events) or 'none'}; expected {', '.join(EXPECTED)} "
                   f"({WARMUP} warm-up steps, then synchronise before each clock read)")
    elif not (isinstance(seconds, float) and seconds >= 0):
        report.add("time_steps on a GPU", False, f"returned {seconds!r}: the seconds per timed step, a float")
    else:
        report.add("time_steps on a GPU", True, "warm-up, then a sync before each clock read: the clock times the work")
    events.clear()
    with _recording(events):
        mod.time_steps(lambda: events.append("step"), TIMED, torch.device("cpu"), warmup=WARMUP)
    report.add("time_steps on a CPU", "sync" not in events,
               "no device sync on a CPU" if "sync" not in events else
               "calls torch.cuda.synchronize for a CPU device: that fails where CUDA is not there")


def _model():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.manual_seed(0)

    class Small(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 4)
            self.seen = []

        def forward(self, x):
            y = self.fc(x)
            self.seen.append(y.dtype)
            return F.log_softmax(y.float(), dim=1)
    return Small(), torch.randn(8, 16), torch.randint(0, 4, (8,))


def _precision(mod, report):
    import torch
    for dtype in (None, torch.bfloat16):
        model, x, y = _model()
        before = model.fc.weight.detach().clone()
        try:
            loss = mod.train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), x, y, amp_dtype=dtype)
        except NotImplementedError:
            report.add("train_step", False, "not written yet (raise NotImplementedError)")
            return
        except Exception as e:
            report.add(f"train_step amp_dtype={dtype}", False, f"raised {type(e).__name__}: {e}")
            return
        want = dtype or torch.float32
        ok = model.seen == [want] and not torch.equal(before, model.fc.weight) and loss.requires_grad is False
        report.add(f"train_step amp_dtype={dtype}", ok,
                   f"the linear layer computed in {want} and the weights moved" if ok else
                   f"the layer computed in {model.seen or 'nothing'} (expected [{want}]), weights "
                   f"{'moved' if not torch.equal(before, model.fc.weight) else 'did not move'}, "
                   f"loss {'detached' if not loss.requires_grad else 'still attached to the graph'}")
    model, x, y = _model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    calls = []
    for name in ("scale", "step", "update"):
        real = getattr(scaler, name)
        setattr(scaler, name, lambda *a, _real=real, _name=name, **k: (calls.append(_name), _real(*a, **k))[1])
    try:
        mod.train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), x, y, amp_dtype=torch.float16, scaler=scaler)
    except Exception as e:
        report.add("train_step fp16 + GradScaler", False, f"raised {type(e).__name__}: {e}")
        return
    ok = calls == ["scale", "step", "update"] and model.seen == [torch.float16]
    report.add("train_step fp16 + GradScaler", ok,
               "scaled the loss, stepped through the scaler, updated its scale" if ok else
               f"scaler calls {calls} (expected scale, step, update); the layer computed in {model.seen}")


def check(path, **_options):
    """The verdicts on ``path`` (a course_lib.core.report.Report)."""
    return run_parts("step", path, (_timing, _precision))
