"""What a ZeroOptimizer holds and sends, measured rather than inferred from its values (the ZeRO case, zerocase.py):
a full-size gradient kept in an attribute of any name is seen; the library's collectives move their bytes inside
gloo, where ``SendMeter`` does not see them.
"""
import types

DEPTH = 8      # attribute hops from a root: far more than any optimizer object nests


def nbytes(t) -> int:
    """Bytes this rank holds of ``t`` (0 for None): a DTensor (FSDP2) counts its local shard only."""
    if t is None:
        return 0
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def state_bytes(optimizer) -> int:
    """Bytes of the tensors in ``optimizer.state`` on this rank."""
    import torch
    return sum(nbytes(v) for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor))


def _children(obj):
    """(name, child) of a container or a plain object's attributes; nothing for modules, functions, classes."""
    if isinstance(obj, dict):
        return [(f"[{k!r}]", v) for k, v in obj.items()] + [(f"[key {i}]", k) for i, k in enumerate(obj)]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"[{i}]", v) for i, v in enumerate(obj)]
    if isinstance(obj, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type, str, bytes)):
        return []
    if isinstance(obj, types.MethodType):
        return [(".__self__", obj.__self__)]
    attrs = getattr(obj, "__dict__", None)
    return [(f".{k}", v) for k, v in attrs.items()] if isinstance(attrs, dict) else []


def held(roots: dict, params) -> dict:
    """{storage key: (bytes, elements, path)} of every tensor reachable from ``roots`` (name -> object) that is not
    one of ``params``' storages; the parameters' ``.grad`` are reached through the model."""
    import torch
    skip = {p.untyped_storage().data_ptr() for p in params}
    found, seen = {}, set()
    stack = [(name, obj, 0) for name, obj in roots.items()]
    while stack:
        path, obj, depth = stack.pop()
        if id(obj) in seen or depth > DEPTH:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            key, size = obj.untyped_storage().data_ptr(), obj.untyped_storage().nbytes()
            if key not in skip and key not in found and size:
                found[key] = (size, obj.numel(), path)
            if obj.grad is not None:
                stack.append((f"{path}.grad", obj.grad, depth + 1))
            continue
        if "torch.distributed" in type(obj).__module__ or "torch._C._distributed" in type(obj).__module__:
            continue     # process groups, works: gloo's own buffers are not the optimizer's
        stack.extend((path + name, child, depth + 1) for name, child in _children(obj))
    return found


def largest(found: dict, count: int = 2) -> str:
    """The biggest held tensors, in words: 'zero.grads (101 elements, 808 B)'."""
    top = sorted(found.values(), key=lambda v: -v[0])[:count]
    return ", ".join(f"{path} ({n:,} elements, {b:,} B)" for b, n, path in top)


class SendMeter:
    """``with SendMeter() as m: ...`` -> ``m.bytes``: bytes given to point-to-point sends on this rank
    (``ProcessGroup.send``, which dist.send, dist.isend and batch_isend_irecv all reach with gloo)."""

    def __enter__(self) -> "SendMeter":
        import torch.distributed.distributed_c10d as c10d
        self.bytes = 0
        self._cls, self._real = c10d.ProcessGroup, vars(c10d.ProcessGroup)["send"]
        real = self._real

        def send(pg, tensors, *args, **kwargs):
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
            return real(pg, tensors, *args, **kwargs)

        self._cls.send = send
        return self

    def __exit__(self, *exc) -> bool:
        self._cls.send = self._real
        return False
