"""A job's own monitoring read back (course_lib.jobs.monitor), written by the local engine (jobs.sampler),
and drawn (jobs.plots): real top output, a dmon log in NVIDIA's column layout, seff/sacct text, a real job."""
import os
import shutil
import subprocess
import sys
import time

import pytest

from course_lib import jobs
from course_lib.jobs import monitor, plots
from course_lib.runtime.proc import alive
from course_lib.runtime.sampler import Sampler

# Two frames of `top -b -d 1 -u root` captured on this machine (procps-ng 4.0.2), trimmed to a few rows
TOP = """\
top - 23:59:59 up  4:03,  0 user,  load average: 3.48, 2.44, 1.94
Tasks:  88 total,   7 running,  79 sleeping,   0 stopped,   2 zombie
%Cpu(s): 75.0 us, 25.0 sy,  0.0 ni,  0.0 id,  0.0 wa,  0.0 hi,  0.0 si,  0.0 st
MiB Mem :  24105.6 total,  20657.0 free,   1273.3 used,   2523.3 buff/cache
MiB Swap:      0.0 total,      0.0 free,      0.0 used.  22832.2 avail Mem

  PID USER      PR  NI    VIRT    RES    SHR S  %CPU  %MEM     TIME+ COMMAND
16938 root      20   0   16564  13588   6724 R  56.2   0.1   0:01.95 python3
16911 root      20   0  829952 376316 110000 R  50.0   1.5   0:04.35 python
    1 root      20   0   40824  11772   6296 S   0.0   0.0   1:36.51 process_a+

top - 00:00:01 up  4:03,  0 user,  load average: 3.48, 2.44, 1.94
Tasks:  86 total,   7 running,  77 sleeping,   0 stopped,   2 zombie
%Cpu(s): 93.2 us,  6.8 sy,  0.0 ni,  0.0 id,  0.0 wa,  0.0 hi,  0.0 si,  0.0 st
MiB Mem :  24105.6 total,  20657.0 free,   1273.3 used,   2523.3 buff/cache
MiB Swap:      0.0 total,      0.0 free,      0.0 used.  22832.2 avail Mem

  PID USER      PR  NI    VIRT    RES    SHR S  %CPU  %MEM     TIME+ COMMAND
16911 root      20   0  877124 425796 113064 R 167.3   1.7   0:05.03 python train.py --epochs 1
16938 root      20   0   16564  13588   6724 R  34.7   0.1   0:02.30 python3
"""

# `nvidia-smi dmon -s um -d 5` on two GPUs, in the column layout of NVIDIA's nvidia-smi(1) (dmon section):
# written by hand (no GPU here); the header repeats, "-" is a metric the GPU does not support
DMON = """\
# gpu     sm    mem    enc    dec    jpg    ofa     fb   bar1   ccpm
# Idx      %      %      %      %      %      %     MB     MB     MB
    0      0      0      0      0      -      -    421      2      0
    1      0      0      0      0      -      -    421      2      0
    0     97     41      0      0      -      -  18012      5      0
    1     95     40      0      0      -      -  18010      5      0
# gpu     sm    mem    enc    dec    jpg    ofa     fb   bar1   ccpm
# Idx      %      %      %      %      %      %     MB     MB     MB
    0     12      3      0      0      -      -  18012      5      0
    1     10      2      0      0      -      -  18010      5      0
"""

DMON_TIMED = """\
#Time        gpu     sm    mem    enc    dec     fb   bar1
#HH:MM:SS    Idx      %      %      %      %     MB     MB
 10:00:00      0     80     30      0      0   1000      4
 10:00:05      0     90     35      0      0   1000      4
"""

SEFF = """\
Job ID: 1234
Cluster: workshop
User/Group: alice/alice
State: COMPLETED (exit code 0)
Nodes: 1
Cores per node: 2
CPU Utilized: 00:00:30
CPU Efficiency: 75.00% of 00:00:40 core-walltime
Job Wall-clock time: 00:00:20
Memory Utilized: 412.00 MB
Memory Efficiency: 10.06% of 4.00 GB
"""


def test_top_frames_are_read_by_their_column_header():
    frames = monitor.parse_top(TOP)
    assert [f["t"] for f in frames] == [0.0, 2.0]          # 23:59:59 -> 00:00:01: past midnight, 2 s
    assert [r["pid"] for r in frames[0]["rows"]] == [16938, 16911, 1]
    assert frames[1]["rows"][0]["command"] == "python train.py --epochs 1"   # spaces kept (top -c)
    assert monitor.cpu_series(frames) == ([0.0, 2.0], [106.2, 202.0])


def test_real_top_output_shows_a_busy_process(tmp_path):
    if shutil.which("top") is None:
        pytest.skip("top is not installed here (procps)")
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                             "print('spinning', flush=True)\nwhile time.process_time() - t < 30: pass"],
                            stdout=subprocess.PIPE, text=True)
    try:
        # top from the first spin on: in CI (4 CPU-bound processes beside it, load 10) the three frames fell on
        # the interpreter's start-up and showed 0.0, 7.7, 8.9 %
        assert busy.stdout.readline().strip() == "spinning"
        out = subprocess.run(["top", "-b", "-d", "1", "-n", "3", "-p", str(busy.pid)], capture_output=True,
                             text=True, timeout=60).stdout
    finally:
        busy.kill()
        busy.wait()
    frames = monitor.parse_top(out)
    assert len(frames) == 3 and all(f["rows"] and f["rows"][0]["pid"] == busy.pid for f in frames), out
    # a spinning process gets its share of the cores: about 2 cores / load (8 % at load 26 here), never 0; a
    # column read wrongly (%MEM is 0.0) would give 0
    assert max(monitor.cpu_series(frames)[1]) > 1, out


