"""Pipeline parallelism on point-to-point operations: the all-forward-all-backward schedule (GPipe), then 1F1B.

A model is cut into p stages of consecutive layers, one stage per rank. A step's batch is split into m
micro-batches; activations go forward from stage s to stage s+1, the gradients of the loss w.r.t. them come back.
Each function gets ``pipe`` (``course_lib.pp.pipe.Pipe``), this rank's view of the pipeline:

- ``pipe.module``: this stage's layers;  ``pipe.stage`` (0..p-1), ``pipe.stages`` (p), ``pipe.first``, ``pipe.last``
- ``pipe.prev`` / ``pipe.next``: the GLOBAL ranks of the neighbouring stages (None at the ends)
- ``pipe.shape``, ``pipe.dtype``: one micro-batch's activation between stages (what every stage sends and receives)
- ``pipe.m``: micro-batches per step;  ``pipe.loss_fn(output, target)``: one micro-batch's mean loss
- ``pipe.group``: the pipeline's process group (pass it as ``group=`` to send/recv; None: the default group)

The schedules get ``inputs`` and ``targets``, lists of the m micro-batches (the first stage uses ``inputs``, the
last ``targets``) and return the step's loss on the last stage (the sum of the m returned losses), None elsewhere.
They must leave in every parameter's ``.grad`` exactly what one process gets from the whole batch: each
micro-batch's loss is divided by m and the gradients of the m micro-batches add up (nothing zeroes them).
The schedules call ``communicate``, ``forward_step`` and ``backward_step`` (the checker watches those calls: the
order of forwards and backwards on each stage and how many micro-batches' activations a stage holds at once), and
every stage runs its forwards, and its backwards, in micro-batch order 0, 1, ..., m-1.

- AFAB (GPipe, Huang et al. 2019): all m forwards, then all m backwards. A stage holds m micro-batches' activations.
- 1F1B (PipeDream-Flush, Narayanan et al. 2021): stage s runs p - s - 1 warm-up forwards (at most m), then
  alternates one forward and one backward, then runs the backwards left (cool-down). A stage holds at most p - s
  micro-batches' activations; the bubble is the same as AFAB's, (p - 1) / (m + p - 1) of the step.

Check your work: ``course check pp exercises/12_pipeline/pp.py``.
"""
import torch
import torch.distributed as dist


def communicate(pipe, send_next=None, send_prev=None, recv_prev=False, recv_next=False):
    """Send ``send_next`` to the next stage and ``send_prev`` to the previous one, and receive a tensor of
    ``pipe.shape`` from the previous (``recv_prev``) and the next (``recv_next``) stage, all in one go.

    Returns ``(from_prev, from_next)`` (None for what was not asked). In 1F1B's steady state stage s sends an
    activation to s+1 while s+1 sends a gradient back to s: every send must be posted together with the receives
    (``dist.P2POp`` + ``dist.batch_isend_irecv``, then wait on every request), never a blocking send first.
    """
    raise NotImplementedError("communicate: make a P2POp(dist.irecv, buffer, peer) per receive (a new buffer "
                              "torch.empty(pipe.shape, dtype=pipe.dtype)) and a P2POp(dist.isend, t, peer) per "
                              "send (peers: pipe.prev, pipe.next), start them all with dist.batch_isend_irecv "
                              "and wait on every request; return (from_prev, from_next)")


def forward_step(pipe, x, target=None):
    """This stage's forward of one micro-batch. ``x``: the micro-batch's input (first stage) or the activation
    received from the previous stage. Returns the output to send on; on the last stage, the micro-batch's loss
    divided by ``pipe.m``. Make ``x`` require its gradient first (not on the first stage): backward_step returns it.
    """
    raise NotImplementedError("forward_step: x.requires_grad_() unless pipe.first; y = pipe.module(x); on the "
                              "last stage return pipe.loss_fn(y, target) divided by pipe.m, else y")


def backward_step(pipe, x, y, grad):
    """Backward of one micro-batch through this stage: ``y`` is what forward_step returned for input ``x``,
    ``grad`` the gradient of the loss w.r.t. ``y`` from the next stage (None on the last stage: ``y`` is the loss).
    The parameters' gradients ADD UP in ``.grad`` over the micro-batches. Returns x's gradient (None on the first
    stage) for the previous stage.
    """
    raise NotImplementedError("backward_step: torch.autograd.backward(y, grad) (accumulates into .grad: "
                              "never zero it here); return None on the first stage, else x.grad")


def afab(pipe, inputs, targets):
    """All forward, all backward: forward every micro-batch (receive, forward, send on), keeping each (x, y); then
    backward every micro-batch in the same order (receive its gradient, backward, send x's gradient back)."""
    raise NotImplementedError("afab: for each micro-batch i: x = inputs[i] on the first stage, else "
                              "communicate(pipe, recv_prev=True)[0]; y = forward_step(...); keep (x, y); "
                              "send y on unless last. Then for each i in the same order: grad from the next "
                              "stage (None on the last), backward_step, send x's gradient back unless first")


def one_f_one_b(pipe, inputs, targets):
    """1F1B: ``min(p - stage - 1, m)`` warm-up forwards, then one forward and one backward per step (the forward
    of micro-batch warm-up + i, the backward of micro-batch i), then the remaining backwards (cool-down). In the
    steady state send the activation and receive the gradient in ONE communicate call."""
    raise NotImplementedError("one_f_one_b: warmup = min(pipe.stages - pipe.stage - 1, pipe.m) forwards "
                              "as in afab; then m - warmup steps of: forward the next micro-batch, send y and "
                              "receive its gradient in one communicate(pipe, send_next=y, recv_next=True) "
                              "(the last stage has none: grad None), backward the oldest kept (x, y), send "
                              "dx back; then warmup cool-down backwards")
