"""A save that dies in the middle of its first write to a file, as if the node went down: what is left on disk shows
whether the write was atomic. The crash comes at the write itself, whoever writes: torch.save onto a path or an open
file, pickle.dump, or the learner's own f.write / os.write of bytes serialised in memory first."""
import builtins
import io
import os
import sys

from course_lib.ckpt.audit import WRITE_FLAGS, Patch, is_file, target

CRASH_CODE = 86


class _Dying:
    """An open file whose first write writes half its bytes, then kills the process (``die``)."""

    def __init__(self, raw, die):
        self._raw, self._die = raw, die

    def write(self, data):
        self._raw.write(data[: len(data) // 2])
        self._raw.flush()
        self._die(target(self._raw))

    def writelines(self, lines):
        lines = list(lines)
        if lines:
            self.write(lines[0][:0].join(lines))

    def __getattr__(self, name):
        return getattr(self._raw, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._raw.__exit__(*exc)

    def __iter__(self):
        return iter(self._raw)


class CrashingWrite(Patch):
    """While active, the first write to a file writes half of its bytes, calls ``on_crash(target)``, and the process
    dies."""

    def __init__(self, learner, on_crash):
        super().__init__(learner)
        self.on_crash = on_crash

    def die(self, where: str) -> None:
        self.on_crash(where)
        sys.stdout.flush()
        os._exit(CRASH_CODE)

    def __enter__(self) -> "CrashingWrite":
        real_open, real_os_open, real_write = builtins.open, os.open, os.write
        written: set = set()      # descriptors os.open opened for writing (tempfile.mkstemp's too)

        def crashing_save(obj, f, *args, **kwargs):
            if not is_file(f):
                return real_save(obj, f, *args, **kwargs)
            buf = io.BytesIO()
            real_save(obj, buf, *args, **kwargs)
            data = buf.getvalue()
            if isinstance(f, (str, bytes, os.PathLike)):
                with real_open(f, "wb") as out:
                    out.write(data[: len(data) // 2])
            else:
                getattr(f, "_raw", f).write(data[: len(data) // 2])
                getattr(f, "_raw", f).flush()
            self.die(target(f))

        def dying_open(file, mode="r", *args, **kwargs):
            f = real_open(file, mode, *args, **kwargs)
            return _Dying(f, self.die) if any(c in mode for c in "wax+") else f

        def watched_os_open(path, flags, *args, **kwargs):
            fd = real_os_open(path, flags, *args, **kwargs)
            if flags & WRITE_FLAGS:
                written.add(fd)
            return fd

        def dying_write(fd, data):
            if fd not in written:
                return real_write(fd, data)
            real_write(fd, data[: len(data) // 2])
            self.die(open_fd_name(fd))

        for module, name, fn in ((builtins, "open", dying_open), (io, "open", dying_open),
                                 (os, "open", watched_os_open), (os, "write", dying_write)):
            self._set(module, name, fn)
        real_save = self._set_torch("save", crashing_save)
        return self


def open_fd_name(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return str(fd)
