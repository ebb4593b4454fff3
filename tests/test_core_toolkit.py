"""course_lib.core's toolkit: process trees (proc), atomic writes (atomic), the rank-process kit (rankkit), and the
checking harness's parts that run inside a rank (learner, watchdog, guard)."""
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import traceback

import psutil
import pytest
from conftest import ROOT

from course_lib.checking import learner, watchdog
from course_lib.checking.runner import Launch
from course_lib.core import atomic, rankkit
from course_lib.core.loader import import_path
from course_lib.runtime import proc

PYTHON = sys.executable
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


# ---- proc -----------------------------------------------------------------------------------------------------

TREE = """
import subprocess, sys, time
sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
subprocess.Popen(sleep)                            # a plain child
subprocess.Popen(sleep, start_new_session=True)    # one that left the session (setsid)
subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen({sleep!r}); time.sleep(120)"])
print("ready", flush=True)
time.sleep(120)
"""


def start_tree(first: str = ""):
    """A process with children, one in its own session, and a grandchild; returns (Popen, descendants). ``first``:
    a line the process runs before it starts them."""
    p = subprocess.Popen([PYTHON, "-c", first + TREE.format(sleep=[PYTHON, "-c", "import time; time.sleep(120)"])],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 10
    while len(family := psutil.Process(p.pid).children(recursive=True)) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)   # the grandchild may still be starting
    assert len(family) == 4, family
    return p, family


def test_freeze_stops_every_descendant_even_one_that_did_setsid_and_kill_ends_them():
    p, family = start_tree()
    frozen = proc.freeze([p.pid])
    try:
        assert sorted(q.pid for q in frozen) == sorted([p.pid, *(q.pid for q in family)])
        assert {q.status() for q in frozen} == {psutil.STATUS_STOPPED}
    finally:
        assert proc.signal_all(frozen, signal.SIGKILL) == 5
    p.wait(5)
    assert proc.wait_gone(family, 5) == []
    assert proc.alive([p.pid, *family]) == []


@pytest.mark.parametrize("root_ends_on_term", [True, False])
def test_stop_tree_terms_then_kills_the_whole_tree_and_the_extra_pids(root_ends_on_term):
    # the one way the course stops what it started: TERM, KILL after the grace, with the setsid child, the
    # grandchild and a process outside the tree named by `more` (a cgroup's member)
    p, family = start_tree("" if root_ends_on_term else "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    outsider = subprocess.Popen([PYTHON, "-c", "import time; time.sleep(120)"])
    start = time.monotonic()
    stopped = proc.stop_tree([p.pid], group=p.pid, grace=2.0, more=lambda: [outsider.pid])
    assert sorted(q.pid for q in stopped) == sorted([p.pid, outsider.pid, *(q.pid for q in family)])
    assert p.wait(5) == (-signal.SIGTERM if root_ends_on_term else -signal.SIGKILL)
    assert (time.monotonic() - start < 2.0) == root_ends_on_term   # the grace is waited only for a root that stays
    assert outsider.wait(5) < 0 and proc.wait_gone(family, 5) == []


def test_signal_all_can_spare_the_root_and_alive_ignores_zombies():
    p, family = start_tree()
    try:
        assert proc.signal_all(family, signal.SIGTERM) == 4
        assert proc.wait_gone([q.pid for q in family], 5) == []
        assert proc.alive([p.pid]) == [p.pid]
    finally:
        p.kill()
    deadline = time.monotonic() + 5
    while psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.alive([p.pid]) == []    # exited, not reaped yet: a zombie counts as gone
    p.wait()


def test_live_lists_processes_with_their_info():
    p = subprocess.Popen([PYTHON, "-c", "import time; time.sleep(30)", "core-toolkit-marker"])
    try:
        found = [q.pid for q in proc.live(["cmdline"]) if "core-toolkit-marker" in (q.info["cmdline"] or [])]
        assert found == [p.pid]
    finally:
        p.kill()
        p.wait()


# ---- atomic ---------------------------------------------------------------------------------------------------

def test_atomic_writes_leave_no_temporary_file(tmp_path):
    target = tmp_path / "state.json"
    atomic.write_text(target, "héllo")
    atomic.write_bytes(tmp_path / "blob", b"\0\1")
    with atomic.atomic_writer(tmp_path / "rows.csv", newline="") as f:
        f.write("a,b\r\n")
    assert target.read_text(encoding="utf-8") == "héllo"
    assert (tmp_path / "blob").read_bytes() == b"\0\1"
    assert (tmp_path / "rows.csv").read_bytes() == b"a,b\r\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blob", "rows.csv", "state.json"]
    plain = tmp_path / "plain"
    plain.write_text("x")
    assert target.stat().st_mode == plain.stat().st_mode   # the umask decides, as for open()


