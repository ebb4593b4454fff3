"""Warm launches: srun-style ranks forked from a server that imported torch once (course_lib.runtime.warm).
Real processes and real gloo; the same guarantees as cold launches, and no server left behind."""
import os
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import uuid

import pytest
from conftest import live_processes

from course_lib.runtime import proc, warm
from course_lib.runtime.launch import launch

# one worker, one after another: among the other modules' tests a worker would start the module's server anew each
# time it came back to this module
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("warm")]

SHOW = """
import os, sys
rank = int(os.environ["SLURM_PROCID"])
print("ppid", os.getppid(), "pid", os.getpid(), "name", __name__)
print("env", os.environ["SLURM_NTASKS"], os.environ.get("WARM_TEST"), "RANK" in os.environ)
print("argv", *sys.argv[1:])
print("where", os.getcwd(), sys.path[0])
sys.exit(rank * 5)
"""


def script(folder, body, name="s.py") -> str:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def lines_of(res, rank, word):
    return [line.split()[1:] for line in res.ranks[rank].lines if line.startswith(word + " ")]


@pytest.fixture(scope="module")
def server():
    with warm.session() as s:
        assert s is not None and s.ready(), "the fork server did not start"
        yield s
    # the session's end keeps the server for the next session; close_idle() (or the keep time, or exit) ends it
    assert s.alive() and s in warm._idle
    warm.close_idle()
    assert s.proc.poll() is not None and not os.path.exists(s.dir)


def test_rank_sees_its_env_argv_cwd_and_exit_code(server, tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "9")   # left over in the caller: srun-style ranks must not see it
    work = tmp_path / "work"
    work.mkdir()
    res = launch([script(tmp_path, SHOW), "a b", "--x"], 2, timeout=120, env={"WARM_TEST": "yes"}, cwd=work,
                 on_line=None)
    assert [r.returncode for r in res.ranks] == [0, 5] and res.failed_rank == 1, res.summary()
    for rank in (0, 1):
        [(parent, _, _, _, name)] = lines_of(res, rank, "ppid")
        assert int(parent) == server.proc.pid and name == "__main__"   # forked by the server, run as a script
        assert lines_of(res, rank, "env") == [["2", "yes", "False"]]
        assert lines_of(res, rank, "argv") == [["a", "b", "--x"]]   # one argument "a b": printed as two words
        assert lines_of(res, rank, "where") == [[str(work), str(tmp_path)]]


def test_module_runs_as_main_with_cwd_first_on_the_path(server, tmp_path):
    script(tmp_path, SHOW, name="showmod.py")
    res = launch(["-m", "showmod", "z"], 1, timeout=120, cwd=tmp_path, on_line=None)
    assert res.ok, res.summary()
    assert lines_of(res, 0, "argv") == [["z"]]
    assert lines_of(res, 0, "where") == [[str(tmp_path), str(tmp_path)]]
    assert int(lines_of(res, 0, "ppid")[0][0]) == server.proc.pid


def test_uncaught_exception_prints_the_traceback_and_exits_1(server, tmp_path):
    body = "import os\nprint('before')\nraise ValueError('boom in rank ' + os.environ['SLURM_PROCID'])\n"
    res = launch([script(tmp_path, body)], 2, timeout=120, on_line=None)
    assert [r.returncode for r in res.ranks] == [1, 1]
    for rank in (0, 1):
        out = list(res.ranks[rank].lines)
        assert out[0] == "before" and out[1] == "Traceback (most recent call last):"
        assert out[2].startswith(f'  File "{tmp_path}') and out[-1] == f"ValueError: boom in rank {rank}"
        assert not any("forkserver" in line or "runpy" in line for line in out)   # as python s.py prints it


LEAVING = {   # what a learner can observe of a rank's exit; each as `python script.py` shows it
    "atexit": "import atexit\natexit.register(print, 'atexit handler ran')\nprint('body')\n",
    "teardown abort": "import os\nclass Last:\n    def __del__(self):   # in the interpreter's teardown\n"
                      "        os.write(2, b'terminate called at teardown\\n')\n        os.abort()\nlast = Last()\n",
    "non-daemon thread": "import threading, time\n"
                         "threading.Thread(target=lambda: (time.sleep(0.5), print('thread done'))).start()\n",
    "KeyboardInterrupt": "raise KeyboardInterrupt\n",
    "exit message": "import sys\nsys.exit('bye')\n",
}


