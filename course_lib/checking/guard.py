"""Guards on torch.distributed: forbid the collectives a learner may not call, or count the ones they do.

Activate a guard before the learner's file is imported, so that a ``from torch.distributed import all_reduce``
there binds the replacement too.
"""
from __future__ import annotations

import threading


class ForbiddenCollective(Exception):
    """A guarded function was called in "forbid" mode; ``str()`` is 'dist.NAME', as messages quote it (a
    collective reached another way, through a ProcessGroup object, the functional collectives or torch.ops, says so)."""

    def __init__(self, name: str, other_way: bool = False):
        super().__init__(f"{name} (through a ProcessGroup object, functional collectives or torch.ops, not dist.{name})"
                         if other_way else f"dist.{name}")
        self.name = name


# The other ways to a collective: the methods of a ProcessGroup object (dist.group.WORLD, _get_default_group())
# and of its backends, and the functional collectives. Each is caught by its torch.distributed name.
GROUP_METHODS = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce_coalesced", "allgather": "all_gather",
    "allgather_coalesced": "all_gather_coalesced", "allgather_into_tensor_coalesced": "all_gather_into_tensor",
    "_allgather_base": "all_gather_into_tensor", "all_gather_single": "all_gather_into_tensor", "reduce": "reduce",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor", "reduce_scatter_single": "reduce_scatter_tensor",
    "broadcast": "broadcast", "barrier": "barrier", "monitored_barrier": "monitored_barrier",
    "alltoall": "all_to_all", "alltoall_base": "all_to_all_single", "all_to_all_single": "all_to_all_single",
    "scatter": "scatter", "gather": "gather"}
FUNCTIONAL_PREFIXES = {"all_reduce": "all_reduce", "all_gather": "all_gather_into_tensor", "reduce_scatter":
                       "reduce_scatter_tensor", "all_to_all": "all_to_all_single", "broadcast": "broadcast",
                       "permute_tensor": "all_to_all_single"}
# The dispatcher's own ops, callable from Python as torch.ops.NAMESPACE.OP (ProcessGroup methods reach them in C++,
# the functional collectives from Python: both are caught above, so the ops are only seen when called directly).
OPS = {"c10d": {"allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce_coalesced", "allgather_": "all_gather",
                "allgather_coalesced_": "all_gather_coalesced", "allgather_into_tensor_coalesced_":
                "all_gather_into_tensor", "_allgather_base_": "all_gather_into_tensor", "reduce_": "reduce",
                "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter_tensor",
                "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor", "broadcast_": "broadcast",
                "barrier": "barrier", "monitored_barrier_": "monitored_barrier", "alltoall_": "all_to_all",
                "alltoall_base_": "all_to_all_single", "scatter_": "scatter", "gather_": "gather"},
       "_c10d_functional": {"all_reduce": "all_reduce", "all_reduce_": "all_reduce",
                            "all_reduce_coalesced": "all_reduce", "all_reduce_coalesced_": "all_reduce",
                            "all_gather_into_tensor": "all_gather_into_tensor",
                            "all_gather_into_tensor_out": "all_gather_into_tensor",
                            "all_gather_into_tensor_coalesced": "all_gather_into_tensor",
                            "reduce_scatter_tensor": "reduce_scatter_tensor",
                            "reduce_scatter_tensor_out": "reduce_scatter_tensor",
                            "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
                            "all_to_all_single": "all_to_all_single", "broadcast": "broadcast",
                            "broadcast_": "broadcast"}}


def other_ways():
    """(owner, attribute, torch.distributed name) of every other way to a collective that exists here."""
    import torch  # deferred: the launcher, which imports no torch, reads this
    import torch._C._distributed_c10d as c
    import torch.distributed._functional_collectives as funcol
    out = [(cls, m, name) for cls in (c.ProcessGroup, c.Backend) for m, name in GROUP_METHODS.items()
           if m in vars(cls)]
    for attr, fn in vars(funcol).items():
        prefix = next((p for p in FUNCTIONAL_PREFIXES if attr.startswith(p)), None)
        if prefix and callable(fn) and not attr.endswith(("_backward", "_setup_context", "_meta")):
            out.append((funcol, attr, FUNCTIONAL_PREFIXES[prefix]))
    for namespace, ops in OPS.items():
        owner = getattr(torch.ops, namespace)
        for op, name in ops.items():
            if hasattr(owner, op):   # looked up once, so that it is an attribute of the namespace from now on
                out.append((owner, op, name))
    return out


