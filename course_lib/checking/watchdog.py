"""Deadlines inside a rank: a watchdog thread that says where the main thread waits, then ends the process."""
import os
import sys
import threading
import time
import traceback
from typing import Callable

from course_lib.core.rankkit import exit_now


def main_thread_frames() -> list[traceback.FrameSummary]:
    """Where the main thread is now, outermost first (from another thread: a watchdog's)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    return traceback.extract_stack(frame) if frame is not None else []


class Watchdog:
    """A deadline for one piece of work: if it is not over in time, ``on_fire`` says where the main thread
    waits (it gets ``main_thread_frames()`` and the arguments of ``arm``), then the process exits.

    The deadline is kept on a clock of a core's fair share (``core_share``): while the machine's load is above
    its cores, it runs slower, by at most SLOWEST, so work that is only slow because the machine is busy (a room
    of learners on one node, CI) is not called stuck. A real hang waits on an idle machine as on a
    busy one: it fires, later on a busy one. The launch's own deadline still bounds the whole run.

    ``early`` (optional, ``deadlock.Deadlock``): asked once a tick; when it says the launch is deadlocked, the
    watchdog fires at once, ``on_fire`` getting ``deadlock=True``, and waits for ``early.after_report()``
    (the other ranks say where they wait) before the process exits."""

    TICK = 0.1
    SLOWEST = 0.25

    def __init__(self, seconds: float, on_fire: Callable[..., None], exit_code: int = 3, early=None):
        self.seconds, self.on_fire, self.exit_code, self.early = seconds, on_fire, exit_code, early
        self._stop: threading.Event | None = None

    def arm(self, *args) -> None:
        self.disarm()
        self._stop = threading.Event()
        threading.Thread(target=self._count, args=(self._stop, args), daemon=True).start()

    def disarm(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def _count(self, stop: threading.Event, args) -> None:
        # the time that really passed, not TICK: on a busy machine this thread wakes late, and counting ticks made
        # each rank's clock as slow as its own wake-ups; two ranks of one deadlock then fired seconds apart, and
        # the first to exit had the launcher stop the other before it said where it waited (CI, four workers)
        left, last = self.seconds, time.monotonic()
        while left > 0:
            if stop.wait(self.TICK):
                return
            if self.early is not None and self.early():
                return self._fire(*args, deadlock=True)
            now = time.monotonic()
            left -= (now - last) * max(self.SLOWEST, core_share())
            last = now
        self._fire(*args)

    def _fire(self, *args, deadlock: bool = False) -> None:
        try:
            if deadlock:
                self.on_fire(main_thread_frames(), *args, deadlock=True)
                self.early.after_report()
            else:
                self.on_fire(main_thread_frames(), *args)
        finally:   # the main thread is stuck: whatever on_fire did, this process ends here
            exit_now(self.exit_code)


def core_share() -> float:
    """The share of a core a runnable process gets: cores / the 1-minute load average, at most 1 (1 where the
    load cannot be read). A smooth figure that every rank of a launch reads alike, so that their watchdogs
    fire together (one that fired first would end its rank, and its peers would see a closed connection)."""
    try:
        load = os.getloadavg()[0]
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    except OSError:
        return 1.0
    return min(1.0, cores / load) if load > 0 else 1.0
