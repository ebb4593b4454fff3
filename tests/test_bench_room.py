"""course bench room: N learner workspaces checked at once; and a check's overall deadline (course_lib.check)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from course_lib import bench_room
from course_lib.check import within_deadline


def test_survivors_finds_a_process_with_the_marker_and_kills_it():
    marker = f"test:{os.getpid()}:{time.time()}"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, bench_room.MARKER: marker})
    try:
        left = bench_room.survivors(marker, settle=0.5)
        assert len(left) == 1 and f"pid {child.pid}" in left[0]
        assert child.wait(10) == -9
        assert bench_room.survivors(marker, settle=0) == []
    finally:
        child.kill()


def test_a_check_past_its_deadline_is_stopped_and_says_so():
    started = []

    def stuck():
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        time.sleep(60)
    t0 = time.monotonic()
    report = within_deadline(stuck, "allreduce", "x.py", 1.0)
    assert time.monotonic() - t0 < 2
    assert not report.passed
    (verdict,) = report.verdicts
    assert verdict.item == "check run" and "deadline of 1 s" in verdict.message
    assert started[0].wait(10) == -9     # the check's process was stopped


def test_right_reads_the_verdicts():
    solution, starter = (bench_room.Learner(i, None, i == 0) for i in range(2))
    solution.result = {"passed": True, "verdicts": []}
    starter.result = {"passed": False, "verdicts": [{"item": "ring_allreduce", "result": "fail"}]}
    assert solution.right() and starter.right()
    starter.result["verdicts"].append({"item": "check run", "result": "fail"})
    assert not starter.right()


@pytest.mark.slow
def test_room_of_eight_all_right_and_nothing_left(capsys):
    result = bench_room.room(8, "allreduce", world_sizes=(2,))
    print(result.table())
    assert len(result.learners) == 8
    assert result.all_right(), result.table()
    assert result.left == [], result.table()
    # each check said its overall deadline first: 1 world size x 180 s + 60 s
    assert all("checking: up to 240 s" in lr.output for lr in result.learners), result.learners[0].output
