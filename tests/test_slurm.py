"""Real jobs against a real Slurm: the session's one-node cluster (tests/conftest.py, scripts/local-slurm/).

Skipped, with the reason, where the cluster cannot start (not root, no packages and no apt-get).
"""
import os
import subprocess
import textwrap
import time

import pytest
from conftest import ROOT, live_processes

from course_lib import jobs
from course_lib.jobs import JobSpec, SubmitError
from course_lib.jobs.multinode import ranks_by_node, slurm_nodes

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SERIAL = str(ROOT / "solutions" / "01_serial" / "mnist_classify.py")
DDP = str(ROOT / "solutions" / "02_ddp" / "mnist_classify_ddp.py")
QUICK = ["--dataset", "digits", "--epochs", "1"]


@pytest.fixture
def runs(slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path / "runs"


def test_engine_is_slurm(runs):
    assert jobs.engine()[0] == "slurm"


def test_serial_script(runs):
    spec = JobSpec("serial", SERIAL, args=QUICK + ["--dry-run"], launcher="python")
    job = jobs.submit(spec).wait(timeout=240, progress=False)
    assert job.state == "COMPLETED", job.summary()
    assert job.engine == "slurm" and job.exit_code == 0 and job.id.isdigit()
    assert job.run_dir == runs / f"serial-{job.id}" and job.script_path.exists()
    (rec,) = job.metrics()
    assert rec["epoch"] == 1 and rec["images_per_s"] > 0


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_ddp_solution_on_two_ranks(runs, launcher):
    spec = JobSpec(f"ddp-{launcher}", DDP, args=QUICK, ntasks_per_node=2, launcher=launcher)
    job = jobs.submit(spec).wait(timeout=300, progress=False)
    assert job.state == "COMPLETED", job.summary()
    per_rank = job.metrics(rank=None)
    assert sorted(r["rank"] for r in per_rank) == [0, 1], job.log()
    # both ranks saw the whole model train: same loss and accuracy, half the images each
    assert per_rank[0]["test_acc"] == per_rank[1]["test_acc"]
    assert "MASTER_ADDR=" in job.log() and f"MASTER_PORT={10000 + int(job.id) % 20000}" in job.log()
    (node,) = ranks_by_node(job)   # the hostname step: both ranks on the one node
    assert ranks_by_node(job)[node] == [0, 1], job.log()
    print(f"\n[slurm {launcher}] job {job.id}: submit -> COMPLETED in {job.elapsed:.1f} s")


def test_failed_job_brings_back_exit_code_reason_and_log_tail(runs, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("print('about to fail', flush=True)\nraise SystemExit(3)\n")
    job = jobs.submit(JobSpec("bad", str(bad), ntasks_per_node=1)).wait(timeout=120, progress=False)
    assert job.state == "FAILED" and job.exit_code == 3
    assert job.reason == "NonZeroExitCode"
    summary = job.summary()
    assert "about to fail" in summary and "exit code 3" in summary
    assert "hint:" not in summary   # a plain failure on one node: no rendezvous cause to name
    # the same answer from the accounting fallback (plain sacct is off here: sacct -c reads the job-completion log)
    state, _, code = job._from_accounting()
    assert (state, code) == ("FAILED", 3)


def test_cancel_while_running(runs, tmp_path):
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\nprint('started', flush=True)\ntime.sleep(300)\n")
    job = jobs.submit(JobSpec("sleepy", str(sleeper), ntasks_per_node=2))
    deadline = time.monotonic() + 120
    while "started" not in job.log() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert job.state == "RUNNING", job.summary()
    job.cancel()
    assert job.state == "CANCELLED"
    r = subprocess.run(["squeue", "-h", "-j", job.id], capture_output=True, text=True)
    assert r.stdout.strip() == ""


def test_cancel_waits_for_a_serial_program_that_saves_its_work(runs, tmp_path):
    """A serial program that catches scancel's SIGTERM to save its work (lesson 08) finishes inside the job: when
    cancel() returns it has ended, its work saved. The job script execs it; behind a shell, the SIGTERM killed the
    shell, the job ended at once, and the program (orphaned: this Slurm tracks processes by their parents) went on."""
    saver = tmp_path / "saver.py"
    saved = tmp_path / "saved"
    saver.write_text(textwrap.dedent(f"""
        import signal, sys, time
        def save(*_):
            time.sleep(2)                     # writing a checkpoint
            open({str(saved)!r}, "w").write("saved")
            sys.exit(0)
        signal.signal(signal.SIGTERM, save)
        print("started", flush=True)
        time.sleep(300)
    """))
    job = jobs.submit(JobSpec("saver", str(saver), launcher="python"))
    deadline = time.monotonic() + 120
    while "started" not in job.log() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert job.state == "RUNNING", job.summary()
    job.cancel()
    running = live_processes(str(saver))
    assert job.state == "CANCELLED" and not running, f"{job.summary()}; still running: {running}"
    assert saved.exists(), job.log()


def test_gpus_on_a_gpu_less_node_are_refused_with_sbatchs_words(runs):
    with pytest.raises(SubmitError, match="Requested node configuration is not available"):
        jobs.submit(JobSpec("gpu", SERIAL, gpus_per_node=1))
    assert not list(runs.glob("gpu-*")), "a refused job leaves no run folder"


def test_workshop_script_runs_as_is_with_sbatch(runs, tmp_path):
    # jobs/serial.sbatch exactly as committed, submitted from the course's folder like the README says
    r = subprocess.run(["sbatch", "--parsable", "--wait", f"--output={tmp_path}/%x-%j.out", "jobs/serial.sbatch",
                        "--dataset", "digits", "--epochs", "2", "--dry-run", "--num-workers", "0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=400,
                       env={**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"})
    out = "\n".join(p.read_text() for p in tmp_path.glob("serial-*.out"))
    assert r.returncode == 0, r.stderr + out
    from course_lib.metrics import parse_epoch_lines

    assert [rec["epoch"] for rec in parse_epoch_lines(out)] == [1, 2], out


def test_one_node_hides_the_localhost_mistake(runs):
    # why tests/test_two_node.py exists: on one node every rank shares one loopback, so this still works
    assert slurm_nodes()[0] == 1
    spec = JobSpec("localhost", DDP, args=QUICK + ["--dry-run"], ntasks_per_node=2, env={"MASTER_ADDR": "localhost"})
    job = jobs.submit(spec).wait(timeout=300, progress=False)
    assert job.state == "COMPLETED", job.summary()
    assert "MASTER_ADDR=localhost " in job.log() and "hint:" not in job.summary()
