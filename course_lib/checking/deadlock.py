"""A deadlock, known in seconds: every rank of a launch waits in communication and none has finished a call for a
few seconds.

A matched send, receive or collective of the tensors a check moves ends in milliseconds, even on a loaded machine;
a rank whose partner never makes the matching call waits until a deadline. So waiting out the deadline is not the
only way to know: when every rank waits, and has waited for ``grace`` seconds, no rank can free another. A rank
that is only slow (computing, or not scheduled on a busy machine) is not waiting in a call, so no deadlock is called
while it works.

On a busy machine a matched call may wait longer for a starved partner, so the grace is stretched by the load
(``Stalls.slowdown``), unless every rank has also used no CPU for the grace: a starved rank works whenever it gets a
core, and a matched call moves data on one side or the other, while a rank stuck in a call sleeps (about 2 ms of
CPU a second). The load average lags a minute behind the machine, so that stretch alone kept a deadlock on a
machine just gone quiet waiting four times the grace.

The ranks learn of each other through a folder they share (one per launch): ``waiting-<rank>`` holds when its
current call began, when that was last confirmed and since when the rank has used no CPU in it; ``deadlock`` is
written by the first rank that sees it, so the others report where they wait too; ``reported-<rank>`` says a rank
has, so that none exits (which would break its partners' wait with a closed connection) before every rank has said
where it waits.

``Waits`` notes the call this process waits in: the checking worker wraps torch.distributed's ``Work.wait`` (every
blocking send, receive and collective ends there), a ProcessGroup's send and recv (posting one may wait to connect;
a peer outside the group is refused there) and ``new_group`` (its rendezvous waits for every rank); the DDP
probe (``ddp/probe.py``) notes its own wrapped calls and uses ``Stalls`` alone.
"""
from __future__ import annotations

import functools
import os
import threading
import time
from pathlib import Path

from course_lib.checking.watchdog import Watchdog, core_share

FOLDER_ENV = "COURSE_WAITS_DIR"    # the launch's shared folder; without it no deadlock is called early


class Stalls:
    """What this rank knows of the waits of a launch's ``world`` ranks (the files in ``folder``)."""

    BLOCKED = 0.5     # a call that has lasted this long is waiting (not merely moving data)
    FRESH = 1.0       # a rank's file confirmed within this long is believed (an older one: its rank may be starved)
    BUSY = 0.02       # CPU seconds that end a rank's quiet (a rank stuck in a call: about 2 ms a second)

    def __init__(self, folder, rank: int, world: int, ended=None, by_load: bool = True):
        self.folder, self.rank, self.world = Path(folder), rank, world
        self.ended = ended or (lambda r: False)     # ended(r): rank r has ended (it will never free anyone)
        self.by_load = by_load
        self._written: tuple | None = None
        self._quiet: tuple | None = None            # (since, quiet since, the CPU time then) of the current wait

    def slowdown(self) -> float:
        """How much longer than on an idle machine a wait may take now (1 to 1/SLOWEST, from the load; 1 when
        the times are not stretched by the load)."""
        return 1.0 / max(Watchdog.SLOWEST, core_share()) if self.by_load else 1.0

    def note(self, since: float | None) -> None:
        """This rank waits in a call that began at ``since`` (``time.monotonic``), or None: not waiting."""
        path = self.folder / f"waiting-{self.rank}"
        now = time.monotonic()
        if since is None or now - since < self.BLOCKED:
            if self._written is not None:
                path.unlink(missing_ok=True)
                self._written = None
            return
        cpu = time.process_time() - time.thread_time()   # the process's work, less this thread's own (the watcher)
        if self._quiet is None or self._quiet[0] != since or cpu - self._quiet[2] > self.BUSY:
            self._quiet = (since, now, cpu)
        quiet = self._quiet[1]
        if self._written and self._written[:2] == (since, quiet) and now - self._written[2] < self.FRESH / 3:
            return
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(f"{since} {now} {quiet}")
        os.replace(tmp, path)      # a reader never sees half a file
        self._written = (since, quiet, now)

    def everyone_waiting(self, grace: float) -> bool:
        """Every rank waits in a call it began more than ``grace`` seconds ago (times the load's slowdown; its word
        confirmed within FRESH times it), or in which it has used no CPU for ``grace`` seconds (its word confirmed
        within FRESH), or has ended."""
        now, slow = time.monotonic(), self.slowdown()
        for r in range(self.world):
            try:
                since, stamp, quiet = map(float, (self.folder / f"waiting-{r}").read_text().split())
            except (OSError, ValueError):
                if self.ended(r):
                    continue
                return False
            waited = now - since >= grace * slow and now - stamp <= self.FRESH * slow
            if not (waited or now - quiet >= grace and now - stamp <= self.FRESH):
                return False
        return self.world > 1

    def announce(self) -> None:
        (self.folder / "deadlock").touch()

    def announced(self) -> bool:
        return (self.folder / "deadlock").exists()

    def reported(self) -> None:
        (self.folder / f"reported-{self.rank}").touch()

    def settle(self, seconds: float = 2.0) -> None:
        """Wait (``seconds`` at most, times the load's slowdown) until every rank that was still waiting has said
        where it waits."""
        end = time.monotonic() + seconds * self.slowdown()
        while time.monotonic() < end:
            if all((self.folder / f"reported-{r}").exists() or self.ended(r) for r in range(self.world)):
                return
            time.sleep(0.05)


