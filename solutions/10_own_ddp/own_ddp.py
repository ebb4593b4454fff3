"""Data parallelism written yourself: what DistributedDataParallel does with your gradients, in four steps.

Every rank holds the whole model and runs forward and backward on its own part of the batch. For all ranks
to take the same step, each gradient must become the mean over the ranks before ``optimizer.step()``. Four
ways to get there, each a wrapper around the model:

- ``NaiveDDP``: broadcast rank 0's parameters and buffers at the start (so that every rank starts from the same
  model); after ``backward()``, all-reduce every gradient, one collective per parameter, and divide by W;
- ``FlatDDP``: the same, but all gradients copied into one flat buffer and all-reduced at once: one collective;
- ``OverlappedDDP``: a hook per parameter (``register_post_accumulate_grad_hook``) launches an asynchronous
  all-reduce of its gradient as soon as backward has produced it, while backward goes on with the layers
  before; the handles are waited on before ``optimizer.step()``;
- ``BucketedDDP``: the parameters grouped into buckets of about ``bucket_size_mb`` MiB, in reverse order of
  registration (the order backward produces their gradients); a bucket is all-reduced, as one flat buffer and
  asynchronously, as soon as every gradient in it is ready. A bucket still waiting when backward ends (one
  holds a parameter that got no gradient) is sent by ``finish_gradient_synchronization``.

How to use any of them (the checker and the notebook call exactly this)::

    ddp = BucketedDDP(model, bucket_size_mb=1.0)      # or NaiveDDP(model), FlatDDP(model), OverlappedDDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    loss = loss_fn(ddp(x), y)                         # forward: the wrapped model's
    loss.backward()
    ddp.finish_gradient_synchronization()             # now every .grad is the mean over the ranks
    optimizer.step()
    optimizer.zero_grad()

Rules that every variant keeps:
- only parameters with ``requires_grad`` take part (``self.params``); a frozen one gets no hook and is never sent;
- a parameter used in no forward gets no gradient on any rank: its ``.grad`` stays None (the optimizer then
  skips it, as with one process). The same parameters are used on every rank (torch's DDP makes the same
  assumption unless ``find_unused_parameters=True``);
- a parameter shared by two layers (tied weights) is one parameter: ``module.parameters()`` lists it once and
  its hook fires once, after both uses have added into its ``.grad``;
- buckets (``make_buckets``): walk ``self.params`` from the last to the first; add each parameter to the current
  bucket; once the bucket holds at least ``bucket_size_mb`` MiB (1 MiB = 2**20 bytes, as torch's
  ``bucket_cap_mb``), close it and start a new one. The last bucket may be smaller.

Check your work: ``course check ownddp exercises/10_own_ddp/own_ddp.py``.
"""
import torch
import torch.distributed as dist

MIB = 2 ** 20


def flatten(tensors):
    """One new 1-D tensor holding ``tensors`` one after the other."""
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten_into(flat, tensors):
    """Copy the pieces of ``flat`` back into ``tensors``, in place (the inverse of ``flatten``)."""
    for t, piece in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(piece.view_as(t))


class NaiveDDP(torch.nn.Module):
    """One all-reduce per gradient, after backward."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.world = dist.get_world_size()
        self.params = [p for p in module.parameters() if p.requires_grad]
        ### BEGIN SOLUTION
        # STUB: raise NotImplementedError("NaiveDDP.__init__: broadcast every parameter and buffer of the module from "
        # STUB:                           "rank 0 (dist.broadcast(tensor, src=0)), so that every rank starts alike")
        with torch.no_grad():   # frozen ones too: every rank must compute with the same model
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, src=0)
        ### END SOLUTION

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        """After ``backward()``: every parameter's ``.grad`` becomes the mean over the ranks."""
        ### BEGIN SOLUTION
        # STUB: raise NotImplementedError("NaiveDDP.finish_gradient_synchronization: for each parameter with a "
        # STUB:                           "gradient, all-reduce p.grad (a sum) and divide it by self.world")
        for p in self.params:
            if p.grad is not None:   # unused on every rank: nothing to send
                dist.all_reduce(p.grad)
                p.grad /= self.world
        ### END SOLUTION


class FlatDDP(NaiveDDP):
    """One all-reduce of all gradients, flattened into one buffer, after backward."""

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return
        ### BEGIN SOLUTION
        # STUB: raise NotImplementedError("FlatDDP.finish_gradient_synchronization: flatten(grads), one all-reduce of "
        # STUB:                           "it, divide by self.world, unflatten_into(flat, grads)")
        flat = flatten(grads)
        dist.all_reduce(flat)
        flat /= self.world
        unflatten_into(flat, grads)
        ### END SOLUTION


