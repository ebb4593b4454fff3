"""What a check case raises, and how an exception from the learner's code is put in one line."""
from __future__ import annotations

from course_lib.core import rankkit


class Fail(Exception):
    """A check failed; the message says what is wrong in the learner's terms."""


class Missing(Exception):
    """The learner's file lacks a name the check needs."""


def need(mod, name):
    if not hasattr(mod, name):
        raise Missing(f"tp.py has no `{name}` (keep the names of the starter file)")
    return getattr(mod, name)


def explain(exc, path):
    """One line for an exception raised by the learner's code, pointing at their tp.py when it can."""
    return rankkit.explain(exc, path, "tp.py")