class CollectiveGuard:
    """While active, the named functions of torch.distributed (and distributed_c10d) are replaced.

    mode "forbid": a call is recorded in ``.used`` and raises ``ForbiddenCollective``; "count": a call
    adds 1 to ``.counts[name]`` and runs the real function (a call made from inside another guarded one,
    torch's own, is not counted). A collective reached another way (``dist.group.WORLD.allreduce``,
    ``_get_default_group()``, the functional collectives, the ops ``torch.ops.c10d.*``) is caught where it meets
    the process group (``other_ways``): in "forbid" mode any collective, in "count" mode those named.
    """

    def __init__(self, names, mode: str = "forbid"):
        if mode not in ("forbid", "count"):
            raise ValueError(f"mode must be 'forbid' or 'count', not {mode!r}")
        import torch.distributed as dist  # deferred: the launcher, which imports no torch, reads this
        import torch.distributed.distributed_c10d as c10d
        self.mode, self.names = mode, set(names)
        self.used: list[str] = []
        self.counts: dict[str, int] = {}
        self._depth = threading.local()
        self._originals = {(m, name): getattr(m, name) for m in (dist, c10d) for name in names if hasattr(m, name)}
        self._replacements = {key: self._wrap(key[1], fn) for key, fn in self._originals.items()}
        for owner, attr, name in other_ways():
            fn = vars(owner)[attr]
            self._originals[(owner, attr)] = fn
            self._replacements[(owner, attr)] = self._wrap_other(name, fn)

    def _wrap(self, name: str, fn):
        def forbidden(*args, **kwargs):
            self.used.append(name)
            raise ForbiddenCollective(name)

        def counted(*args, **kwargs):
            if getattr(self._depth, "n", 0) == 0:
                self.counts[name] = self.counts.get(name, 0) + 1
            return self._inside(fn, args, kwargs)

        wrapper = forbidden if self.mode == "forbid" else counted
        wrapper.__name__, wrapper.__wrapped__ = name, fn
        return wrapper

    def _wrap_other(self, name: str, fn):
        """A collective reached another way: forbidden, or counted when it is one of ``names``."""
        def other(*args, **kwargs):
            if getattr(self._depth, "n", 0) == 0:
                if self.mode == "forbid":
                    self.used.append(name)
                    raise ForbiddenCollective(name, other_way=True)
                if name in self.names:
                    self.counts[name] = self.counts.get(name, 0) + 1
            return self._inside(fn, args, kwargs)
        other.__name__, other.__wrapped__ = getattr(fn, "__name__", name), fn
        return other

    def _inside(self, fn, args, kwargs):
        """Call ``fn`` as seen already: the collectives it reaches by the other ways are not seen again."""
        depth = getattr(self._depth, "n", 0)
        self._depth.n = depth + 1
        try:
            return fn(*args, **kwargs)
        finally:
            self._depth.n = depth

    def __enter__(self) -> CollectiveGuard:
        for (module, name), wrapper in self._replacements.items():
            setattr(module, name, wrapper)
        return self

    def __exit__(self, *exc) -> bool:
        for (module, name), fn in self._originals.items():
            setattr(module, name, fn)
        return False

    def original(self, name: str):
        """The real function, to call from the checker's own code while the guard is active (``__wrapped__``
        is the function itself); one the guard does not replace is torch.distributed's own."""
        import torch.distributed as dist  # deferred: the launcher, which imports no torch, reads this
        modules = ("torch.distributed", "torch.distributed.distributed_c10d")
        for (module, n), fn in self._originals.items():
            if n == name and getattr(module, "__name__", "") in modules:
                return self._passing(fn)
        return self._passing(getattr(dist, name))

    def _passing(self, fn):
        def passed(*args, **kwargs):
            return self._inside(fn, args, kwargs)
        passed.__wrapped__ = fn
        return passed

    def take(self) -> dict[str, int]:
        """The counts so far, and start again from none."""
        counts, self.counts = self.counts, {}
        return counts
