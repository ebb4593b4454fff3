"""What a ZeroOptimizer holds and sends, measured rather than inferred from its values (the ZeRO case, zerocase.py):
a full-size gradient kept in an attribute of any name is seen, and one kept where no attribute leads (a global, a
class attribute, a closure) by the tensors that step() made and left alive; the bytes sent: ``checking.p2p.P2PMeter``
sees point-to-point sends, ``checking.collectives.Collectives`` the library's collectives by size.
"""
import gc
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


class NewTensors:
    """``with NewTensors() as made: zero.step()`` -> ``made.tensors``: the tensors made inside and alive after it.
    ``gc.freeze()`` first moves every object alive now out of ``gc.get_objects()``' sight (into the permanent
    generation, where the fork server already put torch's), so that the calls after collect and list only what the
    block made and kept: a look at a few objects, not at every object of the process."""

    def __enter__(self) -> "NewTensors":
        gc.freeze()
        self.tensors = []
        return self

    def __exit__(self, *exc) -> bool:
        import torch
        gc.collect()   # garbage in a reference cycle is not kept (and the collector walks only what is not frozen)
        self.tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
        return False


def kept_elsewhere(made: list, held: dict, params) -> dict:
    """Like ``held``, for the tensors of ``made`` (``NewTensors``) whose storage neither ``held`` nor ``params`` has,
    nor any tensor that was alive before: new memory that no attribute of the optimizer or the model leads to."""
    import torch
    skip = set(held) | {p.untyped_storage().data_ptr() for p in params}
    new = [t for t in made if t.untyped_storage().nbytes() and t.untyped_storage().data_ptr() not in skip]
    if not new:
        return {}
    gc.unfreeze()   # only now: a new view of an older tensor's storage holds no new memory
    ids = {id(t) for t in made}
    old = {o.untyped_storage().data_ptr() for o in gc.get_objects() if isinstance(o, torch.Tensor) and id(o) not in ids}
    found = {}
    for t in new:
        key = t.untyped_storage().data_ptr()
        holder = _holder(t, [made, new]) if key not in old and key not in found else None
        if holder:
            found[key] = (t.untyped_storage().nbytes(), t.numel(), holder)
    return found


def _holder(t, ours: list) -> str | None:
    """Where ``t`` is kept, in words, from what refers to it: a module's globals, a class, a closure's cell, or a
    list or dict that one of those holds. None when no Python object does: torch keeps a tensor's Python object alive
    while its C++ side lives, and gloo may still hold a collective's buffers a moment after it ended."""
    referrers = _referrers(t, ours)
    if not referrers:
        return None
    for r in referrers:
        if isinstance(r, types.CellType):
            return "a variable of a closure"
        name = _name_in(r, t)
        if name:
            return name
        for outer in _referrers(r, ours):
            name = _name_in(outer, r)
            if name:
                return f"an item of {name}"
    return "a tensor that no attribute of the optimizer or the model leads to"


def _referrers(obj, ours: list) -> list:
    return [r for r in gc.get_referrers(obj) if not any(r is o for o in ours) and not isinstance(r, types.FrameType)]


def _name_in(space, value) -> str | None:
    """"global NAME" or "class attribute C.NAME" when ``space`` is a module's globals or a class's namespace
    holding ``value``."""
    if not isinstance(space, dict):
        return None
    key = next((k for k, v in space.items() if v is value), None)
    if key is None:
        return None
    if "__builtins__" in space:
        return f"global {key}"
    cls = next((o for o in gc.get_referrers(space) if isinstance(o, type)), None)
    return f"class attribute {cls.__name__}.{key}" if cls is not None else None


def largest(found: dict, count: int = 2) -> str:
    """The biggest held tensors, in words: 'zero.grads (101 elements, 808 B)'."""
    top = sorted(found.values(), key=lambda v: -v[0])[:count]
    return ", ".join(f"{path} ({n:,} elements, {b:,} B)" for b, n, path in top)
