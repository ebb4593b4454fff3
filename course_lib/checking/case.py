"""What an exercise's cases module is made of: ``Case``, what a case raises, and the ``Ctx`` it is called with.

A case runs on every rank of one launch, with the learner's module loaded. It returns a short pass text (or
``(text, figures)``), or raises ``Fail`` / ``Missing`` with a message in the learner's terms; any other exception
is the learner's code raising, explained with the line of their file it came from.
"""
from dataclasses import dataclass
from typing import Callable

from course_lib.core.rankkit import emit


@dataclass(frozen=True)
class Case:
    name: str                  # unique within one world size; the harness's id is "name@W"
    item: str                  # the verdict it counts towards (a function, a layer, a step)
    run: Callable              # run(ctx) -> pass text | (pass text, figures) | None
    label: str = ""            # how a message names the setting: "W=2, 1,009 elements, float32"

    def key(self, world: int) -> str:
        return f"{self.name}@{world}"


class Fail(Exception):
    """A check failed; the message says what is wrong in the learner's terms. ``kind`` tells the harness how the
    ranks were left: "todo" (not written yet: nothing in flight), "peer_gone" (a partner's process ended first)."""

    def __init__(self, message: str, kind: str = "fail", where: str = "", figures: dict | None = None):
        super().__init__(message)
        self.kind, self.where, self.figures = kind, where, figures or {}


class Missing(Exception):
    """The learner's file lacks a name the check needs."""


class OtherRank(Fail):
    """This rank was fine; another one failed the same sub-case."""


def flat(params):
    """The values of ``params`` as one detached vector. Not parameters_to_vector: it ``view``s each one, and a
    learner's code may leave a parameter non-contiguous (gloo sends and reduces those too)."""
    import torch  # deferred: a case module is imported by the harness before torch
    return torch.cat([p.detach().reshape(-1) for p in params])


def need(mod, name: str, file: str):
    """The learner's ``name``, or ``Missing`` naming their ``file``."""
    if not callable(getattr(mod, name, None)):
        raise Missing(f"{file} has no `{name}` (keep the names of the starter file)")
    return getattr(mod, name)


class Ctx:
    """What a case gets: the learner's module, this rank, W, the guard's counts, agreement between ranks.

    ``sync`` is the harness's own process group: its calls never pair with the learner's collectives."""

    def __init__(self, mod, path: str, guard, sync, passed: dict):
        import torch.distributed as dist  # deferred: the launcher, which imports no torch, reads this
        self.mod, self.path, self.guard, self.sync = mod, path, guard, sync
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.r = self.rank
        self.kw: dict = {}
        self.passed = passed            # item -> passed on every rank (in this launch or an earlier one)
        self.cache: dict = {}           # what cases of one launch share (process groups made once)
        self.current: dict = {}         # the case running now: its key, item, this rank (and file)

    def say(self, ok: bool, message: str = "", **fields) -> None:
        """This rank's verdict on the case running now (the harness says it when the case returns; a case whose
        rank is meant to die, as in a crash test, says it first)."""
        emit("verdict", **self.current, ok=ok, message=message, **fields)

    def need(self, name: str):
        """The learner's ``name``, or ``Missing`` naming the cases module's FILE (the worker sets ``file``)."""
        return need(self.mod, name, self.file)

    def take_counts(self) -> dict:
        """The collectives the learner's code called since the last take."""
        return self.guard.take()

    def agree(self, ok: bool) -> bool:
        """True when ``ok`` on every rank (a real all-reduce on the harness's group, not counted)."""
        import torch  # deferred: the launcher, which imports no torch, reads this
        flag = torch.tensor([0 if ok else 1])
        self.guard.original("all_reduce")(flag, group=self.sync)
        return int(flag) == 0

    def agree_or_fail(self, problem: str | None) -> None:
        """Every rank stops at the same sub-case: raise this rank's ``problem``, or ``OtherRank`` if only another
        rank had one."""
        if not self.agree(problem is None):
            raise Fail(problem) if problem else OtherRank("another rank failed this case")
