"""What a rank writes, and a crash in the middle of a write: the tools of the checkpoint checker's worker.

Each also rebinds names the learner's module took at import (``from torch import save``, ``from os import replace``).
"""
import builtins
import contextlib
import hashlib
import io
import os
import sys

CRASH_CODE = 86
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def is_file(f) -> bool:
    """A path or an open file: not a buffer in memory (torch.distributed pickles objects through torch.save too)."""
    if isinstance(f, (str, bytes, os.PathLike)):
        return True
    try:
        f.fileno()
    except (AttributeError, OSError, ValueError):   # io.UnsupportedOperation is an OSError and a ValueError
        return False
    return True


def _target(f) -> str:
    if isinstance(f, (str, bytes, os.PathLike)):
        return os.fsdecode(f)
    name = getattr(f, "name", type(f).__name__)
    if isinstance(name, int):           # os.fdopen(fd): the file's name is its descriptor; the path is in /proc
        try:
            return os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass
    return str(name)


class _Patch:
    """Replace attributes (module, name) -> function while active; also in the learner's module namespace."""

    def __init__(self, learner):
        self.learner = learner
        self._saved: list = []

    def _set(self, module, name, fn):
        """Put ``fn`` in place of ``module.name``; the original."""
        original = getattr(module, name)
        self._saved.append((module, name, original))
        setattr(module, name, fn)
        for key, value in list(vars(self.learner).items()):
            if value is original:
                self._saved.append((self.learner, key, value))
                setattr(self.learner, key, fn)
        return original

    def _set_torch(self, name, fn):
        """``_set`` for torch.save or torch.load, also where torch.serialization keeps it; the original."""
        import torch
        import torch.serialization as ser
        self._set(ser, name, fn)
        return self._set(torch, name, fn)

    def __exit__(self, *exc) -> bool:
        for module, name, original in reversed(self._saved):
            setattr(module, name, original)
        self._saved.clear()
        return False


class WriteAudit(_Patch):
    """``with WriteAudit(learner) as audit: ...`` -> ``audit.writes``: [(how, path)] in order (open, os.open,
    torch.save, renames), and ``audit.renames``: where each rename came from and whether it was fsynced first (a
    write judged for a cluster's file system, not only for this disk)."""

    def __enter__(self) -> "WriteAudit":
        self.writes: list[tuple[str, str]] = []
        self.renames: list[tuple[str, str, bool]] = []     # (from, to, fsynced before the rename)
        synced: set[str] = set()
        real_open, real_os_open, real_fsync = builtins.open, os.open, os.fsync

        def moving(how, real):          # os.replace and os.rename: a write of ``dst``, and where it came from
            def audited_move(src, dst, *args, **kwargs):
                self.writes.append((how, _target(dst)))
                source = os.path.realpath(_target(src))
                self.renames.append((source, os.path.realpath(_target(dst)), source in synced))
                return real(src, dst, *args, **kwargs)
            return audited_move

        def audited_fsync(fd):
            fd = fd if isinstance(fd, int) else fd.fileno()
            try:
                synced.add(os.path.realpath(os.readlink(f"/proc/self/fd/{fd}")))
            except OSError:            # no /proc (not Linux): a rename then counts as not fsynced
                pass
            return real_fsync(fd)

        def audited_open(file, mode="r", *args, **kwargs):
            if any(c in mode for c in "wax+") and not isinstance(file, int):
                self.writes.append(("open", _target(file)))
            return real_open(file, mode, *args, **kwargs)

        def audited_os_open(path, flags, *args, **kwargs):
            if flags & WRITE_FLAGS:
                self.writes.append(("os.open", _target(path)))
            return real_os_open(path, flags, *args, **kwargs)

        def audited_save(obj, f, *args, **kwargs):
            if is_file(f):
                self.writes.append(("torch.save", _target(f)))
            return real_save(obj, f, *args, **kwargs)

        for module, name, fn in ((builtins, "open", audited_open), (io, "open", audited_open),
                                 (os, "open", audited_os_open), (os, "replace", moving("os.replace", os.replace)),
                                 (os, "rename", moving("os.rename", os.rename)), (os, "fsync", audited_fsync)):
            self._set(module, name, fn)
        real_save = self._set_torch("save", audited_save)
        return self