def test_atomic_writer_keeps_the_old_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "state.json"
    atomic.write_text(target, "old")
    with pytest.raises(RuntimeError):
        with atomic.atomic_writer(target) as f:
            f.write("half of the new")
            raise RuntimeError("interrupted")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    with pytest.raises(ValueError, match="mode"):
        with atomic.atomic_writer(target, "a"):
            pass


# ---- rankkit: rank discovery ----------------------------------------------------------------------------------

def test_rank_env_prefers_torchrun_over_srun():
    srun = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4"}
    assert rankkit.rank_env(srun) == (3, 1, 4, "srun")
    torchrun = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}
    # torchrun inside a Slurm job: srun's variables are inherited and describe the torchrun task
    assert rankkit.rank_env({**srun, **torchrun}) == rankkit.RankEnv(5, 1, 8, "torchrun")
    assert rankkit.rank_env({"SLURM_PROCID": "2", "SLURM_NTASKS": "3"}).local_rank == 2


def test_rank_env_says_what_is_missing():
    with pytest.raises(rankkit.RankEnvError, match=r"no rank in the environment.*srun.*SLURM_PROCID.*torchrun.*RANK"):
        rankkit.rank_env({"PATH": "/bin"})
    with pytest.raises(ValueError, match="WORLD_SIZE is not set"):
        rankkit.rank_env({"RANK": "0"})
    with pytest.raises(ValueError, match="SLURM_PROCID='x' is not a whole number"):
        rankkit.rank_env({"SLURM_PROCID": "x", "SLURM_NTASKS": "2"})
    with pytest.raises(ValueError, match="RANK=2 is not a rank of WORLD_SIZE=2"):
        rankkit.rank_env({"RANK": "2", "WORLD_SIZE": "2"})


# ---- rankkit: markers and the learner's line ------------------------------------------------------------------

def test_emit_and_parse_round_trip(capsys):
    rankkit.emit("result", fn="ring_allreduce", case=3, ok=False, msg="2 of 5 elements wrong\nhint: …")
    line = capsys.readouterr().out.rstrip("\n")
    assert line.startswith("@@ {")
    assert rankkit.parse(line) == {"ev": "result", "fn": "ring_allreduce", "case": 3, "ok": False,
                                   "msg": "2 of 5 elements wrong\nhint: …"}
    for other in ("print from the learner", "@@ not json", "@@start case", '@@ [1, 2]', '@@ {"no": "ev"}', ""):
        assert rankkit.parse(other) is None, other


