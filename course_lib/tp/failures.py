"""What a check case raises, and how an exception from the learner's code is put in one line."""
from __future__ import annotations

import traceback

from course_lib.core.rankkit import learner_frame


class Fail(Exception):
    """A check failed; the message says what is wrong in the learner's terms."""


class Missing(Exception):
    """The learner's file lacks a name the check needs."""


def need(mod, name):
    if not hasattr(mod, name):
        raise Missing(f"tp.py has no `{name}` (keep the names of the starter file)")
    return getattr(mod, name)


def explain(exc, path):
    """One line for an exception raised by the learner's code, pointing at their file when it can."""
    frame = learner_frame(traceback.extract_tb(exc.__traceback__), path)
    where = f" (tp.py line {frame.lineno}, in {frame.name})" if frame else ""
    if isinstance(exc, NotImplementedError):
        return f"not written yet: NotImplementedError{where}"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}{where}"
