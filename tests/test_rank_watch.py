"""The hub tests' RankWatch (tests/hub_support.py) sorts a learner's processes by their command lines; here with
processes of this test's own user, outside Slurm, one look at a time."""
import os
import shutil
import subprocess
import sys
import time

import hub_support as hs
import psutil


def _started(argv, executable=None):
    """The process, once it has exec'd (its command line is ``argv``)."""
    p = subprocess.Popen(argv, executable=executable)
    deadline = time.monotonic() + 30
    while psutil.Process(p.pid).cmdline() != argv:
        assert time.monotonic() < deadline, f"{argv} never showed its command line"
        time.sleep(0.005)
    return p


def test_rank_watch_sorts_by_the_command_line(tmp_path):
    # a program whose name is python but whose command line is not (CI: a child the kernel had forked, still named
    # python, was read as a Python stray once it had exec'd squeue)
    named_python = tmp_path / "python-sleep"
    shutil.copy(shutil.which("sleep"), named_python)
    procs = {"rank": _started([sys.executable, "-c", "import time; time.sleep(30)", "rank-marker-7"]),
             "stray": _started([sys.executable, "-c", "import time; time.sleep(30)"]),
             "not python": _started(["sleep", "30"], executable=str(named_python))}
    try:
        watch = hs.RankWatch(os.getuid(), "rank-marker-7")
        watch.look()
        pids = {name: p.pid for name, p in procs.items()}
        assert pids["rank"] in watch.outside and pids["rank"] not in watch.strays
        assert pids["stray"] in watch.strays
        assert pids["not python"] not in watch.strays, watch.strays[pids["not python"]]
        assert not watch.in_slurm and watch.looks == 1
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
