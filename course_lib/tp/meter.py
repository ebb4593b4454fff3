"""Measures of what the values cannot show: the numbers a rank sends in collectives, and the bytes a layer keeps.

``check_sent`` judges the calls ``checking.collectives.Collectives`` recorded (every collective the learner's code
calls, however it calls it); ``check_held`` adds up the storage behind every tensor a module keeps, so a shard that
is a view of the whole weight counts as the whole.
"""
from course_lib.checking.case import Fail
from course_lib.checking.collectives import ring

# the op's name without underscores, by prefix (reduce_scatter before reduce, all_gather before gather) -> kind
KINDS = (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
         ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("reduce", "reduce"), ("gather", "gather"),
         ("scatter", "scatter"))
RING = "per rank as a ring sends them: an all-reduce of n numbers 2(tp-1)/tp x n, any other collective (tp-1)/tp x n"


def kind(name: str) -> str:
    """A torch.distributed name as the messages say it: all_gather_into_tensor is an all_gather."""
    return next(k for prefix, k in KINDS if name.replace("_", "").startswith(prefix))


def check_sent(name: str, when: str, calls, need: float, tp: int, advice: str) -> None:
    """Fail when ``calls`` (``Collectives.calls``) send more numbers per rank than ``need``."""
    sent = sum(ring(op, n, tp) for op, n, _ in calls)
    if sent > need * (1 + 1e-9):
        listed = ", ".join(f"{kind(op)} of {n} numbers" for op, n, _ in calls)
        raise Fail(f"{name}: values and gradients are right, but its {when} sends {sent:g} numbers per rank where "
                   f"{need:g} are enough: {advice} (measured: {listed}; {RING})")


def _kept(module):
    """(name, tensor) for every tensor ``module`` and its submodules keep: parameters and their gradients, buffers,
    tensor attributes (also inside a list, tuple or dict attribute)."""
    import torch
    for prefix, m in module.named_modules():
        pre = f"{prefix}." if prefix else ""
        for attr, value in vars(m).items():
            if isinstance(value, torch.Tensor):
                items = [(attr, value)]
            elif isinstance(value, dict):
                inner = attr in ("_parameters", "_buffers")
                items = [(k if inner else f"{attr}[{k!r}]", v) for k, v in value.items()]
            elif isinstance(value, (list, tuple)):
                items = [(f"{attr}[{i}]", v) for i, v in enumerate(value)]
            else:
                continue
            for key, t in items:
                if isinstance(t, torch.Tensor):
                    yield pre + key, t
                    if isinstance(t, torch.nn.Parameter) and t.grad is not None:
                        yield f"{pre}{key}.grad", t.grad


def check_held(name: str, module, shards: dict) -> None:
    """Fail when a storage behind ``module``'s tensors holds more than the parameter ``shards`` ({name: shape}) and
    gradients in it by at least the smallest shard (a stray scalar is not worth a message)."""
    import math
    storages: dict = {}   # data_ptr -> [bytes, bytes of shards and gradients in it, (name, tensor) in it]
    for key, t in _kept(module):
        st = t.untyped_storage()
        if st.nbytes():
            entry = storages.setdefault(st.data_ptr(), [st.nbytes(), 0, []])
            entry[1] += t.numel() * t.element_size() if key in shards or key.endswith(".grad") else 0
            entry[2].append((key, t))
    itemsize = 8   # the cases run in float64
    need = 2 * sum(math.prod(s) for s in shards.values()) * itemsize   # the shards and their gradients
    least = min(math.prod(s) for s in shards.values()) * itemsize
    what = [f".{key} {list(t.shape)}" + (f" is a view of a tensor of {nbytes // itemsize} numbers" if key in shards
                                        else "")
            for nbytes, used, kept in storages.values() if nbytes - used >= least
            for key, t in kept if not key.endswith(".grad")]
    if what:
        total = sum(nbytes for nbytes, _, _ in storages.values())
        raise Fail(f"{name} keeps {total} bytes per rank where its shards and their gradients need {need}: "
                   f"{'; '.join(what)}. Keep only this rank's shards: create each at its own size (a slice of a whole "
                   f"tensor keeps the whole alive: .clone() it, or draw the shard alone), and no other tensor (a "
                   f"whole-size copy, a cached activation) "
                   f"(measured: the storage behind its parameters, their gradients and every tensor it holds)")
