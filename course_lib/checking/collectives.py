"""What a rank's library collectives moved, by size: each call seen where it reaches a process group or the
dispatcher's ops (``guard.other_ways`` without the functional collectives' Python functions, which call the ops),
so once however it was made: ``dist.*``, a ProcessGroup object, the functional collectives, inside autograd's
backward. gloo moves their bytes where ``p2p.P2PMeter`` does not see them: the figures are the tensors' sizes, and
``ring`` what one rank sends of them in a ring (the tp and zero checks compare them with what their pieces need)."""

from course_lib.checking.guard import other_ways

BARRIERS = ("barrier", "monitored_barrier")   # no data


def ring(name: str, amount: float, world: int) -> float:
    """What one rank sends in a ring for a collective ``name`` (torch.distributed's) over ``amount`` (numbers or bytes,
    an all-gather's whole output): an all-reduce 2 (W-1)/W of it, any other (W-1)/W."""
    return (2 if name.startswith("all_reduce") else 1) * (world - 1) / world * amount


class Collectives:
    """``with Collectives() as lib: ...`` -> ``lib.calls``: (torch.distributed name, elements, bytes) of each
    collective, its larger side: the input or the output (an all-gather's whole output). Put on top of what is there
    (the guard's counting functions go on counting) and put back on the way out."""

    def __enter__(self) -> "Collectives":
        self.calls, self._saved = [], []
        for owner, attr, name in _ways():
            fn = vars(owner)[attr]
            self._saved.append((owner, attr, fn))
            setattr(owner, attr, self._record(owner, name, fn))
        return self

    def _record(self, owner, name: str, fn):
        # _c10d_functional.all_gather_into_tensor(input, group_size, group_name) has no output argument
        functional_gather = name.startswith("all_gather") and getattr(owner, "name", "") == "_c10d_functional"

        def recorded(*args, **kwargs):
            numel, size = max((_tensors(a) for a in (*args, *kwargs.values())), default=(0, 0), key=lambda s: s[1])
            if functional_gather and "out" not in kwargs and len(args) > 1:
                numel, size = numel * args[1], size * args[1]
            if size and name not in BARRIERS:
                self.calls.append((name, numel, size))
            return fn(*args, **kwargs)
        return recorded

    def __exit__(self, *exc) -> bool:
        for owner, attr, fn in reversed(self._saved):
            setattr(owner, attr, fn)
        self._saved = []
        return False

    def ring_bytes(self, world: int) -> float:
        """Bytes one rank sends for these calls in a ring."""
        return sum(ring(name, size, world) for name, _, size in self.calls)


_WAYS: list = []


def _ways():
    """guard.other_ways without the functional collectives' Python functions: they call the ops, seen there."""
    if not _WAYS:
        import torch.distributed._functional_collectives as funcol  # deferred: the launcher imports no torch
        _WAYS.extend(w for w in other_ways() if w[0] is not funcol)
    return _WAYS


def _tensors(x) -> tuple[int, int]:
    """(elements, bytes) of the tensors in ``x`` (a tensor, or lists of them, as ProcessGroup methods take)."""
    import torch  # deferred: as above
    if isinstance(x, torch.Tensor):
        return x.numel(), x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        parts = [_tensors(v) for v in x]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)
    return 0, 0