@pytest.mark.parametrize("case", LEAVING)
def test_a_rank_leaves_as_python_script_does(server, tmp_path, case):
    # the same script started cold (a fresh `python s.py` per rank) and forked warm: the same exit codes and output
    path = script(tmp_path, LEAVING[case])
    cold, warm_ = (launch([path], 2, timeout=60, on_line=None, warm=w) for w in (False, True))
    assert [r.returncode for r in warm_.ranks] == [r.returncode for r in cold.ranks], warm_.summary()
    for rank in (0, 1):
        assert warm_.ranks[rank].lines == cold.ranks[rank].lines, (warm_.output(rank), cold.output(rank))
    assert case != "teardown abort" or warm_.ranks[0].returncode == -signal.SIGABRT


@pytest.mark.parametrize("case", ["atexit", "teardown abort"])   # the srun-style test above has the rest
def test_a_torchrun_rank_forked_by_its_agent_leaves_as_under_torchrun(server, tmp_path, case):
    # the abort on rank 1 only: torchrun reports the first worker to fail and stops the others, so which of two
    # aborting ranks it names is a race, cold as warm
    body = LEAVING[case].replace("last = Last()", "last = Last() if os.environ['RANK'] == '1' else None")
    path = script(tmp_path, body)
    cold, warm_ = (launch([path], 2, style="torchrun", timeout=60, on_line=None, warm=w) for w in (False, True))
    assert [r.returncode for r in warm_.ranks] == [r.returncode for r in cold.ranks], warm_.summary()
    for rank in (0, 1):
        assert warm_.ranks[rank].lines == cold.ranks[rank].lines, (warm_.output(rank), cold.output(rank))
    assert case != "teardown abort" or warm_.ranks[1].returncode == -signal.SIGABRT


def test_real_gloo_all_reduce(server, tmp_path):
    body = """
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo", rank=int(os.environ["SLURM_PROCID"]), world_size=int(os.environ["SLURM_NTASKS"]))
    t = torch.tensor([dist.get_rank() + 1.0]); dist.all_reduce(t)
    print("sum", int(t.item()), torch.get_num_threads())
    dist.destroy_process_group()
    """
    res = launch([script(tmp_path, body)], 3, timeout=120, on_line=None)
    assert res.ok, res.summary()
    assert [lines_of(res, rank, "sum") for rank in range(3)] == [[["6", "1"]]] * 3   # 1+2+3; OMP_NUM_THREADS=1


def test_deadline_stops_a_hang_with_all_it_started(server, tmp_path):
    marker = f"course-warm-test-{uuid.uuid4()}"
    body = f"""
    import os, subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "{marker}"])
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "{marker}"], start_new_session=True)
    print("pid", os.getpid(), flush=True)
    time.sleep(300)
    """
    res = launch([script(tmp_path, body)], 2, timeout=20, on_line=None)
    assert res.timed_out and res.stuck_ranks == [0, 1], res.summary()
    pids = [int(lines_of(res, rank, "pid")[0][0]) for rank in (0, 1)]
    assert proc.wait_gone(pids, 30) == []
    assert live_processes(marker) == []
    assert server.proc.poll() is None   # the server outlives a failed launch and serves the next one


def test_a_rank_shows_its_own_command_line_while_it_runs(server, tmp_path):
    # ps, top and the tests' "nothing survives" checks (live_processes) read /proc/PID/cmdline: a forked rank
    # would show the server's
    path = script(tmp_path, "import os, time\nprint('pid', os.getpid(), flush=True)\ntime.sleep(300)\n")
    seen = []

    def on_line(rank, line):
        if line.startswith("pid") and not seen:
            seen.append(live_processes(path, "--flag"))
    res = launch([path, "--flag"], 1, timeout=20, on_line=on_line)
    assert res.timed_out and int(lines_of(res, 0, "pid")[0][0]) != os.getpid()
    [[found]] = seen
    assert found.startswith(lines_of(res, 0, "pid")[0][0] + ":") and f"{sys.executable} {path} --flag" in found
    assert live_processes(path) == []


def test_a_launch_outside_a_session_starts_a_server_and_keeps_it_for_the_next(tmp_path, monkeypatch):
    monkeypatch.setattr(warm, "_active", None)   # this module's session is open: step outside it
    monkeypatch.setattr(warm, "_idle", [])
    try:
        runs = [launch([script(tmp_path, SHOW)], 1, timeout=120, warm=True, on_line=None) for _ in range(2)]
        assert all(res.ok for res in runs), [res.summary() for res in runs]
        parents = {int(lines_of(res, 0, "ppid")[0][0]) for res in runs}
        assert len(parents) == 1 and os.getpid() not in parents   # one server, forked both
        assert [s.proc.pid for s in warm._idle] == [*parents]
    finally:
        warm.close_idle()
    assert proc.wait_gone([*parents], 30) == []