class OverlappedDDP(NaiveDDP):
    """An asynchronous all-reduce per gradient, launched by a hook the moment backward has produced it."""

    def __init__(self, module):
        super().__init__(module)
        self.handles = []      # the all-reduces launched in this backward, not yet waited on
        ### BEGIN SOLUTION
        # STUB: raise NotImplementedError("OverlappedDDP.__init__: register self._on_grad_ready as a post-accumulate-"
        # STUB:                           "grad hook on every parameter in self.params")
        for p in self.params:   # a frozen parameter cannot take a hook, and needs none
            p.register_post_accumulate_grad_hook(self._on_grad_ready)
        ### END SOLUTION

    @torch.no_grad()
    def _on_grad_ready(self, param):
        """Called by autograd once ``param.grad`` holds this backward's whole gradient."""
        ### BEGIN SOLUTION
        # STUB: raise NotImplementedError("_on_grad_ready: divide param.grad by self.world, then launch "
        # STUB:                           "dist.all_reduce(param.grad, async_op=True) and keep its handle; do not "
        # STUB:                           "wait on it here: backward would stop until it is done")
        param.grad /= self.world          # the sum of the ranks' grad / W is their mean
        self.handles.append(dist.all_reduce(param.grad, async_op=True))
        ### END SOLUTION

    def finish_gradient_synchronization(self):
        ### BEGIN SOLUTION
        # STUB: raise NotImplementedError("OverlappedDDP.finish_gradient_synchronization: wait on every handle, "
        # STUB:                           "then forget them for the next step")
        for handle in self.handles:
            handle.wait()
        self.handles.clear()
        ### END SOLUTION


def make_buckets(params, bucket_size_mb):
    """``params`` in buckets: a list of lists, the last parameter first (see the rules in the module docstring)."""
    ### BEGIN SOLUTION
    # STUB: raise NotImplementedError("make_buckets: walk params from the last to the first, adding each to the "
    # STUB:                           "current bucket; close it once it holds >= bucket_size_mb * MIB bytes")
    cap = bucket_size_mb * MIB
    buckets, current, size = [], [], 0
    for p in reversed(list(params)):      # backward produces the last layer's gradients first
        current.append(p)
        size += p.numel() * p.element_size()
        if size >= cap:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets
    ### END SOLUTION


class BucketedDDP(NaiveDDP):
    """Gradients all-reduced in buckets, each launched asynchronously as soon as all its gradients are ready."""

    def __init__(self, module, bucket_size_mb=25.0):
        super().__init__(module)
        self.buckets = make_buckets(self.params, bucket_size_mb)
        self.bucket_of = {p: i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.ready = [0] * len(self.buckets)     # per bucket: how many of its gradients this backward produced
        self.pending = {}                         # bucket index -> (handle, flat buffer) launched, not waited on
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

    @torch.no_grad()
    def _launch(self, i):
        """Send bucket ``i``: its gradients (zeros for one that got none) in one buffer, divided by W."""
        flat = flatten([p.grad if p.grad is not None else torch.zeros_like(p) for p in self.buckets[i]])
        flat /= self.world
        self.pending[i] = (dist.all_reduce(flat, async_op=True), flat)

    def _on_grad_ready(self, param):
        ### BEGIN SOLUTION
        # STUB: raise NotImplementedError("BucketedDDP._on_grad_ready: count the gradient in its bucket "
        # STUB:                           "(self.bucket_of, self.ready); when the bucket is complete, self._launch it")
        i = self.bucket_of[param]
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets[i]):
            self._launch(i)
        ### END SOLUTION

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        ### BEGIN SOLUTION
        # STUB: raise NotImplementedError("BucketedDDP.finish_gradient_synchronization: launch every bucket not yet "
        # STUB:                           "sent, wait on each, copy its buffer back into the gradients that exist, "
        # STUB:                           "and reset self.ready and self.pending for the next step")
        for i in range(len(self.buckets)):     # a bucket with an unused parameter never filled up: send it now
            if i not in self.pending:
                self._launch(i)
        for i, (handle, flat) in sorted(self.pending.items()):
            handle.wait()
            for p, piece in zip(self.buckets[i], flat.split([p.numel() for p in self.buckets[i]])):
                if p.grad is not None:    # an unused parameter keeps grad None, as in a run on one process
                    p.grad.copy_(piece.view_as(p))
        self.ready = [0] * len(self.buckets)
        self.pending = {}
        ### END SOLUTION
