"""What the harness reads from an exercise's cases module: the plug-in protocol, typed, in one place.

``plugin(module)`` reads the module's protocol attributes into a ``Plugin`` (the defaults for those it leaves out)
and refuses the module, with ``ProtocolError``, when an attribute has the wrong type, a required one is missing, or
a name of the module looks like a misspelt protocol name that the module does not also define (``STOP_ITME``,
``stop_item``, ``HANG_HINT``): a typo would otherwise silently be the default. The registry calls it when it
imports a cases module (``Exercise.cases_module``), so a wrong name fails there, before any rank starts. Standard
library only: every rank's worker imports it.
"""
import difflib
from dataclasses import dataclass, field, fields
from types import ModuleType
from typing import Any, Callable

LOAD_TEXT = "{file} does not load{at}: {error}"


class ProtocolError(TypeError):
    """A cases module that does not follow the protocol; the message names the module, the name and the fix."""


@dataclass(frozen=True)
class Plugin:
    """A cases module as the harness sees it (README: "Add an exercise")."""
    FILE: str                          # the learner's file's name in messages
    LOAD_ITEM: str                     # the item that fails when the file does not load
    ITEMS: tuple                       # one verdict each, in this order
    WORLDS: tuple                      # the world sizes the cases run on
    GUARD: tuple                       # (collectives, "forbid" | "count") for course_lib.checking.guard
    cases: Callable                    # cases(world) -> [Case]
    LOAD_TEXT: str = LOAD_TEXT         # the load failure's message: {file}, {at}, {error}
    Ctx: Any = None                    # the context class each case gets (default course_lib.checking.case.Ctx)
    STOP_ITEM: bool = False            # an item's first failure is its verdict: its later cases do not run
    FRESH_AFTER_FAILURE: bool = False  # after a failure that may leave messages in flight, launch afresh
    STOP_AT_FAILURE: bool = False      # each case builds on the one before: the first failure ends the run
    ENV: Any = None                    # the ranks' environment (default course_lib.checking.runner.ENV)
    PRELOAD: tuple = ()                # modules the fork server imports once for every rank (runtime.warm.DDP_IMPORTS)
    FIRST_WORLDS: tuple = ()           # world sizes run before WORLDS (and before a caller's world_sizes)
    TIMEOUT: float = 180.0             # seconds for the runs on each world size
    CASE_TIMEOUT: float = 30.0         # seconds for each case
    PARALLEL: int = 1                  # world sizes run side by side
    HANG_HINTS: dict = field(default_factory=dict)   # item (or None: every item) -> the hint after a hang
    BUILT_ON: dict = field(default_factory=dict)     # item -> the items it builds on (their failure is said first)
    pass_text: Callable | None = None  # pass_text(item, records) -> the pass message
    hint: Callable | None = None       # hint(item, first failing record, records) -> text added to the failure
    module: Any = None                 # the module itself

    @property
    def name(self) -> str:
        return self.module.__name__ if self.module is not None else "?"


REQUIRED = ("FILE", "LOAD_ITEM", "ITEMS", "WORLDS", "GUARD", "cases")
NAMES = tuple(f.name for f in fields(Plugin) if f.name != "module")
# the types each attribute may have (a number may be an int; a sequence a list or a range)
TYPES = {"FILE": str, "LOAD_ITEM": str, "LOAD_TEXT": str, "ITEMS": (tuple, list), "WORLDS": (tuple, list, range),
         "FIRST_WORLDS": (tuple, list), "GUARD": (tuple, list), "STOP_ITEM": bool, "FRESH_AFTER_FAILURE": bool,
         "STOP_AT_FAILURE": bool, "ENV": dict, "PRELOAD": (tuple, list), "TIMEOUT": (int, float),
         "CASE_TIMEOUT": (int, float), "PARALLEL": int, "HANG_HINTS": dict, "BUILT_ON": dict, "Ctx": type}
CALLABLE = ("cases", "pass_text", "hint")

_seen: dict[str, Plugin] = {}


def _misspelt(name: str) -> str | None:
    """The protocol name that ``name`` (not one itself) looks like a typo of, if any."""
    if name in NAMES or name.startswith("_"):
        return None
    for known in NAMES:
        if name.lower() == known.lower():
            return known
    close = difflib.get_close_matches(name, NAMES, n=1, cutoff=0.85)
    return close[0] if close else None


def check_module(module: ModuleType) -> Plugin:
    """The module's Plugin; ProtocolError naming every problem found."""
    where = module.__name__
    values = vars(module)
    problems = []
    for name in values:
        known = _misspelt(name)
        if known and known not in values:   # (beside the name itself it is a name of the module's own: ckpt's WORLD)
            problems.append(f"{name} is not a name the harness reads: did you mean {known}?")
    for name in REQUIRED:
        if name not in values:
            problems.append(f"it has no {name} (the harness needs {', '.join(REQUIRED)})")
    for name, kinds in TYPES.items():
        if name in values and not isinstance(values[name], kinds):
            want = " or ".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
            problems.append(f"{name} is of type {type(values[name]).__name__}, not {want}")
    for name in CALLABLE:
        if name in values and not callable(values[name]):
            problems.append(f"{name} is of type {type(values[name]).__name__}, not a function")
    if problems:
        raise ProtocolError(f"{where} does not follow the checking protocol (course_lib/checking/protocol.py):\n  "
                            + "\n  ".join(problems))
    given = {n: values[n] for n in NAMES if n in values}
    for name in ("ITEMS", "WORLDS", "FIRST_WORLDS", "GUARD"):
        if name in given and not isinstance(given[name], tuple):
            given[name] = tuple(given[name])
    return Plugin(**given, module=module)


def plugin(spec) -> Plugin:
    """``spec`` (a cases module, or a Plugin already) as a Plugin, checked once per module."""
    if isinstance(spec, Plugin):
        return spec
    found = _seen.get(spec.__name__)
    if found is None or found.module is not spec:
        found = _seen[spec.__name__] = check_module(spec)
    return found
