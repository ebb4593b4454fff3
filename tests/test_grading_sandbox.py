"""The grader's sandbox (course_lib.grading.sandbox.run_check) against hostile learners' files.

The checker here is tests/grading_class/run_file_check.py: it runs the learner's file as 2 ranks through
course_lib.runtime.launch, each rank in a session of its own, as the course's checkers do, and nothing else, so
these tests take seconds and do not depend on the real checkers. Each learner's file records the pids it
starts in $PIDS_DIR, so a test can tell whether every one of them is gone afterwards.
"""
import os
import tempfile
import time
from pathlib import Path

import pytest
from conftest import gone_within

from course_lib.grading.causes import DEADLINE, FILE_SIZE, MEMORY, PROCESSES, limits_hit
from course_lib.grading.reports import outcome_rows
from course_lib.grading.sandbox import Cgroups, Limits, run_check

HERE = Path(__file__).resolve().parent
RECORD = "import os\nopen(os.path.join(os.environ['PIDS_DIR'], str(os.getpid())), 'w').close()\n"


def _cgroup_kind() -> str:
    probe = Cgroups(Limits())
    probe.remove()
    return probe.kind


KIND = _cgroup_kind()     # what this machine allows: "cgroup v2", "systemd scope", "cgroup v1", ...
HAS_CGROUPS = KIND in ("cgroup v2", "systemd scope", "cgroup v1")
NO_CGROUPS = f"this machine lets the grader make no cgroup here ({KIND}): needs a delegated v2 subtree, systemd " \
             "or root with v1"


@pytest.fixture
def pids_dir(tmp_path, monkeypatch):
    d = tmp_path / "pids"
    d.mkdir()
    monkeypatch.setenv("PIDS_DIR", str(d))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE / "grading_class"),
                                                                  os.environ.get("PYTHONPATH")])))
    return d


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def survivors(pids_dir: Path) -> list[int]:
    """The recorded processes still alive once the run's kills had 10 s to take effect (none, if all is well)."""
    return gone_within(lambda: [int(p.name) for p in pids_dir.iterdir() if alive(int(p.name))], 10)


def grade(tmp_path, code: str, on_start=None, **limits):
    learner = tmp_path / "submissions" / "learner" / "05_allreduce"
    learner.mkdir(parents=True, exist_ok=True)
    (learner / "allreduce.py").write_text(code)
    before = sorted(p.name for p in (tmp_path / "submissions").rglob("*"))
    limits = {"deadline": 60, "run_timeout": 300, "max_processes": 128, "checker": "run_file_check", **limits}
    outcome = run_check("demo", learner / "allreduce.py", "05_allreduce/allreduce.py", Limits(**limits),
                        on_start=on_start)
    after = sorted(p.name for p in (tmp_path / "submissions").rglob("*"))
    assert after == before, "the submissions were written into"
    return outcome


def test_a_file_that_works_passes(tmp_path, pids_dir):
    out = grade(tmp_path, RECORD + "print('hello from', __file__)\n")
    assert out.verdicts and out.verdicts[0]["result"] == "pass", out.output
    assert "hello from" in out.output and "course-grade-work-" in out.output   # it ran on the copy
    assert len(list(pids_dir.iterdir())) == 2 and not survivors(pids_dir)


def test_the_stop_it_handed_out_signals_nothing_once_the_check_ended(tmp_path, pids_dir, monkeypatch):
    """A grader keeps ``kill`` for Ctrl-C; called after the worker was reaped, its pid and group number may be
    another process's by then (pids wrap), so it must not signal them."""
    from course_lib.grading import sandbox
    kills, stopped = [], []
    out = grade(tmp_path, RECORD, on_start=kills.append)
    assert out.verdicts and len(kills) == 1, out.output
    monkeypatch.setattr(sandbox.proc, "stop_tree", lambda *a, **k: stopped.append((a, k)))
    kills[0]()
    assert stopped == [], f"stop_tree called for a worker that had ended: {stopped}"


@pytest.mark.slow
def test_deadline_stops_a_hanging_file_and_everything_it_started(tmp_path, pids_dir):
    code = RECORD + "import subprocess, time\n" \
        "p = subprocess.Popen(['sleep', '600'])\n" \
        "open(os.path.join(os.environ['PIDS_DIR'], str(p.pid)), 'w').close()\n" \
        "time.sleep(600)\n"
    start = time.monotonic()
    out = grade(tmp_path, code, deadline=8)
    assert out.timed_out and out.verdicts is None
    assert time.monotonic() - start < 40
    assert len(list(pids_dir.iterdir())) == 4      # 2 ranks, 2 sleeps
    assert not survivors(pids_dir)


ESCAPE = RECORD + """import subprocess
p = subprocess.Popen(['sleep', '600'], env={}, start_new_session=True, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
open(os.path.join(os.environ['PIDS_DIR'], str(p.pid)), 'w').close()
print('left a daemon behind')
"""