def test_course_warm_0_starts_fresh_interpreters(server, tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_WARM", "0")
    res = launch([script(tmp_path, SHOW)], 1, timeout=120, warm=True, on_line=None)
    assert res.ok and int(lines_of(res, 0, "ppid")[0][0]) == os.getpid()


def test_a_deep_tmpdir_still_gives_a_warm_launch(tmp_path, monkeypatch):
    # the grader's sandbox sets TMPDIR inside the learner's copy: a socket there passed the 107 bytes a Unix
    # socket's path may have, the server never listened, and every graded rank started cold without a word
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(deep))
    monkeypatch.setenv("COURSE_WARM_KEEP", "0")      # ended with its session
    monkeypatch.setattr(tempfile, "tempdir", None)   # tempfile caches the folder it chose first
    monkeypatch.setattr(warm, "_active", None)
    with warm.session() as s:
        assert s.ready(), "the fork server did not start"
        assert len(os.fsencode(s.path)) <= warm.SOCKET_PATH_MAX and stat.S_IMODE(os.stat(s.dir).st_mode) == 0o700
        res = launch([script(tmp_path, SHOW)], 1, timeout=120, on_line=None)
        assert res.ok and int(lines_of(res, 0, "ppid")[0][0]) == s.proc.pid, res.summary()
    assert not os.path.exists(s.dir)


