"""What a pipeline stage keeps alive, measured rather than inferred from the order of its calls: each micro-batch's
tensors at this stage (the activation received, x; the output sent on, y; the gradient received and the one sent
back) are followed by weak references to their storages. A storage stays alive while anything holds it: a list
that keeps (x, y) after the backward, a detached view, an autograd graph (a loss kept with its graph holds its
input x through the graph's leaf). 1F1B's point is to free a micro-batch's activations once its backward has run.
"""
import gc

# micro-batches whose backward has run that a right schedule may still hold when its next forward starts: the
# local variables of its last backward (x, y = saved.pop(0)) are only reassigned after that forward
LINGER = 1


class Kept:
    """One stage's micro-batches: the storages of their tensors, and which have had their backward."""

    def __init__(self):
        self.refs: dict = {}        # micro-batch -> weak references to the storages of its tensors
        self.done: list = []        # micro-batches whose backward has run, in order

    def add(self, i, *tensors) -> None:
        import torch
        from torch.multiprocessing.reductions import StorageWeakRef
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self.refs.setdefault(i, []).append(StorageWeakRef(t.untyped_storage()))

    def backward_done(self, i) -> None:
        if i is not None:
            self.done.append(i)

    def _alive(self) -> list:
        """The micro-batches done that still hold a storage of their own: one that several micro-batches share (a
        receive buffer reused) is one buffer, not each one's tensors (``reused`` tells it)."""
        shared = self._shared()
        return [i for i in self.done if any(not r.expired() and r.cdata not in shared for r in self.refs.get(i, ()))]

    def _shared(self) -> dict:
        """{storage (its cdata): the micro-batches whose tensors are in it} for the live storages of several."""
        owners: dict = {}
        for i, refs in self.refs.items():
            for r in refs:
                if not r.expired():
                    owners.setdefault(r.cdata, set()).add(i)
        return {k: sorted(v) for k, v in owners.items() if len(v) > 1}

    def reused(self) -> list:
        """The micro-batches whose tensors share one storage that is still alive (the largest such group)."""
        return max(self._shared().values(), key=len, default=[])

    def after_backward(self, linger: int) -> list:
        """The micro-batches whose backward has run and a tensor of which is still alive, when more than
        ``linger`` are; else []. Garbage in a reference cycle is not held: collected before it counts."""
        found = self._alive()
        if len(found) > linger:
            gc.collect()
            found = self._alive()
        return found if len(found) > linger else []


def during_text(stage: int, stages: int, i: int, late: list, in_flight: int) -> str:
    return (f"stage {stage}: when it started the forward of micro-batch {i} it still held the tensors of "
            f"micro-batches {late}, whose backward had already run (measured: their x, y or gradients stayed "
            f"alive): with the new one {in_flight + len(late) + 1} micro-batches' tensors at once, where 1F1B "
            f"holds at most p - stage = {stages - stage}, its reason to exist. Let go of each micro-batch once its "
            f"backward has run: take (x, y) out of the list (saved.pop(0), not saved[i]), keep no output or "
            f"gradient in another list, and keep each loss as loss.detach() (a loss kept with its graph holds "
            f"the graph's input x)")


def after_text(stage: int, left: list) -> str:
    return (f"stage {stage}: after the step returned, the tensors of micro-batches {left} are still alive "
            f"(measured: their x, y or gradients at this stage): something keeps them past the step (a module-level "
            f"list or dict, an attribute of pipe, a loss kept with its graph). Memory then grows with every step; "
            f"nothing of a micro-batch should outlive its backward, except the loss as a number (loss.detach())")


def reused_text(stage: int, shared: list) -> str:
    return (f"stage {stage}: micro-batches {shared} received into one and the same buffer, still alive after the "
            f"step (measured: one storage under their tensors): the buffer is kept and reused. Every receive must "
            f"get a new buffer, torch.empty(pipe.shape, dtype=pipe.dtype) inside communicate: a reused one is "
            f"overwritten by the next receive while the tensor returned before may still be in use (on a GPU, "
            f"with asynchronous receives, before its backward has read it)")
