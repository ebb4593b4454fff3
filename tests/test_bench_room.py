"""tools/bench_room.py: N learner workspaces checked at once (a check's overall deadline: tests/test_runs.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools import bench_room


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


def test_right_reads_the_verdicts():
    solution, starter = (bench_room.Learner(i, None, i == 0) for i in range(2))
    solution.result = {"passed": True, "verdicts": []}
    starter.result = {"passed": False, "verdicts": [{"item": "ring_allreduce", "result": "fail"}]}
    assert solution.right() and starter.right()
    starter.result["verdicts"].append({"item": "check run", "result": "fail"})
    assert not starter.right()


def test_told_sums_up_what_the_check_said():
    lr = bench_room.Learner(0, None, True)
    lr.output = "[said at 0.0 s] checking: up to 240 s\nsome output\n"
    assert lr.told() == "checking: up to 240 s"
    lr.output = ("[said at 0.4 s] queued as job 7 (state PENDING, reason Resources)\n"
                 "[said at 9.6 s] job 7 started (RUNNING); its log: /x/output.log\n")
    assert lr.told() == "queued (Resources), started 9.2 s later"
    lr.output = "[said at 0.4 s] queued as job 7 (state PENDING, reason Priority; 3rd of 4 pending in gpu)\nTraceback\n"
    assert lr.told() == "queued (Priority), never said it started"
    lr.output = "[said at 1.5 s] job 7 started (RUNNING); its log: /x/output.log\n"
    assert lr.told() == "started at 1.5 s, not said queued"
    lr.output = ""
    assert lr.told() == "(said nothing)"


def test_jobs_left_lists_and_cancels_the_runs_jobs_only(tmp_path, monkeypatch):
    """squeue and scancel stand-ins on PATH: the jobs whose folder is under the run's root are listed and
    cancelled, another user's job elsewhere is not touched."""
    bin_dir, cancelled = tmp_path / "bin", tmp_path / "cancelled"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text("#!/bin/sh\necho '12|RUNNING|check-allreduce|/tmp/room-x/learner1/jobs/runs/c'\n"
                                    "echo '13|PENDING|train|/home/other/runs/t'\n")
    (bin_dir / "scancel").write_text(f"#!/bin/sh\necho \"$@\" > {cancelled}\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert bench_room.jobs_left(Path("/tmp/room-x")) == ["job 12 (check-allreduce): RUNNING"]
    assert cancelled.read_text().split() == ["12"]


@pytest.mark.slow
def test_room_of_eight_all_right_and_nothing_left(capsys):
    result = bench_room.room(8, "allreduce", world_sizes=(2,))
    print(result.table())
    assert len(result.learners) == 8
    assert result.all_right(), result.table()
    assert result.left == [], result.table()
    # each check said its overall deadline first: 1 world size x 180 s + 60 s
    assert all("checking: up to 240 s" in lr.output for lr in result.learners), result.learners[0].output