def test_dmon_samples_per_gpu_with_their_time():
    rows = monitor.parse_dmon(DMON)
    assert len(rows) == 6 and rows[0]["jpg"] is None
    assert monitor.gpu_series(rows) == {0: ([0.0, 5.0, 10.0], [0.0, 97.0, 12.0]),
                                        1: ([0.0, 5.0, 10.0], [0.0, 95.0, 10.0])}
    timed = monitor.parse_dmon(DMON_TIMED)
    assert [(r["t"], r["sm"]) for r in timed] == [(0.0, 80.0), (5.0, 90.0)]
    assert monitor.parse_dmon("Failed to initialize NVML: Driver/library version mismatch\n") == []


def test_seff_and_sacct_are_read():
    seff = monitor.parse_seff(SEFF)
    assert seff["cpu_efficiency_pct"] == 75.0 and seff["elapsed_s"] == 20 and seff["Memory Utilized"] == "412.00 MB"
    rows = monitor.parse_sacct("1234|COMPLETED|00:00:20|00:30.000|2|\n"
                               "1234.batch|COMPLETED|00:00:20|00:00.500|2|2048K\n"
                               "1234.0|COMPLETED|00:00:18|00:29.500|2|412M\n")
    assert len(rows) == 3 and rows[2]["MaxRSS"] == "412M"
    assert monitor.cpu_efficiency(rows) == 75.0        # 30 s CPU / (2 cores x 20 s), as seff computes it
    assert monitor.slurm_seconds("1-00:00:01") == 86401 and monitor.slurm_seconds("N/A") is None


def test_the_plot_draws_cpu_and_gpu_and_missing_logs_are_one_sentence(tmp_path, capsys):
    (tmp_path / "j-7.top.log").write_text(TOP)
    (tmp_path / "j-7.gpu.log").write_text(DMON)
    fig = plots.plot_usage(tmp_path)
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert labels == ["CPU (top %CPU, summed)", "GPU 0 (dmon sm %)", "GPU 1 (dmon sm %)"]
    assert capsys.readouterr().out == ""

    (tmp_path / "j-7.gpu.log").unlink()
    assert plots.plot_usage(tmp_path) is not None
    assert capsys.readouterr().out.strip() == "no GPU log: this job ran on CPU (nvidia-smi was not there to start)"

    empty = tmp_path / "none"
    empty.mkdir()
    assert plots.plot_usage(empty) is None
    assert "no CPU log: the job ran without monitor=True" in capsys.readouterr().out


@pytest.mark.slow   # a multi-process run: make test, not test-fast
def test_the_sampler_writes_top_frames_of_its_childrens_cpu(tmp_path):
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                             "while time.process_time() - t < 3: pass"])
    try:
        with Sampler(tmp_path / "s.top.log", every=0.5):
            busy.wait(timeout=120)
    finally:
        busy.kill()
    frames = monitor.parse_top((tmp_path / "s.top.log").read_text())
    mine = [r for f in frames for r in f["rows"] if r["pid"] == busy.pid]
    assert mine and max(r["cpu"] for r in mine) > 10, frames


@pytest.mark.slow   # a multi-process run: make test, not test-fast
def test_a_local_job_with_monitor_writes_its_cpu_log_and_leaves_nothing_running(local):
    spin = local / "spin.py"   # each rank burns 3 s of CPU (CPU time, not wall time: the machine is busy)
    spin.write_text("import time\nt = time.process_time()\nwhile time.process_time() - t < 3: pass\nprint('done')\n")
    job = jobs.submit(jobs.JobSpec("spin", str(spin), ntasks_per_node=2, monitor=True)).wait(timeout=180,
                                                                                            progress=False)
    assert job.state == "COMPLETED", job.summary()
    log = job.run_dir / f"spin-{job.id}.top.log"
    frames = monitor.parse_top(log.read_text())
    ranks = {int(p) for p in (job.run_dir / "pids").read_text().split()}
    seen = {r["pid"] for f in frames for r in f["rows"]}
    assert ranks <= seen, f"ranks {ranks}, sampled {seen}"
    assert max(monitor.cpu_series(frames)[1]) > 20
    assert not alive(list(ranks)) and job.proc.poll() is not None
    assert plots.plot_usage(job) is not None


def test_without_monitor_the_local_engine_writes_no_cpu_log(local):
    ok = local / "ok.py"
    ok.write_text("print('hi')\n")
    job = jobs.submit(jobs.JobSpec("quiet", str(ok), launcher="python")).wait(timeout=60, progress=False)
    assert job.state == "COMPLETED", job.summary()
    assert monitor.top_log(job.run_dir) is None


@pytest.mark.skipif(shutil.which("sacct") is None, reason="sacct is not installed here")
def test_slurm_report_says_what_it_could_not_get(monkeypatch):
    # no controller: sacct fails; the report still says which tool was missing or what sacct answered
    monkeypatch.setenv("SLURM_CONF", os.devnull)
    text = monitor.slurm_report("1")
    assert ("seff is not installed" in text or "$ seff 1" in text) and "sacct" in text


def test_sampler_stops_its_thread(tmp_path):
    with Sampler(tmp_path / "t.top.log", every=0.2) as s:
        time.sleep(0.5)
    assert not s._thread.is_alive()
