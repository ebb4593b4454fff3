"""The early deadlock trigger (``checking.deadlock.Stalls``) with real rank processes and their real CPU times: on a
busy machine a deadlock whose ranks use no CPU is called after the grace, not after the grace stretched by the load;
ranks that work in their calls are still given the stretched grace."""
import subprocess
import sys
import time

import pytest

from course_lib.checking import deadlock
from course_lib.checking.deadlock import Stalls

GRACE = 2.0
SLOWDOWN = 4.0    # the load's largest stretch (a quarter of a core)

RANK = """
import sys, threading, time
from course_lib.checking.deadlock import Stalls
stalls = Stalls(sys.argv[1], int(sys.argv[2]), 2)
since = time.monotonic()

def watch():   # the rank's watchdog thread: it notes the wait the main thread is in
    while True:
        stalls.note(since)
        time.sleep(0.1)

threading.Thread(target=watch, daemon=True).start()
if sys.argv[3] == "sleeps":
    time.sleep(60)                                  # stuck in a call: no CPU
else:
    while time.monotonic() < since + 60:           # a call that moves data: CPU
        pass
"""


@pytest.fixture
def ranks(tmp_path):
    started = []

    def start(mode: str) -> Stalls:
        started.extend(subprocess.Popen([sys.executable, "-c", RANK, str(tmp_path), str(r), mode]) for r in (0, 1))
        return Stalls(tmp_path, 0, 2)
    yield start
    for p in started:
        p.kill()
        p.wait()


def waited(stalls: Stalls) -> float:
    """How long the rank that began its call last has waited in it (from the files the ranks write)."""
    return time.monotonic() - max(float((stalls.folder / f"waiting-{r}").read_text().split()[0]) for r in (0, 1))


def judged_within(stalls: Stalls, seconds: float) -> bool:
    """everyone_waiting(GRACE) turns true within ``seconds`` of both ranks waiting."""
    while not all((stalls.folder / f"waiting-{r}").exists() for r in (0, 1)):
        time.sleep(0.05)
    while waited(stalls) < seconds:
        if stalls.everyone_waiting(GRACE):
            return True
        time.sleep(0.05)
    return False


def test_a_deadlock_whose_ranks_use_no_cpu_is_called_before_the_load_stretched_grace(ranks, monkeypatch):
    monkeypatch.setattr(deadlock, "core_share", lambda: 1 / SLOWDOWN)   # a machine whose load average is high
    stalls = ranks("sleeps")
    assert stalls.slowdown() == SLOWDOWN
    assert judged_within(stalls, GRACE * SLOWDOWN - 1), "not called before the load-stretched grace"
    assert waited(stalls) >= GRACE


def test_ranks_that_work_in_their_calls_get_the_load_stretched_grace(ranks, monkeypatch):
    monkeypatch.setattr(deadlock, "core_share", lambda: 1 / SLOWDOWN)
    stalls = ranks("works")
    assert not judged_within(stalls, GRACE * 2)     # called later, at GRACE * SLOWDOWN, by the wait alone
