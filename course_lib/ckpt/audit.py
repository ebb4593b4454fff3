"""What a rank writes and reads: the tools of the checkpoint checker's worker (the crash itself: crash.py).

Each also rebinds names the learner's module took at import (``from torch import save``, ``from os import replace``).
"""
import builtins
import hashlib
import io
import os
import pickle

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


def target(f) -> str:
    if isinstance(f, (str, bytes, os.PathLike)):
        return os.fsdecode(f)
    name = getattr(f, "name", type(f).__name__)
    if isinstance(name, int):           # os.fdopen(fd): the file's name is its descriptor; the path is in /proc
        try:
            return os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass
    return str(name)


class Patch:
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


class WriteAudit(Patch):
    """``with WriteAudit(learner) as audit: ...`` -> ``audit.writes``: [(how, path)] in order (open, os.open,
    torch.save, renames), and ``audit.renames``: [(from, to, fsync, bytes at the fsync, bytes at the rename)], fsync
    "yes" when the file was fsynced after its last write, "early" when it changed after its last fsync, "no" when
    never: a write judged for a node's crash and a cluster's file system, not only for this disk."""

    def __enter__(self) -> "WriteAudit":
        self.writes: list[tuple[str, str]] = []
        self.renames: list[tuple] = []
        synced: dict[str, tuple] = {}     # path -> (size, mtime) at its last fsync: a later write changes them
        real_open, real_os_open, real_fsync = builtins.open, os.open, os.fsync

        def moving(how, real):          # os.replace and os.rename: a write of ``dst``, and where it came from
            def audited_move(src, dst, *args, **kwargs):
                self.writes.append((how, target(dst)))
                source = os.path.realpath(target(src))
                now, then = _size_and_time(source), synced.get(source)
                state = "no" if then is None else "yes" if then == now else "early"
                self.renames.append((source, os.path.realpath(target(dst)), state, then and then[0], now and now[0]))
                return real(src, dst, *args, **kwargs)
            return audited_move

        def audited_fsync(fd):
            fd = fd if isinstance(fd, int) else fd.fileno()
            done = real_fsync(fd)
            try:
                st = os.fstat(fd)
                synced[os.path.realpath(os.readlink(f"/proc/self/fd/{fd}"))] = (st.st_size, st.st_mtime_ns)
            except OSError:            # no /proc (not Linux): a rename then counts as not fsynced
                pass
            return done

        def audited_open(file, mode="r", *args, **kwargs):
            if any(c in mode for c in "wax+") and not isinstance(file, int):
                self.writes.append(("open", target(file)))
            return real_open(file, mode, *args, **kwargs)

        def audited_os_open(path, flags, *args, **kwargs):
            if flags & WRITE_FLAGS:
                self.writes.append(("os.open", target(path)))
            return real_os_open(path, flags, *args, **kwargs)

        def audited_save(obj, f, *args, **kwargs):
            if is_file(f):
                self.writes.append(("torch.save", target(f)))
            return real_save(obj, f, *args, **kwargs)

        for module, name, fn in ((builtins, "open", audited_open), (io, "open", audited_open),
                                 (os, "open", audited_os_open), (os, "replace", moving("os.replace", os.replace)),
                                 (os, "rename", moving("os.rename", os.rename)), (os, "fsync", audited_fsync)):
            self._set(module, name, fn)
        real_save = self._set_torch("save", audited_save)
        return self


def _size_and_time(path) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


class LoadAudit(Patch):
    """``with LoadAudit(learner) as audit: ...`` -> ``audit.weights_only``: the ``weights_only`` of each torch.load
    (None where it was left to torch's default, True since torch 2.6), ``audit.read``: the files torch.load read,
    ``audit.unpickled``: the files pickle.load read (it runs whatever code the file holds)."""

    def __enter__(self) -> "LoadAudit":
        self.weights_only: list = []
        self.read: list[str] = []
        self.unpickled: list[str] = []

        def audited_load(f, *args, **kwargs):
            if is_file(f):
                self.weights_only.append(kwargs.get("weights_only"))
                self.read.append(target(f))
            return real_load(f, *args, **kwargs)

        def audited_unpickle(f, *args, **kwargs):
            if is_file(f):
                self.unpickled.append(target(f))
            return real_unpickle(f, *args, **kwargs)

        real_load = self._set_torch("load", audited_load)
        real_unpickle = self._set(pickle, "load", audited_unpickle)
        return self


class PathWatch(Patch):
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
                named = [target(args[i]) for i in where
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