class Waits:
    """The communication call this process waits in now: ``since`` (None when in none). Calls inside a call (the
    waits of a new_group) count as the outer one."""

    def __init__(self):
        self._depth = 0
        self.since: float | None = None
        self._lock = threading.Lock()

    def wrap(self, fn):
        @functools.wraps(fn)
        def waiting(*args, **kwargs):
            with self._lock:
                self._depth += 1
                if self._depth == 1:
                    self.since = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self._depth -= 1
                    if self._depth == 0:
                        self.since = None
        return waiting

    def install(self) -> Waits:
        """Wrap torch.distributed's blocking points, for the rest of this process (before the learner's file is
        imported, so that a ``from torch.distributed import new_group`` binds the wrapper too)."""
        # deferred: ddp/probe and the checker's runner import this module, and neither imports torch
        import torch._C._distributed_c10d as c
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        dist.Work.wait = self.wrap(dist.Work.wait)
        new_group = self.wrap(c10d.new_group)
        dist.new_group = c10d.new_group = new_group
        # gloo connects a send's or receive's pair on first use, inside the call that posts it (isend, irecv):
        # to a rank that never answers, that call itself waits
        for name in ("send", "recv"):
            if name in vars(c.ProcessGroup):
                setattr(c.ProcessGroup, name, self.wrap(peer_checked(name, vars(c.ProcessGroup)[name])))
        return self


def peer_checked(name: str, fn):
    """A ProcessGroup's send or recv ``fn(group, tensors, peer, tag)`` that refuses a peer outside the group, as
    gloo does not: it reads past its table of peers (a wait for a rank that never comes, or a crash)."""
    def call(group, tensors, peer, *args, **kwargs):
        if not 0 <= peer < group.size():
            raise ValueError(f"Invalid peer rank {peer} for {'isend/send' if name == 'send' else 'irecv/recv'}: "
                             f"the group has ranks 0..{group.size() - 1}")
        return fn(group, tensors, peer, *args, **kwargs)
    return call


class Deadlock:
    """The early trigger of a rank's ``Watchdog``: ``__call__`` (once a tick) notes this rank's wait and says when
    the launch is deadlocked."""

    GRACE = 2.0

    def __init__(self, stalls: Stalls, waits: Waits, grace: float = GRACE):
        self.stalls, self.waits, self.grace = stalls, waits, grace

    def __call__(self) -> bool:
        since = self.waits.since
        self.stalls.note(since)
        if since is None or time.monotonic() - since < Stalls.BLOCKED:
            return False
        if self.stalls.announced():
            return True
        if self.stalls.everyone_waiting(self.grace):
            self.stalls.announce()
            return True
        return False

    def after_report(self) -> None:
        """This rank said where it waits: let the others say it too before it exits."""
        self.stalls.reported()
        self.stalls.settle()

    @classmethod
    def from_env(cls, rank: int, world: int) -> Deadlock | None:
        """The trigger for a rank of a launch that gave the ranks a shared folder; None without one."""
        folder = os.environ.get(FOLDER_ENV)
        if not folder or world < 2:
            return None
        return cls(Stalls(folder, rank, world), Waits().install())