def test_the_server_ends_when_the_process_that_started_it_dies(tmp_path):
    code = ("import os\nfrom course_lib.runtime import warm\n"
            "with warm.session() as s:\n    s.ready(); print(s.proc.pid, s.dir, flush=True); os._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env=os.environ | {"OMP_NUM_THREADS": "1"})
    pid, folder = out.stdout.split()
    assert proc.wait_gone([int(pid)], 30) == [] and not os.path.exists(folder)   # stdin's EOF ended it


def test_the_next_session_with_the_same_variables_gets_the_kept_server_and_no_other(tmp_path, monkeypatch):
    monkeypatch.setattr(warm, "_active", None)   # outside this module's session
    monkeypatch.setattr(warm, "_idle", [])
    try:
        with warm.session() as first:
            first_res = launch([script(tmp_path, SHOW)], 1, timeout=120, on_line=None)
        with warm.session() as second:   # the next check: the same server, no torch import
            second_res = launch([script(tmp_path, SHOW)], 1, timeout=120, on_line=None)
        with warm.session(preload=("wave",)) as other, warm.session() as inner:   # other preloads: its own
            assert inner is None
        with warm.session(env={"OMP_NUM_THREADS": "3"}) as third:   # another start-up variable: its own
            pass
        assert second is first and other is not first and third not in (first, other)
        for res in (first_res, second_res):
            assert res.ok and int(lines_of(res, 0, "ppid")[0][0]) == first.proc.pid, res.summary()
        assert set(warm._idle) == {first, other, third} and all(s.alive() for s in warm._idle)
    finally:
        kept = list(warm._idle)
        warm.close_idle()
    assert warm._idle == [] and proc.wait_gone([s.proc.pid for s in kept], 30) == []
    assert not any(os.path.exists(s.dir) for s in kept)


def test_an_idle_server_ends_after_its_keep_time(monkeypatch):
    monkeypatch.setattr(warm, "_active", None)
    monkeypatch.setattr(warm, "_idle", [])
    monkeypatch.setenv("COURSE_WARM_KEEP", "1")
    with warm.session() as s:
        assert s.ready()
    assert s in warm._idle
    assert proc.wait_gone([s.proc.pid], 60) == [] and warm._idle == [] and not os.path.exists(s.dir)


def test_a_library_that_sets_kmp_variables_does_not_make_launches_cold(server, tmp_path, monkeypatch):
    monkeypatch.setenv("KMP_INIT_AT_FORK", f"x{uuid.uuid4()}")   # scikit-learn's import sets it after the server
    res = launch([script(tmp_path, SHOW)], 1, timeout=120, on_line=None)
    assert res.ok and int(lines_of(res, 0, "ppid")[0][0]) == server.proc.pid, res.summary()


def test_modules_preloaded_by_the_server_are_there_in_the_rank(tmp_path, monkeypatch):
    monkeypatch.setattr(warm, "_active", None)   # a session of its own, with a preload
    monkeypatch.setenv("COURSE_WARM_KEEP", "0")
    body = "import sys\nprint('has', 'wave' in sys.modules, 'torch' in sys.modules)\n"
    with warm.session(preload=("wave", "no_such_module_here")) as s:   # one that fails is left to the rank
        res = launch([script(tmp_path, body)], 1, timeout=120, on_line=None)
    assert res.ok and lines_of(res, 0, "has") == [["True", "True"]], res.summary()
    assert proc.wait_gone([s.proc.pid], 30) == []


def test_what_the_server_imported_is_frozen_out_of_a_ranks_collections(server, tmp_path):
    # gc.freeze() before the forks: a rank's collections walk (and so copy) only the objects it made itself
    body = "import gc\nprint('frozen', gc.get_freeze_count())\n"
    res = launch([script(tmp_path, body)], 1, timeout=120, on_line=None)
    [(count,)] = lines_of(res, 0, "frozen")
    assert res.ok and int(count) > 10_000, res.summary()


TORCHRUN_SHOW = """
import os, sys, psutil
rank = int(os.environ["RANK"])
agent = psutil.Process(os.getppid())
print("ppid", os.getppid(), "pid", os.getpid(), "agents_parent", agent.ppid())
shown = " ".join(agent.cmdline())   # as ps shows it
print("agent", *shown.split()[1:3], "warm_agent" in shown, shown.split()[-1] == sys.argv[0])
print("env", os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"], "COURSE_WARM_SOCKET" in os.environ,
      "SLURM_PROCID" in os.environ)
print("err", rank, file=sys.stderr)
sys.exit(rank * 5)
"""


def test_torchrun_in_a_session_forks_its_agent_from_the_server_and_the_agent_its_ranks(server, tmp_path):
    agent: list = []
    res = launch([script(tmp_path, TORCHRUN_SHOW)], 2, style="torchrun", timeout=120, on_line=None,
                 on_start=agent.append)
    assert res.failed_rank == 1 and res.ranks[1].returncode == 5, res.summary()   # from torchrun's summary
    for rank in (0, 1):   # as under torchrun: the agent is the rank's parent; the server forked the agent
        parent, _, _, _, agents_parent = lines_of(res, rank, "ppid")[0]
        assert [int(parent), int(agents_parent)] == [*agent, server.proc.pid], res.output()
        assert lines_of(res, rank, "agent") == [["-m", "torch.distributed.run", "False", "True"]], res.output()
        assert lines_of(res, rank, "env") == [["2", str(rank), "False", "False"]]
        assert lines_of(res, rank, "err") == [[str(rank)]]   # stderr: torchrun's own log file, teed


def test_stopping_a_warm_torchrun_stops_its_ranks(server, tmp_path):
    import threading
    stop, pids = threading.Event(), {}

    def on_line(rank, line):
        if line.startswith("pid "):
            pids[rank] = int(line.split()[1])
        if len(pids) == 2:
            stop.set()
    body = "import os, time\nprint('pid', os.getpid(), flush=True)\ntime.sleep(300)\n"
    res = launch([script(tmp_path, body)], 2, style="torchrun", timeout=300, on_line=on_line, stop=stop)
    assert sorted(pids) == [0, 1] and res.stuck_ranks == [0, 1], res.summary()
    assert proc.wait_gone(list(pids.values()), 30) == []
    assert server.proc.poll() is None


def test_a_torchrun_rank_killed_by_sigkill_dies_of_it(server, tmp_path):
    # torchrun's worker dies of the signal its rank died of; SIGKILL's handler cannot be set (it raised EINVAL)
    body = "import os, signal\nif os.environ['RANK'] == '1':\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    res = launch([script(tmp_path, body)], 2, style="torchrun", timeout=120, on_line=None)
    assert res.failed_rank == 1 and res.ranks[1].returncode == -signal.SIGKILL, res.summary()
    assert "OSError" not in res.output(), res.output()


def test_torchruns_worker_passes_signals_on_and_its_rank_dies_with_it(server):
    from course_lib.runtime.warm_rank import SOCKET_VAR
    code = "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(300)\n"
    env = os.environ | {SOCKET_VAR: server.path}
    for sig, expected in ((signal.SIGTERM, -signal.SIGTERM), (signal.SIGKILL, -signal.SIGKILL)):
        worker = subprocess.Popen([sys.executable, "-m", "course_lib.runtime.warm_rank", "-c", code], env=env,
                                  stdout=subprocess.PIPE, text=True)
        rank = int(worker.stdout.readline())
        assert rank != worker.pid and proc.wait_gone([rank], 0.5) == [rank]   # forked by the server, alive
        worker.send_signal(sig)    # TERM: passed on, and the worker dies of it as its rank did; KILL: the server
        assert worker.wait(60) == expected and proc.wait_gone([rank], 30) == []   # sees it go and kills the rank
        worker.stdout.close()
