"""Step 2 for a script that averages the gradients itself (all_reduce, no DDP): averaged, or only summed?

``dist.all_reduce`` sums by default; a script that forgets to divide by the world size keeps every rank's
parameters identical, so the parameters alone cannot tell, but each step is world-size times too large.

The probe (``install``) records two fingerprints of the gradients on each rank, for the first optimizer step
only: the rank's own gradient when its last backward before that step returned (before a reduction the script
does after backward), and the gradient the step used. A fingerprint is one number per parameter: the gradient's
dot product with a fixed vector, which is linear, so the averaged gradient's fingerprint is the mean of the ranks'
own and the summed one's their sum. ``judge`` compares them across ranks.

Two more ways for the ranks to agree while the steps are wrong: a loss scaled by the world size before backward
(``step_scaled``, which also sees a learning rate scaled by it twice), and an optimizer that holds none of the
parameters DDP averages the gradients of (``note_optimizer``, ``optimizer_off_ddp``): they never change, on every
rank alike.
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


def _scaled(records: list, power: int) -> bool:
    """Every rank scaled the loss of its one backward before the first step by world size ** ``power`` (gradient
    accumulation, several backwards per step, divides by their count: left out)."""
    n = len(records)
    prints = [r.get(KEY) or {} for r in records]
    return n > 1 and all(p.get("backwards") == 1 and p.get("loss_factor") is not None
                         and abs(p["loss_factor"] / n ** power - 1) < 1e-6 for p in prints)


def step_scaled(records: list, more: list) -> str | None:
    """Step 2's failure when the ranks of both runs (``more``: the run with more ranks) divided the loss by their
    world size under DDP, which divides each gradient by it too, or multiplied it by the world size, which undoes
    DDP's average: seen on two world sizes, the factor is no constant of the loss's own (0.5 * loss equals 1/W only
    with 2 ranks). Or the learning rate grew with the square of the world size (``_lr_squared``)."""
    n, m = len(records), len(more)
    if _scaled(records, -1) and _scaled(more, -1):
        return (f"the parameters are identical on all {n} ranks, but every rank divided its loss by the world size "
                f"before backward (by {n}, and by {m} with {m} ranks), and DDP divides each gradient by it again as it "
                f"averages them (the sum of the {n} divided gradients is their mean): every step's gradient is {n} "
                f"times too small (with plain SGD, a learning rate {n} times smaller). Drop the division: backward on "
                "the loss itself.")
    if _scaled(records, 1) and _scaled(more, 1):
        return (f"the parameters are identical on all {n} ranks, but every rank multiplied its loss by the world size "
                f"before backward (by {n}, and by {m} with {m} ranks): DDP's average of the {n} multiplied gradients "
                f"is their sum, {n} times the gradient of the global batch's mean loss (the gradient the serial "
                f"script's step follows): every step's gradient is {n} times too large (with plain SGD, a learning "
                f"rate {n} times larger). There is nothing to undo: DDP's mean already is the gradient of the global "
                "batch's mean loss. Drop the factor: backward on the loss itself.")
    return _lr_squared(records, more)


def _lr_squared(records: list, more: list) -> str | None:
    """The learning rate of the first optimizer's first step, W^2 times something on both world sizes: the linear
    scaling rule applied twice (``args.lr *= world_size``, then ``lr=args.lr * world_size``)."""
    lrs = [((r[0].get("optimizers") or [{}])[0].get("lr"), len(r)) for r in (records, more)]
    (a, n), (b, m) = lrs
    if not (isinstance(a, float) and isinstance(b, float) and a > 0 and b > 0 and n != m):
        return None
    if abs((b / a) / (m / n) ** 2 - 1) > 1e-6:
        return None
    return (f"the learning rate grows with the square of the world size: {a:g} with {n} ranks, {b:g} with {m} "
            f"(({m}/{n})² = {(m / n) ** 2:.2f} times as large): it was scaled by the world size twice. The global "
            f"batch is W times the serial one, so at most W times the serial learning rate (the linear scaling "
            "rule, once), or none.")


def note_optimizer(rec, optimizer) -> None:
    """At an optimizer's first step: how many of its parameters are those of a live DDP model's, and how many have a
    gradient (by identity: a copy of the model, ``DDP(copy.deepcopy(net))``, has parameters of its own)."""
    import torch

    try:
        held = [p for g in optimizer.param_groups for p in g["params"] if isinstance(p, torch.Tensor)]
        wrapped = {id(p) for m in list(rec.ddp_models) for p in m.parameters()}
    except Exception:  # noqa: BLE001 - odd parameter groups: nothing noted, no verdict from them
        return
    rec.data.setdefault("optimizers", []).append(
        {"params": len(held), "on_ddp": sum(id(p) in wrapped for p in held), "ddp_models": len(rec.ddp_models),
         "with_grad": sum(p.grad is not None for p in held), "lr": _lr(optimizer)})


def _lr(optimizer) -> float | None:
    lr = (optimizer.param_groups or [{}])[0].get("lr")
    return float(lr) if isinstance(lr, (int, float)) else None


def optimizer_off_ddp(records: list) -> str | None:
    """Step 2's failure when, on every rank, DDP wrapped a model and no optimizer held any of its parameters."""
    seen = [[o for o in r.get("optimizers", []) if o["ddp_models"]] for r in records]
    if not all(seen) or any(o["on_ddp"] for opts in seen for o in opts):
        return None
    o = seen[0][0]
    got = ("none of them ever got a gradient, so every step leaves them as they were: nothing trains"
           if not o["with_grad"] else f"{o['with_grad']} of them had gradients, which DDP did not average")
    return (f"the optimizer steps {o['params']} parameters, but none of them is a parameter of the model "
            "DistributedDataParallel wraps (a copy, such as DDP(copy.deepcopy(net)), or a model built again): "
            f"backward puts the averaged gradients on the wrapped model's parameters, and {got}. The ranks agree "
            "only because their parameters never moved from the same start. Wrap the model itself, then build the "
            "optimizer from the wrapped model's parameters (`model = DDP(model)`, then `optim.Adadelta("
            "model.parameters(), ...)`).")


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