@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroup", "sweep"])
@pytest.mark.slow   # a multi-process run: make test, not test-fast
def test_a_daemon_with_a_clean_environment_does_not_survive(tmp_path, pids_dir, cgroups):
    if cgroups and not HAS_CGROUPS:
        pytest.skip(NO_CGROUPS)
    out = grade(tmp_path, ESCAPE, cgroups=cgroups)
    assert out.isolation == (KIND if cgroups else "sweep")
    assert out.verdicts and out.verdicts[0]["result"] == "pass"
    assert out.leftovers >= 2, "the sweep should have found the two daemons"
    assert not survivors(pids_dir)


FORKY = RECORD + """import time
kids = 0
for _ in range(100):
    try:
        pid = os.fork()
    except OSError as e:
        print(f'fork failed after {kids}: {e}', flush=True)
        break
    if pid == 0:
        open(os.path.join(os.environ['PIDS_DIR'], str(os.getpid())), 'w').close()
        time.sleep(600)
        os._exit(0)
    kids += 1
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroup", "sweep"])
def test_many_processes_are_capped_and_killed(tmp_path, pids_dir, cgroups):
    if cgroups and not HAS_CGROUPS:
        pytest.skip(NO_CGROUPS)
    out = grade(tmp_path, FORKY, deadline=12, max_processes=64, cgroups=cgroups)
    assert out.timed_out
    started = len(list(pids_dir.iterdir()))
    if cgroups:
        assert "fork failed" in out.output and started < 64, (started, out.output[-2000:])
        # the cgroup's own counter names the cause, and the learner is told which limit and what it means
        assert out.events.get("pids", 0) > 0 and limits_hit(out) == [PROCESSES, DEADLINE], out.events
        (row,) = outcome_rows(out, Limits(deadline=12, max_processes=64))
        assert "process limit: a check may have at most 64 processes" in row["message"], row
    elif os.getuid() == 0:
        assert started == 2 + 200     # root ignores RLIMIT_NPROC: nothing caps it, the sweep kills it all
    else:
        assert "fork failed" in out.output    # RLIMIT_NPROC caps a non-root user
    assert not survivors(pids_dir)


@pytest.mark.slow   # a multi-process run: make test, not test-fast
def test_megabytes_of_output_are_bounded(tmp_path, pids_dir):
    out = grade(tmp_path, RECORD + "import sys\nfor _ in range(50_000):\n    print('spam ' * 40)\n",
                keep_output_kb=16)
    assert out.output_bytes > 10 * 2**20
    assert len(out.output) < 8192 + 16 * 1024 + 200
    assert "bytes not kept" in out.output
    assert not survivors(pids_dir)


def test_writes_above_the_copy_stay_in_the_sandbox(tmp_path, pids_dir, monkeypatch):
    name = f"graded-{os.getpid()}-{time.monotonic_ns()}.txt"
    monkeypatch.setenv("MARK", name)
    code = RECORD + """from pathlib import Path
here = Path(__file__).resolve().parent
for target in (here, here.parent, here.parent.parent, here.parent.parent.parent, Path.home()):
    (target / os.environ['MARK']).write_text('all pass')
print('wrote up to', here.parent.parent.parent)
"""
    out = grade(tmp_path, code)        # grade() asserts the submissions did not change
    assert out.verdicts[0]["result"] == "pass", out.output
    assert "course-grade-work-" in out.output
    assert not list(tmp_path.rglob(name))
    assert not (Path(tempfile.gettempdir()) / name).exists()
    assert not (Path.home() / name).exists()


def test_a_huge_file_is_cut_by_the_file_size_limit(tmp_path, pids_dir):
    code = RECORD + "open('big.bin', 'wb').write(b'0' * (64 << 20))\n"
    out = grade(tmp_path, code, max_file_mb=8)
    assert out.verdicts[0]["result"] == "fail"
    assert "failed first" in out.verdicts[0]["message"]
    assert FILE_SIZE in limits_hit(out, out.verdicts[0]["message"]), out.verdicts[0]["message"]
    (row,) = outcome_rows(out, Limits(max_file_mb=8))
    assert row["message"].startswith("Stopped by the grader's file-size limit: no file may grow past 8 MB"), row


@pytest.mark.skipif(not HAS_CGROUPS, reason=NO_CGROUPS)
def test_memory_is_limited_where_cgroups_are(tmp_path, pids_dir):
    code = RECORD + "blocks = [bytearray(64 << 20) for _ in range(32)]\nprint('allocated 2 GB')\n"
    out = grade(tmp_path, code, memory_mb=512)
    assert out.verdicts[0]["result"] == "fail"
    assert "allocated 2 GB" not in out.output
    assert MEMORY in limits_hit(out, out.verdicts[0]["message"]), (out.events, out.verdicts[0]["message"])
    (row,) = outcome_rows(out, Limits(memory_mb=512))
    assert row["message"].startswith("Stopped by the grader's memory limit: 512 MB"), row
    assert not survivors(pids_dir)
