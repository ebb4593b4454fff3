"""The machine-wide limit on local checks (course_lib.check_local.slot): at most COURSE_CHECK_SLOTS checks at once,
whoever's they are, as flocks on files in one folder. Real `course check` processes: the second of two waits for the
first's slot and says so, both verdicts right; a check killed with SIGKILL leaves its slot free.
"""
import contextlib
import fcntl
import os
import signal
import stat
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from course_lib import check_local

STEP = ROOT / "solutions" / "01_tuning" / "step.py"     # a quick check: pure functions, in the checker's process
WAITED = "waiting for a free check slot: 1 checks are running on this machine"


def course_check(folder):
    env = {**os.environ, "COURSE_CHECK_SLOTS": "1", "COURSE_CHECK_SLOTS_DIR": str(folder), "PYTHONPATH": str(ROOT)}
    env.pop(check_local.HELD, None)
    return subprocess.Popen([sys.executable, "-m", "course_lib.cli", "check", "step", str(STEP)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def stop(proc):
    """What is left of a `course check` we started: its session's processes."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)


def held(folder) -> bool:
    """Whether a process holds the one slot (an flock tried here without waiting, let go at once)."""
    try:
        fd = os.open(folder / "slot-0", os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def holding(proc, folder):
    """Wait until ``proc`` holds the slot (at most a minute); it must not have ended first."""
    deadline = time.monotonic() + 60
    while not held(folder):
        assert proc.poll() is None and time.monotonic() < deadline, "the first check never held the slot"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_second_check_waits_for_the_slot_and_a_killed_check_frees_it(tmp_path):
    folder = tmp_path / "slots"
    started = [course_check(folder)]
    try:
        holding(started[0], folder)
        started.append(course_check(folder))
        (out_first, _), (out_second, _) = (p.communicate(timeout=300) for p in started)
    finally:
        for p in started:
            stop(p)
    first, second = started
    assert first.returncode == 0 and "5/5 passed" in out_first, out_first
    assert second.returncode == 0 and "5/5 passed" in out_second, out_second
    assert out_second.count(WAITED) == 1, out_second
    lines = out_second.splitlines()
    assert lines[0].startswith("checking: up to") and lines[1].startswith(WAITED), out_second   # said once, in order
    assert stat.S_IMODE(folder.stat().st_mode) == 0o1777 and stat.S_IMODE((folder / "slot-0").stat().st_mode) == 0o666

    killed = course_check(folder)
    try:
        holding(killed, folder)
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(timeout=60)
        assert not held(folder), "the slot stayed locked after its check was killed"
    finally:
        stop(killed)


@pytest.mark.timeout(60)   # a check that waited for itself would hang
def test_a_check_inside_a_check_takes_no_slot_and_the_count_follows_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_CHECK_SLOTS_DIR", str(tmp_path / "slots"))
    monkeypatch.delenv(check_local.HELD, raising=False)
    monkeypatch.delenv("COURSE_CHECK_SLOTS", raising=False)
    assert check_local.slots() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("COURSE_CHECK_SLOTS", "x")
    with pytest.raises(ValueError, match="COURSE_CHECK_SLOTS must be a number"):
        check_local.slots()
    monkeypatch.setenv("COURSE_CHECK_SLOTS", "0")
    with check_local.slot(print):
        assert not (tmp_path / "slots").exists()      # no limit: no slot taken
    monkeypatch.setenv("COURSE_CHECK_SLOTS", "1")
    said = []
    # in this process and in a process it starts (a check's ranks, a job): each would wait for itself without HELD
    nested = "from course_lib.check_local import slot\nwith slot(print):\n    print('in')"
    with check_local.slot(said.append):
        assert held(tmp_path / "slots")
        with check_local.slot(said.append):
            pass
        child = subprocess.run([sys.executable, "-c", nested], capture_output=True, text=True, timeout=60,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert child.stdout == "in\n", child.stdout + child.stderr
    assert said == [] and not held(tmp_path / "slots") and check_local.HELD not in os.environ