def test_learner_line_points_at_the_learners_file(tmp_path):
    path = tmp_path / "allreduce.py"
    path.write_text("import json\n\ndef ring(x):\n    return json.loads(x)  # the bug\n")
    module = import_path(str(path), "learner_toolkit_test")
    with pytest.raises(ValueError) as info:
        module.ring("{")
    frames = traceback.extract_tb(info.tb)   # innermost frames are json's: the learner's line is the one wanted
    assert learner.learner_line(frames, str(path)) == "allreduce.py:4 in ring: return json.loads(x)  # the bug"
    assert learner.error_where(info.value, str(path)) == "allreduce.py:4 in ring: return json.loads(x)  # the bug"
    assert learner.learner_line(frames, str(tmp_path / "other.py")) == ""
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\ndef f(:\n")
    with pytest.raises(SyntaxError) as info:
        import_path(str(bad), "learner_toolkit_bad")
    assert learner.error_where(info.value, str(bad)) == "bad.py:2: def f(:"


# ---- rankkit: in a real rank process --------------------------------------------------------------------------

def run_script(tmp_path, body: str, timeout: float = 60) -> subprocess.CompletedProcess:
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run([PYTHON, str(script)], capture_output=True, text=True, timeout=timeout, env=ENV)


def test_watchdog_says_where_the_main_thread_waits_and_exits(tmp_path):
    p = run_script(tmp_path, """
        import sys, threading, time
        from course_lib.checking import learner, watchdog; from course_lib.core import rankkit  # noqa: E702

        def stuck(frames, case):
            rankkit.emit("stuck", case=case, where=learner.learner_line(frames, __file__),
                         thread=threading.current_thread().name)

        def wait_for_peer():
            time.sleep(30)  # never answered

        dog = watchdog.Watchdog(0.5, stuck)
        dog.arm(7)
        dog.disarm()          # a finished case does not fire
        time.sleep(0.8)
        dog.arm(8)
        wait_for_peer()
        print("not reached")
    """)
    assert p.returncode == 3, p.stderr
    events = [rankkit.parse(line) for line in p.stdout.splitlines()]
    where = "rank.py:10 in wait_for_peer: time.sleep(30)  # never answered"
    assert events == [{"ev": "stuck", "case": 8, "where": where, "thread": events[0]["thread"]}]
    assert events[0]["thread"] != "MainThread"


def test_watchdog_counts_a_cores_share_so_a_busy_machine_does_not_make_a_hang(tmp_path):
    # a quarter of a core (8 runnable processes on 2 cores): 0.4 s of work takes at least 1.6 s of wall time
    after = _watchdog_fires_after(tmp_path, "watchdog.core_share = lambda: 0.25", 0.4)
    assert after >= 1.6 - 2 * watchdog.Watchdog.TICK, after


def _watchdog_fires_after(tmp_path, setup: str, seconds: float) -> float:
    """Seconds until a Watchdog(seconds) fires in a fresh process after ``setup`` (run with rankkit and watchdog
    imported)."""
    p = run_script(tmp_path, f"""
        import threading, time
        from course_lib.checking import watchdog
        from course_lib.core import rankkit

        {setup}
        start = time.monotonic()
        dog = watchdog.Watchdog({seconds}, lambda frames: rankkit.emit("stuck", after=time.monotonic() - start))
        dog.arm()
        time.sleep(30)
    """)
    assert p.returncode == 3, p.stderr
    [event] = [rankkit.parse(line) for line in p.stdout.splitlines()]
    return event["after"]


def test_watchdog_keeps_time_when_its_thread_wakes_late(tmp_path):
    # a starved thread: every wait takes three times its timeout. The deadline follows the clock, so two ranks
    # of one deadlock fire together however often each one's watchdog gets to run (counting ticks: 3 s here)
    starved = (  # only the watchdog's waits have a timeout here
        "class Starved(threading.Event):\n"
        "            def wait(self, timeout=None):\n"
        "                if timeout is None:\n"
        "                    return super().wait()\n"
        "                time.sleep(3 * timeout)\n"
        "                return self.is_set()\n"
        "        watchdog.threading.Event = Starved\n"
        "        watchdog.core_share = lambda: 1.0")
    after = _watchdog_fires_after(tmp_path, starved, 1.0)
    assert 1.0 <= after < 2.5, after   # four late wake-ups of 0.3 s (counting ticks: ten, 3 s or more)


def test_core_share_is_cores_over_the_load(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    for load, share in ((0.0, 1.0), (1.5, 1.0), (2.0, 1.0), (4.0, 0.5), (8.0, 0.25)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, 0.0, 0.0))
        assert watchdog.core_share() == share, load

    def unreadable():
        raise OSError("no load average here")
    monkeypatch.setattr(os, "getloadavg", unreadable)
    assert watchdog.core_share() == 1.0   # the plain wall clock
    monkeypatch.undo()
    assert 0 < watchdog.core_share() <= 1


GUARD = """
import json, os, tempfile
import torch, torch.distributed as dist
from course_lib.checking import guard as cg

store = os.path.join(tempfile.mkdtemp(), "store")
dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
out = {}
with cg.CollectiveGuard(["all_reduce", "broadcast", "no_such_function"]) as guard:
    from torch.distributed import all_reduce      # what a learner's file binds at import
    try:
        all_reduce(torch.ones(2))
    except cg.ForbiddenCollective as e:
        out["forbidden"] = [str(e), e.name]
    out["used"] = guard.used
    t = torch.ones(2)
    guard.original("all_reduce")(t)               # the checker's own call goes through
    out["original"] = t.tolist()
out["restored"] = dist.all_reduce is guard.original("all_reduce").__wrapped__
with cg.CollectiveGuard(["all_reduce", "all_gather"], mode="count") as counter:
    t = torch.ones(3)
    dist.all_reduce(t)
    torch.distributed.distributed_c10d.all_reduce(t)
    gathered = [torch.zeros(3)]
    dist.all_gather(gathered, t)
    out["counts"] = counter.take()
    out["value"] = gathered[0].tolist()
    dist.all_reduce(t)
    out["after_take"] = counter.counts
dist.destroy_process_group()
print(json.dumps(out))
"""


OTHER_WAYS = """
import json, os, tempfile
import torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.distributed_c10d import _get_default_group
from course_lib.checking import guard as cg

store = os.path.join(tempfile.mkdtemp(), "store")
dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
ways = {"group.WORLD": lambda t: dist.group.WORLD.allreduce([t]).wait(),
        "default_group": lambda t: _get_default_group().allreduce(t).wait(),
        "c10d module": lambda t: torch.distributed.distributed_c10d.all_reduce(t),
        "functional": lambda t: t.copy_(funcol.all_reduce(t, "sum", dist.group.WORLD)),
        "torch.ops._c10d_functional": lambda t: t.copy_(torch.ops._c10d_functional.wait_tensor(
            torch.ops._c10d_functional.all_reduce(t, "sum", dist.group.WORLD.group_name))),
        # the op's ReduceOp argument has no public Python form: broadcast_ stands for the c10d ops
        "torch.ops.c10d": lambda t: torch.ops.c10d.broadcast_([t], dist.group.WORLD.boxed(), 0, 0)[1].wait()}
out = {"forbid": {}, "count": {}}
for way, call in ways.items():
    name = "broadcast" if way == "torch.ops.c10d" else "all_reduce"
    with cg.CollectiveGuard([name]) as guard:
        try:
            call(torch.ones(2))
            out["forbid"][way] = "not seen"
        except cg.ForbiddenCollective as e:
            out["forbid"][way] = e.name
    with cg.CollectiveGuard([name], mode="count") as counter:
        call(torch.ones(2))
        out["count"][way] = counter.take()
with cg.CollectiveGuard(["all_reduce"]) as guard:   # point-to-point and the checker's own calls pass
    t = torch.ones(2)
    guard.original("all_reduce")(t)
    out["own"] = guard.used
with cg.CollectiveGuard(["all_reduce"], mode="count") as counter:
    dist.barrier()                                            # not a counted name
    out["barrier"] = counter.take()
dist.destroy_process_group()
print(json.dumps(out))
"""


@pytest.mark.slow   # a multi-process run: make test, not test-fast
def test_collective_guard_sees_every_other_way_to_a_collective(tmp_path):
    p = run_script(tmp_path, OTHER_WAYS)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.splitlines()[-1])
    names = {w: "all_reduce" for w in ["group.WORLD", "default_group", "c10d module", "functional",
                                       "torch.ops._c10d_functional"]} | {"torch.ops.c10d": "broadcast"}
    assert out["forbid"] == names, out
    assert out["count"] == {w: {name: 1} for w, name in names.items()}, out
    assert out["own"] == [] and out["barrier"] == {}, out


