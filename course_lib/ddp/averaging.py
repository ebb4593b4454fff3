"""Step 2 for a script that averages the gradients itself (all_reduce, no DDP): averaged, or only summed?

``dist.all_reduce`` sums by default; a script that forgets to divide by the world size keeps every rank's
parameters identical, so the parameters alone cannot tell, but each step is world-size times too large.

The probe (``install``) records two fingerprints of the gradients on each rank, for the first optimizer step
only: the rank's own gradient when its last backward before that step returned (before a reduction the script
does after backward), and the gradient the step used. A fingerprint is one number per parameter: the gradient's
dot product with a fixed vector, which is linear, so the averaged gradient's fingerprint is the mean of the ranks'
own and the summed one's their sum. ``judge`` compares them across ranks.
"""
import weakref

KEY = "grad_fingerprints"


def install(rec) -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    optimizers = weakref.WeakSet()
    prints = rec.data.setdefault(KEY, {})
    original_init, original_backward = torch.optim.Optimizer.__init__, torch.Tensor.backward

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        optimizers.add(self)

    def backward(self, *args, **kwargs):
        result = original_backward(self, *args, **kwargs)
        if rec.data["optimizer_steps"] == 0 and len(optimizers) == 1:
            prints["backward"] = _fingerprint(next(iter(optimizers)))
        return result

    def before_step(optimizer, _args, _kwargs):
        if rec.data["optimizer_steps"] == 0 and "step" not in prints and "backward" in prints:
            prints["step"] = _fingerprint(optimizer)

    torch.optim.Optimizer.__init__ = init
    torch.Tensor.backward = backward
    register_optimizer_step_pre_hook(before_step)


def _fingerprint(optimizer) -> list | None:
    import torch

    values = []
    try:
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    g = p.grad
                    w = torch.linspace(-1.0, 2.0, g.numel(), device=g.device) if g is not None else None
                    values.append(0.0 if g is None else float((g.detach().reshape(-1).float() * w).sum()))
    except Exception:  # noqa: BLE001 - odd parameters (sparse, meta): no fingerprint, no verdict from it
        return None
    return values


def judge(records: list) -> str | None:
    """'summed' when the step used the sum of the ranks' own gradients, 'averaged' for their mean, else None."""
    prints = [r.get(KEY) or {} for r in records]
    own, used = [p.get("backward") for p in prints], prints[0].get("step")
    if len(records) < 2 or used is None or any(o is None or len(o) != len(used) for o in own):
        return None
    n = len(records)
    total = [sum(o[i] for o in own) for i in range(len(used))]
    scale = max(1e-12, max(abs(x) for x in used))
    off_sum = max(abs(u - t) for u, t in zip(used, total)) / scale
    off_mean = max(abs(u - t / n) for u, t in zip(used, total)) / scale
    if off_sum < 1e-3 < off_mean:
        return "summed"
    if off_mean < 1e-3 < off_sum:
        return "averaged"
    return None
