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
        if rec.data["optimizer_steps"] == 0:   # what scales the loss, before the graph is freed
            prints["backwards"] = prints.get("backwards", 0) + 1
            prints["loss_factor"] = _factor(self)
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


def _factor(loss) -> float | None:
    """The constant the tensor given to backward was last multiplied or divided by (``loss / world_size``, ``0.5 *
    loss``): the product of the constant factors at the top of its graph; None when there is none."""
    node, factor = loss.grad_fn, None
    try:
        for _ in range(4):
            name = node.name() if node is not None else ""
            if name not in ("MulBackward0", "DivBackward0"):
                break
            saved = [getattr(node, a, None) for a in ("_saved_other", "_saved_self")]
            constant = next((t for t in saved if t is not None and t.numel() == 1 and not t.requires_grad), None)
            if constant is None:
                break
            value = float(constant)
            factor = (factor or 1.0) * (1.0 / value if name == "DivBackward0" else value)
            node = next((f for f, _ in node.next_functions if f is not None), None)
    except Exception:  # noqa: BLE001 - an odd graph: no factor, no verdict from it
        return None
    return factor


def _divided(records: list) -> bool:
    """Every rank divided the loss of its one backward before the first step by the world size (gradient
    accumulation, several backwards per step, divides by their count: left out)."""
    n = len(records)
    prints = [r.get(KEY) or {} for r in records]
    return n > 1 and all(p.get("backwards") == 1 and p.get("loss_factor") is not None
                         and abs(p["loss_factor"] * n - 1) < 1e-6 for p in prints)


def loss_divided(records: list, more: list) -> str | None:
    """Step 2's failure when the ranks of both runs (``more``: the run with more ranks) divided the loss by their
    world size under DDP, which divides each gradient by it too: seen on two world sizes, the factor is no constant
    of the loss's own (0.5 * loss equals 1/W only with 2 ranks)."""
    if not (_divided(records) and _divided(more)):
        return None
    n, m = len(records), len(more)
    return (f"the parameters are identical on all {n} ranks, but every rank divided its loss by the world size before "
            f"backward (by {n}, and by {m} with {m} ranks), and DDP divides each gradient by it again as it averages "
            f"them (the sum of the {n} divided gradients is their mean): every step's gradient is {n} times too "
            f"small (with plain SGD, a learning rate {n} times smaller). Drop the division: backward on the loss "
            "itself.")


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
