"""What the learner's own_ddp.py does, measured while the checker's cases run it: its all-reduces and broadcasts
(``Recorder``), their waits, when backward produced each gradient, and what the wrapper holds between steps
(``held``)."""


class Handle:
    """The Work an async all-reduce returns, with its ``wait`` seen by the recorder; ``touched`` once the learner's
    code called anything on it (wait, get_future, is_completed, ...): one never touched was never waited on."""

    def __init__(self, work, log, tensor):
        self._work, self._log = work, log
        self.touched = self.changed = False
        self._tensor, self._version = tensor, tensor._version   # bumped by every in-place change in Python

    def wait(self, *args, **kwargs):
        self._log.append(("wait",))
        if not self.touched:      # changed before this first wait: while the all-reduce could still run
            self.changed = self._tensor._version != self._version
        self.touched = True
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):
        self.touched = True
        return getattr(self._work, name)


class Recorder:
    """Replaces dist.all_reduce, dist.broadcast and dist.reduce with functions that log ("all_reduce", numel,
    async) / ("broadcast", numel) / ("reduce", numel) and call the real ones (calls on the harness's own group
    ``sync`` are not logged); ``grads(model)`` logs ("grad", numel) each time backward finishes a gradient (a hook
    registered before the learner's, so it runs first). ``works``: the handles of the async all-reduces since the
    last ``take``."""

    NAMES = ("all_reduce", "broadcast", "reduce")   # reduce: a reduce + broadcast in place of an all-reduce
    current: "Recorder | None" = None    # one per rank process: a second would log every call twice

    def __init__(self, sync):
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        self.log: list[tuple] = []
        self.works: list[Handle] = []
        self.sync = sync
        self.real = {name: getattr(dist, name) for name in self.NAMES}
        self.wrapped = {name: self._wrap(name) for name in self.NAMES}
        for module in (dist, c10d):
            for name in self.NAMES:
                setattr(module, name, self.wrapped[name])

    @classmethod
    def installed(cls, sync) -> "Recorder":
        if cls.current is None:
            cls.current = cls(sync)
        return cls.current

    def bind(self, mod) -> None:
        """The learner's module was imported before the Recorder existed: a ``from torch.distributed import
        all_reduce`` there holds the real function; give it the recorded one."""
        for attr, value in list(vars(mod).items()):
            for name, real in self.real.items():
                if value is real:
                    setattr(mod, attr, self.wrapped[name])

    def _wrap(self, name):
        real = self.real[name]

        def recorded(tensor, *args, **kwargs):
            if kwargs.get("group") is self.sync:
                return real(tensor, *args, **kwargs)
            is_async = bool(kwargs.get("async_op"))
            self.log.append((name, tensor.numel(), is_async) if name == "all_reduce" else (name, tensor.numel()))
            work = real(tensor, *args, **kwargs)
            if work is None:
                return None
            handle = Handle(work, self.log, tensor)
            if name == "all_reduce":
                self.works.append(handle)
            return handle
        return recorded

    def grads(self, model):
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda p: self.log.append(("grad", p.numel())))

    def unwaited(self) -> tuple[int, int, int]:
        """(async all-reduces since the last ``take`` that nothing was called on, those whose tensor was changed in
        place before their wait, all of them)."""
        return sum(not h.touched for h in self.works), sum(h.changed for h in self.works), len(self.works)

    def take(self):
        log, self.log, self.works = self.log, [], []
        return log


def held(ddp) -> dict:
    """{attribute of the wrapper: distinct tensors and all-reduce handles reachable from it}, through lists,
    tuples, sets, dicts and plain objects, not through the wrapped model (its parameters are the same every step):
    what a step appends and never drops shows as a count that grows from step to step."""
    import torch
    seen = set()

    def count(x, depth):
        if id(x) in seen or depth > 6:
            return 0
        seen.add(id(x))
        if isinstance(x, (torch.Tensor, Handle)):
            return 1
        if isinstance(x, dict):
            items = [*x.keys(), *x.values()]
        elif isinstance(x, (list, tuple, set, frozenset)):
            items = x
        elif hasattr(x, "__dict__") and not isinstance(x, (type, torch.nn.Module)) and not callable(x):
            items = vars(x).values()
        else:
            return 0
        return sum(count(y, depth + 1) for y in items)
    return {name: count(value, 0) for name, value in vars(ddp).items() if name != "_modules"}
