"""What an enclosing run (a check) imposes on every launch inside it (course_lib.runtime.launch): a deadline, so
that a check with several launches ends by its overall deadline without a second thread, and an engine (a check
that runs here keeps its runs here)."""
import contextlib
import time
from dataclasses import dataclass


@dataclass
class Scope:
    deadline: float | None = None     # time.monotonic() by which every launch inside must have ended
    engine: str | None = None         # "local": the launches run here whatever the site says
    cut: bool = False                 # a launch inside timed out at this deadline rather than at its own


# process-wide, not a contextvar: a checker runs its launches in worker threads too (a process runs one check at
# a time: the kernel, the grader's sandbox, a check job)
_scopes: list[Scope] = []


@contextlib.contextmanager
def scope(seconds: float | None = None, engine: str | None = None):
    """``with scope(600):`` every launch inside ends within 600 s from now, each by min(its own timeout, what is
    left); ``engine="local"`` keeps them on this machine. Yields the Scope (``.cut``: a launch was cut short)."""
    s = Scope(None if seconds is None else time.monotonic() + seconds, engine)
    _scopes.append(s)
    try:
        yield s
    finally:
        _scopes.remove(s)


def bounded(timeout: float) -> tuple[float, list[Scope]]:
    """``timeout`` cut to what is left of the enclosing scopes' deadlines, and the scopes that cut it."""
    now = time.monotonic()
    cutting = [s for s in _scopes if s.deadline is not None and s.deadline - now < timeout]
    return min([timeout] + [max(0.0, s.deadline - now) for s in cutting]), cutting


def scoped_engine() -> str | None:
    """The innermost scope's engine, if one sets it."""
    return next((s.engine for s in _scopes[::-1] if s.engine), None)
