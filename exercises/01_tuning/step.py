"""Notebook 01: time a training step honestly, and train it in mixed precision.

Two functions; notebook 01 checks them (the order of the clock reads and synchronisations, the dtypes under
autocast, the GradScaler's calls) and then times fp32 against bf16 (and fp16 on a GPU) with them.
"""
import time

import torch
import torch.nn.functional as F


def time_steps(step, n, device, warmup=3):
    """Seconds per call of the function ``step``, averaged over ``n`` calls after ``warmup`` untimed calls.

    CUDA runs kernels asynchronously: a call of ``step`` returns once its work is queued. Wait for the device
    (``torch.cuda.synchronize``) before each read of the clock, so that the clock times the work, not its launch.
    On a CPU there is nothing to wait for.
    """
    # YOUR CODE HERE
    raise NotImplementedError()


def train_step(model, optimizer, data, target, amp_dtype=None, scaler=None):
    """One training step of ``model`` on a batch; returns the loss (a detached tensor).

    ``amp_dtype`` None trains in float32; ``torch.bfloat16`` or ``torch.float16`` runs the forward pass and the loss
    under ``torch.autocast`` on the data's device type. With a ``scaler`` (a ``torch.amp.GradScaler``, used with
    fp16), scale the loss before ``backward()``, let the scaler step the optimizer (it unscales the gradients and
    skips the step if they overflowed) and update its scale; without one, a plain backward and step.
    """
    optimizer.zero_grad(set_to_none=True)
    # YOUR CODE HERE
    raise NotImplementedError()