class LoadAudit(_Patch):
    """``with LoadAudit(learner) as audit: ...`` -> ``audit.weights_only``: the ``weights_only`` of each torch.load
    (None where it was left to torch's default, True since torch 2.6)."""

    def __enter__(self) -> "LoadAudit":
        self.weights_only: list = []

        def audited_load(f, *args, **kwargs):
            if is_file(f):
                self.weights_only.append(kwargs.get("weights_only"))
            return real_load(f, *args, **kwargs)

        real_load = self._set_torch("load", audited_load)
        return self


class PathWatch(_Patch):
    """``with PathWatch(learner, path) as watch: ...`` -> ``watch.states``: [(call, sha256 of ``path`` or None where
    there was no file)], taken right after each call that named ``path`` (open, os.open, os.remove/unlink, a rename
    from or onto it, torch.save): what a crash at that moment would have left there."""

    CALLS = ((builtins, "open", (0,)), (io, "open", (0,)), (os, "open", (0,)), (os, "remove", (0,)),
             (os, "unlink", (0,)), (os, "rename", (0, 1)), (os, "replace", (0, 1)))

    def __init__(self, learner, path):
        super().__init__(learner)
        self.path = os.path.realpath(path)

    def __enter__(self) -> "PathWatch":
        import torch
        self.states: list[tuple[str, str | None]] = []
        real_open = builtins.open

        def sha() -> str | None:        # the real open: the watched one would watch itself
            try:
                with real_open(self.path, "rb") as f:
                    return hashlib.sha256(f.read()).hexdigest()
            except FileNotFoundError:
                return None

        def watched(name, real, where):
            def call(*args, **kwargs):
                named = [_target(args[i]) for i in where
                         if i < len(args) and isinstance(args[i], (str, bytes, os.PathLike))]
                try:
                    return real(*args, **kwargs)
                finally:
                    if any(os.path.realpath(p) == self.path for p in named):
                        shown = ", ".join(os.path.basename(p) for p in named)
                        self.states.append((f"{name}({shown})", sha()))
            return call

        for module, name, where in self.CALLS:
            label = "open" if name == "open" and module is not os else f"os.{name}"
            self._set(module, name, watched(label, getattr(module, name), where))
        self._set_torch("save", watched("torch.save", torch.save, (1,)))
        return self


@contextlib.contextmanager
def one_rank_per_node(rank: int, world: int):
    """The environment of rank ``rank`` in a job of ``world`` nodes with one rank each, as torchrun and srun set it:
    the local rank is 0 on every node, so a writer chosen by its local rank writes on every node."""
    env = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank), "SLURM_LOCALID": "0",
           "SLURM_NODEID": str(rank), "SLURM_NNODES": str(world), "SLURM_JOB_NUM_NODES": str(world),
           "SLURM_NTASKS_PER_NODE": "1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class CrashingSave(_Patch):
    """While active, ``torch.save`` writes half of its bytes, calls ``on_crash(target)``, and the process dies (as
    if the node went down mid-write: what is left on disk shows whether the write was atomic)."""

    def __init__(self, learner, on_crash):
        super().__init__(learner)
        self.on_crash = on_crash

    def __enter__(self) -> "CrashingSave":
        def crashing_save(obj, f, *args, **kwargs):
            if not is_file(f):
                return real_save(obj, f, *args, **kwargs)
            buf = io.BytesIO()
            real_save(obj, buf, *args, **kwargs)
            data = buf.getvalue()
            half = data[: len(data) // 2]
            if isinstance(f, (str, bytes, os.PathLike)):
                with builtins.open(f, "wb") as out:
                    out.write(half)
            else:
                f.write(half)
                f.flush()
            self.on_crash(_target(f))
            sys.stdout.flush()
            os._exit(CRASH_CODE)

        real_save = self._set_torch("save", crashing_save)
        return self