@pytest.mark.slow   # a multi-process run: make test, not test-fast
def test_collective_guard_forbids_and_counts_on_a_real_process_group(tmp_path):
    p = run_script(tmp_path, GUARD)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.splitlines()[-1])
    assert out == {"forbidden": ["dist.all_reduce", "all_reduce"], "used": ["all_reduce"], "original": [1.0, 1.0],
                   "restored": True, "counts": {"all_reduce": 2, "all_gather": 1}, "value": [1.0, 1.0, 1.0],
                   "after_take": {"all_reduce": 1}}


def test_worker_failed_names_the_run_and_keeps_the_learners_last_lines():
    class Result:
        def summary(self):
            return "rank 1 failed first (exit codes: rank 0: stopped, rank 1: 7)"

    marker = rankkit.PREFIX + '{"ev": "start", "case": "f@2", "item": "f", "label": ""}'
    run = Launch(2, 10.0)
    for rank, lines in ((1, ["b1", marker]), (0, ["a1", "a2"] + [f"x{i}" for i in range(9)])):
        for line in lines:
            run.on_line(rank, line)
    run.result = Result()
    message = run.failure()
    assert message.startswith("the check run on 2 ranks failed: rank 1 failed first")
    assert message.splitlines()[1:] == ["x2", "x3", "x4", "x5", "x6", "x7", "x8", "b1"]   # ranks in order


