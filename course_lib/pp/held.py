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
        return [i for i in self.done if any(not r.expired() for r in self.refs.get(i, ()))]

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
