"""What a pipeline stage is given (``Pipe``), the small model the checker and notebook 12 split into stages, and
the serial reference every schedule must equal: one process with the whole batch (the loss is the mean over the
batch, so each of m equal micro-batches' losses is divided by m and the gradients add up in ``.grad``).
"""
import copy
from dataclasses import dataclass
from typing import Callable


@dataclass
class Pipe:
    """One stage of a pipeline of ``stages`` stages, as the learner's schedule sees it."""
    module: object                 # this stage's layers (torch.nn.Module)
    stage: int                     # 0 .. stages-1
    stages: int                    # p
    prev: int | None               # global rank of the previous stage (None on the first)
    next: int | None               # global rank of the next stage (None on the last)
    shape: tuple                   # one micro-batch's activation between stages: (micro_batch, width)
    m: int                         # micro-batches per step
    dtype: object = None           # the activations' dtype (torch.float64 in the checker)
    loss_fn: Callable = None       # loss_fn(output, target) -> the micro-batch's mean loss
    group: object = None           # the pipeline's process group (None: the default group)

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1


def split_layers(layers: int, stages: int) -> list[range]:
    """Consecutive blocks per stage, the first stages taking one more when they do not divide evenly (GPipe's)."""
    base, extra = divmod(layers, stages)
    starts = [s * base + min(s, extra) for s in range(stages + 1)]
    return [range(a, b) for a, b in zip(starts, starts[1:])]


def make_model(layers: int, width: int, seed: int = 0):
    """``layers`` blocks of Linear(width, width) + Tanh, float64: the serial model."""
    import torch
    from torch import nn
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(layers)]).double()


def stage_module(model, stages: int, stage: int):
    """Stage ``stage``'s blocks of ``model`` (the same Parameter objects: a deepcopy first keeps the model)."""
    from torch import nn
    return nn.Sequential(*[model[i] for i in split_layers(len(model), stages)[stage]])


def make_batch(m: int, micro: int, width: int):
    """m micro-batches of inputs and targets, each (micro, width), float64."""
    import torch
    g = torch.Generator().manual_seed(1)
    return [[torch.randn(micro, width, generator=g, dtype=torch.float64) for _ in range(m)] for _ in "xy"]


def mse(out, target):
    import torch.nn.functional as F
    return F.mse_loss(out, target)


def make_pipe(model, stages: int, stage: int, m: int, micro: int, ranks=None, group=None) -> Pipe:
    """The Pipe of ``stage`` (``ranks``: the global rank of each stage; default 0..p-1)."""
    ranks = list(ranks or range(stages))
    return Pipe(stage_module(model, stages, stage), stage, stages, ranks[stage - 1] if stage else None,
                ranks[stage + 1] if stage < stages - 1 else None, (micro, model[0][0].in_features), m,
                next(model.parameters()).dtype, mse, group)


@dataclass
class Reference:
    """One process with the whole batch."""
    loss: float
    grads: list              # [stage] -> [gradient per parameter]
    inputs: list             # [stage][i] -> activation entering stage (stage 0: the micro-batch's input)
    out_grads: list          # [stage][i] -> d loss / d (stage's output) for micro-batch i (last stage: None)
    last_share: list         # [stage] -> the last micro-batch's share of each gradient alone (what zeroing leaves)


def reference(model, stages: int, xs, ys) -> Reference:
    """The serial computation on a copy of ``model``: the whole batch for the loss and gradients, the stages'
    boundaries micro-batch by micro-batch for what each stage should see."""
    import torch
    serial = copy.deepcopy(model)
    loss = mse(serial(torch.cat(xs)), torch.cat(ys))
    loss.backward()
    parts = [stage_module(serial, stages, s) for s in range(stages)]
    params = [list(part.parameters()) for part in parts]
    grads = [[p.grad.clone() for p in ps] for ps in params]
    inputs = [[None] * len(xs) for _ in range(stages)]
    out_grads = [[None] * len(xs) for _ in range(stages)]
    for i, (x, y) in enumerate(zip(xs, ys)):
        cur, bounds = x.detach().requires_grad_(), []
        for s, part in enumerate(parts):
            inputs[s][i] = cur.detach().clone()
            bounds.append(cur)
            cur = part(cur)
        grad_in = torch.autograd.grad(mse(cur, y) / len(xs), bounds + [q for ps in params for q in ps])
        shares = iter(grad_in[stages:])
        last_share = [[next(shares).detach().clone() for _ in ps] for ps in params]
        for s in range(stages - 1):
            out_grads[s][i] = grad_in[s + 1].detach().clone()
    return Reference(float(loss.detach()), grads, inputs, out_grads, last_share)