def test_explain_points_at_the_learners_file(tmp_path):
    mine = tmp_path / "mine.py"
    mine.write_text("def f():\n    raise ValueError('bad shape\\nmore')\n\n\n"
                       "def g():\n    raise NotImplementedError\n\n\n"
                       "def h():\n    raise NotImplementedError('h: return 2 * t')\n")
    ns = {}
    exec(compile(mine.read_text(), str(mine), "exec"), ns)
    for call, want in ((ns["f"], "ValueError: bad shape (tp.py line 2, in f)"),
                       (ns["g"], "not written yet: NotImplementedError (tp.py line 6, in g)"),
                       (ns["h"], "not written yet: h: return 2 * t (tp.py line 10, in h)")):   # the stub's words
        with pytest.raises(Exception) as info:
            call()
        assert learner.explain(info.value, str(mine), "tp.py") == want


def test_a_skipped_item_shows_as_not_run_and_never_counts_as_passed():
    from course_lib.core.report import Report
    r = Report("sbatch", "x.sbatch")
    r.add("directives", True)
    r.skip("ranks", "no Slurm here: the script was only read")
    assert r.passed and r.tally() == "1/1 passed, 1 not run"
    assert "NOT RUN ranks" in r.text() and "1/1 passed, 1 not run" in r.text()
    assert [v.result for v in Report.from_dict(r.to_dict()).verdicts] == ["pass", "skipped"]
    only_skipped = Report("sbatch", "y.sbatch")
    only_skipped.skip("ranks", "no Slurm")
    assert not only_skipped.passed
    r.add("gpus", False, "no GPU asked for")
    assert not r.passed and r.tally() == "1/2 passed, 1 not run"


def test_a_reports_html_keeps_shell_dollars_out_of_latex_and_items_on_one_line():
    """JupyterLab typesets $...$ in html output (MathJax), which garbled the MASTER_ADDR hint; MathJax skips <pre>."""
    from course_lib.core.report import Report, Verdict
    hint = 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'
    page = Report("sbatch", "ddp.sbatch", [Verdict("MASTER_ADDR/PORT", "fail", hint)], 1.0)._repr_html_()
    message = re.search(r"<pre[^>]*>(.*?)</pre>", page, re.S)
    assert message and "$(scontrol show hostnames &quot;$SLURM_JOB_NODELIST&quot;" in message.group(1), page
    assert "<td style='white-space:nowrap'>MASTER_ADDR/PORT</td>" in page, page
