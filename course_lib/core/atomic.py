"""Atomic file writes: a reader (or a crash) sees the old file or the new one, never half of one.

The data goes to a temporary file in the same folder (so the rename stays on one file system), is
flushed to disk, then renamed over the target with ``os.replace``. On an error the temporary file is
removed and the target is left as it was.
"""
import os
import secrets
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_writer(path, mode: str = "w", **open_kwargs):
    """``with atomic_writer(path) as f: f.write(...)``: the file appears at ``path`` only when the block ends
    without an error. ``mode`` is "w" or "wb"; ``open_kwargs`` go to ``open`` (encoding, newline, ...)."""
    if mode not in ("w", "wb", "wt"):
        raise ValueError(f"atomic_writer writes a whole new file: mode must be 'w' or 'wb', not {mode!r}")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    # os.open with 0o666 lets the umask decide the permissions, as a plain open() would
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, mode, **open_kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path, text: str, encoding: str = "utf-8") -> None:
    with atomic_writer(path, "w", encoding=encoding) as f:
        f.write(text)


def write_bytes(path, data: bytes) -> None:
    with atomic_writer(path, "wb") as f:
        f.write(data)
