"""course_lib.jobs without Slurm: job descriptions, rendered scripts, site profiles, jobs/ drift, the local engine."""
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from conftest import PYTHON, ROOT, live_processes

from course_lib import jobs
from course_lib.jobs import JobSpec, JobSpecError, SiteError, SubmitError, load_site, time_seconds
from course_lib.jobs.workshop import render_all
from course_lib.runtime.job import rank_labelled
from course_lib.runtime.proc import alive
from course_lib.runtime.slurm import _code

SERIAL = str(ROOT / "solutions" / "01_serial" / "mnist_classify.py")
DDP = str(ROOT / "solutions" / "02_ddp" / "mnist_classify_ddp.py")


def script_text(spec, site="local"):
    return jobs.script(spec, site, engine_name="slurm", runs="/tmp/runs")


def bash_syntax_ok(text, tmp_path):
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------------------------------- descriptions
@pytest.mark.parametrize("text, seconds", [("10", 600), ("5:30", 330), ("01:00:00", 3600), ("1-12", 129600),
                                           ("1-0:30:00", 88200), ("0:03", 3)])
def test_time_limits_in_slurm_forms(text, seconds):
    assert time_seconds(text) == seconds


@pytest.mark.parametrize("kwargs, words", [
    (dict(time="ten minutes"), "not a Slurm time limit"),
    (dict(name="my job"), "name 'my job'"),
    (dict(launcher="mpirun"), "launcher 'mpirun'"),
    (dict(ntasks_per_node=0), "ntasks_per_node"),
    (dict(launcher="python", ntasks_per_node=2), "launcher 'python' runs one process"),
    (dict(env={"1BAD": "x"}), "not a valid environment variable"),
])
def test_a_bad_description_says_which_field(kwargs, words):
    with pytest.raises(JobSpecError, match=words):
        JobSpec(**{"name": "j", "script": "x.py", **kwargs})


def test_epochs_are_read_from_the_arguments():
    assert JobSpec("j", "x.py", args=["--epochs", "3"]).epochs() == 3
    assert JobSpec("j", "x.py", args=["--epochs=4"]).epochs() == 4
    assert JobSpec("j", "x.py").epochs(14) == 14


# ------------------------------------------------------------------------------------------- rendering
def test_srun_script_teaches_what_the_workshop_teaches(tmp_path):
    text = script_text(JobSpec("ddp", DDP, args=["--epochs", "1"], ntasks_per_node=2, cpus_per_task=2))
    assert "#SBATCH --ntasks-per-node=2\n#SBATCH --cpus-per-task=2\n" in text
    assert 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in text
    assert "export MASTER_PORT=$(( 10000 + SLURM_JOB_ID % 20000 ))" in text
    assert "export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK" in text
    assert f"srun --label --kill-on-bad-exit=1 {PYTHON} {DDP} --epochs 1" in text
    assert "\nsrun --label hostname\n" in text   # the log says which node each task ran on
    assert "gpu" not in text.lower().replace("gpu use", "")   # no GPU lines when none are asked for
    assert "trap" not in text and "NCCL" not in text
    assert f"export PYTHONPATH={ROOT}" in text and "export GLOO_SOCKET_IFNAME=lo" in text
    bash_syntax_ok(text, tmp_path)


def test_torchrun_script_has_one_task_per_node_and_a_c10d_rendezvous(tmp_path):
    text = script_text(JobSpec("tr", DDP, nodes=2, ntasks_per_node=4, cpus_per_task=2, launcher="torchrun"))
    assert "#SBATCH --nodes=2\n" in text
    assert "#SBATCH --ntasks-per-node=1\n" in text and "#SBATCH --cpus-per-task=8\n" in text
    assert "--nnodes=$SLURM_JOB_NUM_NODES --nproc_per_node=4" in text
    assert "--rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT" in text
    assert "export OMP_NUM_THREADS=$(( SLURM_CPUS_PER_TASK / 4 ))" in text
    assert text.count("srun --label --kill-on-bad-exit=1 ") == 1 and "\nsrun --label hostname\n" in text
    bash_syntax_ok(text, tmp_path)


def test_plain_python_runs_without_srun(tmp_path):
    text = script_text(JobSpec("serial", SERIAL, launcher="python"))
    assert f"\nexec {PYTHON} {SERIAL}\n" in text and "srun --label" not in text   # scancel's SIGTERM reaches it
    bash_syntax_ok(text, tmp_path)
    monitored = script_text(JobSpec("serial", SERIAL, launcher="python", monitor=True))
    assert f"\n{PYTHON} {SERIAL}\n" in monitored   # not exec'd: the shell's EXIT trap stops the monitors


def test_gpu_lines_nccl_and_monitoring_only_when_asked(tmp_path):
    site = load_site("example-gpu-cluster")
    text = jobs.script(JobSpec("g", DDP, ntasks_per_node=4, gpus_per_node=4, monitor=True), site, "slurm", "/tmp/r")
    assert "#SBATCH --gpus-per-node=4\n" in text
    assert "export NCCL_IB_HCA=mlx5" in text and "export NCCL_SOCKET_IFNAME=ib0" in text
    assert "nvidia-smi dmon" in text and "top -b" in text and "trap 'kill $MONITOR_PIDS" in text
    assert "module load cuda/12.4\nmodule load pytorch/2.5\n" in text
    assert "#SBATCH --partition=gpu\n#SBATCH --account=my-project\n#SBATCH --reservation=workshop\n" in text
    bash_syntax_ok(text, tmp_path)
    cpu = jobs.script(JobSpec("c", DDP, ntasks_per_node=4), site, "slurm", "/tmp/r")
    assert "--gpus-per-node" not in cpu and "--gres" not in cpu and "NCCL_" not in cpu and "dmon" not in cpu


def test_the_job_overrides_the_site_and_gres_is_a_site_choice(tmp_path):
    site = load_site("example-gpu-cluster")
    text = jobs.script(JobSpec("g", DDP, account="other", reservation="", modules=[]), site, "slurm", "/tmp/r")
    assert "--account=other" in text and "--reservation" not in text and "module load" not in text
    path = tmp_path / "gres.toml"
    path.write_text(site.path.read_text().replace('gpu_request = "gpus-per-node"', 'gpu_request = "gres"'))
    text = jobs.script(JobSpec("g", DDP, gpus_per_node=2), load_site(str(path)), "slurm", "/tmp/r")
    assert "#SBATCH --gres=gpu:2\n" in text and "--gpus-per-node" not in text


# ------------------------------------------------------------------------------------------- site profiles
@pytest.mark.parametrize("name", ["local", "local-2nodes", "generic", "example-gpu-cluster"])
def test_shipped_profiles_load(name):
    site = load_site(name)
    assert site.name == name and site.cpus_per_node >= 1


def test_course_site_selects_the_profile(monkeypatch):
    monkeypatch.setenv("COURSE_SITE", "example-gpu-cluster")
    assert load_site().gpus_per_node == 4
    monkeypatch.setenv("COURSE_SITE", "exmple-gpu-cluster")
    with pytest.raises(SiteError, match="did you mean 'example-gpu-cluster'"):
        load_site()


def _profile(tmp_path, edit):
    text = (ROOT / "course_lib" / "jobs" / "sites" / "local.toml").read_text()
    path = tmp_path / "mysite.toml"
    path.write_text(edit(text))
    return str(path)


def test_a_misspelled_key_is_named(tmp_path):
    path = _profile(tmp_path, lambda t: t.replace('account = ""', 'acount = ""'))
    with pytest.raises(SiteError, match=r"unknown key 'acount' \(did you mean 'account'\?\)"):
        load_site(path)


def test_a_missing_key_is_named(tmp_path):
    path = _profile(tmp_path, lambda t: t.replace('reservation = ""', ""))
    with pytest.raises(SiteError, match="missing key 'reservation'"):
        load_site(path)


def test_a_wrong_type_is_named(tmp_path):
    path = _profile(tmp_path, lambda t: t.replace("gpus_per_node = 0", 'gpus_per_node = "four"'))
    with pytest.raises(SiteError, match="gpus_per_node must be a int"):
        load_site(path)


# ------------------------------------------------------------------------------------------- jobs/
def _top(text, keys):
    """A profile with ``keys`` (TOML lines) added at the top level, before its tables."""
    return text.replace("\n[env]", "\n" + keys + "\n[env]", 1)


def test_the_optional_request_keys_are_checked_and_written(tmp_path):
    path = _profile(tmp_path, lambda t: _top(t, 'mem = "16G"\nconstraint = "a100"\nsbatch_extra = ["--exclusive"]\n'
                    'srun_args = ["--cpu-bind=cores"]\ntime = "01:00:00"\n'))
    site = load_site(path)
    text = script_text(JobSpec("d", DDP, ntasks_per_node=2), site)
    assert "#SBATCH --mem=16G\n#SBATCH --constraint=a100\n#SBATCH --exclusive\n" in text
    assert "srun --label --kill-on-bad-exit=1 --cpu-bind=cores " in text
    assert all("#SBATCH --time=01:00:00\n" in t for t in render_all(site).values())
    bash_syntax_ok(text, tmp_path)
    with pytest.raises(SiteError, match="sbatch_extra must list options"):
        load_site(_profile(tmp_path, lambda t: _top(t, 'sbatch_extra = ["exclusive"]')))
    with pytest.raises(SiteError, match="module_init must be"):
        load_site(_profile(tmp_path, lambda t: _top(t, 'module_init = "lmod.sh"')))
    with pytest.raises(SiteError, match="mem must be a str"):
        load_site(_profile(tmp_path, lambda t: _top(t, "mem = 16")))


def _module_job(tmp_path, module_init):
    """A one-process job on a site whose `module` command exists only in its init file (as on Lmod sites)."""
    init = tmp_path / "lmod-init.sh"
    init.write_text('module() { echo "module $*" >> "$MODULE_LOG"; }\n')
    path = _profile(tmp_path, lambda t: t.replace("modules = []", 'modules = ["cuda/12.4", "pytorch/2.5"]')
                    .replace('python = ""', f'python = "{PYTHON}"'))
    path = _profile(tmp_path, lambda t: _top(Path(path).read_text(), f'module_init = "{module_init}"'
                                             .replace("INIT", str(init))))
    hello = tmp_path / "hello.py"
    hello.write_text("print('trained')\n")
    text = script_text(JobSpec("m", str(hello), launcher="python"), load_site(path))
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    # the environment a job submitted from a hub kernel may have: no module function, no profile read
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MODULE_LOG": str(tmp_path / "modules.log"),
           "SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": "1", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NAME": "m"}
    return text, subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                                timeout=60), tmp_path / "modules.log"


def test_a_job_loads_modules_through_the_sites_init_file_even_without_an_inherited_module_command(tmp_path):
    text, r, log = _module_job(tmp_path, "INIT")
    assert r.returncode == 0 and "trained" in r.stdout, r.stdout + r.stderr
    assert log.read_text() == "module load cuda/12.4\nmodule load pytorch/2.5\n"
    assert text.index("source ") < text.index("module load")


def test_a_job_without_a_module_command_stops_with_what_to_set(tmp_path):
    text, r, log = _module_job(tmp_path, "")
    assert r.returncode == 2 and "trained" not in r.stdout and not log.exists()
    assert "no 'module' command in this job; set module_init in the site profile" in r.stderr
    login_text, _, _ = _module_job(tmp_path, "login")
    assert login_text.startswith("#!/bin/bash -l\n") and text.startswith("#!/bin/bash\n")


def test_scripts_for_a_shared_install_run_its_python_and_its_serial_script(tmp_path):
    site = load_site("generic")
    texts = render_all(site, install=tmp_path / "inst")
    serial = texts["serial.sbatch"]
    assert f"{tmp_path}/inst/venv/bin/python {tmp_path}/inst/course/solutions/01_serial/mnist_classify.py" in serial
    assert f"export PYTHONPATH={tmp_path}/inst/course" in serial and "Submit from your workspace" in serial
    assert '"${SCRIPT:-exercises/02_ddp/mnist_classify_ddp.py}"' in texts["ddp_srun.sbatch"]
    assert f"{tmp_path}/inst/venv/bin/python -m torch.distributed.run" in texts["ddp_torchrun.sbatch"]
    for text in texts.values():
        bash_syntax_ok(text, tmp_path)


def test_a_check_job_goes_to_the_sites_check_partition(tmp_path):
    from course_lib.check_slurm import spec_for
    site = load_site(_profile(tmp_path, lambda t: _top(t.replace('partition = ""', 'partition = "gpu"'),
                                                       'check_partition = "cpu"\ncheck_qos = "short"')))
    job = spec_for("allreduce", "a.py", {}, site, 5).with_site(site)
    assert (job.partition, job.qos) == ("cpu", "short")
    plain = load_site(_profile(tmp_path, lambda t: t.replace('partition = ""', 'partition = "gpu"')))
    assert spec_for("allreduce", "a.py", {}, plain, 5).with_site(plain).partition == "gpu"


def test_jobs_folder_matches_the_templates():
    r = subprocess.run([PYTHON, "-m", "course_lib.cli", "jobs", "--check"], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_drift_is_caught_and_hand_edits_are_kept(tmp_path):
    from course_lib.jobs.cli import main as course_jobs

    assert course_jobs(["--out", str(tmp_path)]) == 0
    assert course_jobs(["--out", str(tmp_path), "--check"]) == 0
    edited = tmp_path / "ddp_srun.sbatch"
    edited.write_text(edited.read_text().replace("--time=00:30:00", "--time=02:00:00"))
    assert course_jobs(["--out", str(tmp_path), "--check"]) == 1
    assert course_jobs(["--out", str(tmp_path)]) == 1          # kept, with a message
    assert "--time=02:00:00" in edited.read_text()
    assert course_jobs(["--out", str(tmp_path), "--force"]) == 0
    assert "--time=02:00:00" not in edited.read_text()


def test_workshop_scripts_render_for_a_gpu_site_with_one_rank_per_gpu(tmp_path):
    texts = render_all(load_site("example-gpu-cluster"))
    assert "#SBATCH --ntasks-per-node=4\n" in texts["ddp_srun.sbatch"]
    assert "#SBATCH --gpus-per-node=4\n" in texts["ddp_srun.sbatch"]
    assert "--nproc_per_node=4" in texts["ddp_torchrun_2nodes.sbatch"]
    assert "#SBATCH --nodes=2\n" in texts["ddp_torchrun_2nodes.sbatch"]
    for text in texts.values():
        bash_syntax_ok(text, tmp_path)


# ------------------------------------------------------------------------------------------- reading logs
def test_rank_labels_from_srun_and_torchrun():
    srun = JobSpec("s", "x.py", ntasks_per_node=12)
    assert rank_labelled(" 3: epoch=1 a=1\n11: epoch=1 a=2", srun) == "3: epoch=1 a=1\n11: epoch=1 a=2"
    tr = JobSpec("t", "x.py", nodes=2, ntasks_per_node=4, launcher="torchrun")
    assert rank_labelled("1: [default2]:epoch=1 a=1\n[default1]:x", tr) == "6: epoch=1 a=1\n1: x"


def test_torchrun_lines_cut_by_tee_in_a_job_log_are_joined_per_rank():
    # as in tests/test_launch.py's stream, here in the log file: node 1's --tee cut rank 5's loss line
    tr = JobSpec("t", "x.py", nodes=2, ntasks_per_node=4, launcher="torchrun")
    log = ("1: [default1]:epoch=1 loss=2.09[default1]:\n"
           "1: [default1]:epoch=2 lo[default0]:rank 4 ok\n"
           "0: [default1]:epoch=2 loss=1.5\n"
           "1: [default1]:ss=1.7\n"
           "0: W1123 torchrun's own [default0]: mention\n"
           "1: [default3]:no newline at the end[default3]:")
    assert rank_labelled(log, tr).splitlines() == [
        "5: epoch=1 loss=2.09", "4: rank 4 ok", "1: epoch=2 loss=1.5", "5: epoch=2 loss=1.7",
        "0: W1123 torchrun's own [default0]: mention", "7: no newline at the end"]


def test_slurm_exit_codes():
    assert _code("3:0") == 3 and _code("0:0") == 0 and _code("0:15") == -15 and _code(None) is None


# ------------------------------------------------------------------------------------------- engines
def test_engine_choice(monkeypatch):
    monkeypatch.setenv("COURSE_ENGINE", "local")
    assert jobs.engine()[0] == "local"
    monkeypatch.setenv("COURSE_ENGINE", "lsf")
    with pytest.raises(ValueError, match="COURSE_ENGINE"):
        jobs.engine()
    monkeypatch.setenv("COURSE_ENGINE", "auto")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert jobs.engine() == ("local", "no sbatch on PATH")
    with pytest.raises(SubmitError, match="no sbatch on PATH"):
        jobs.engine("slurm")


def test_one_chooser_for_jobs_checks_and_runs(tmp_path, monkeypatch):
    """jobs.choose: the argument, then the kind's variable, then the site profile's key (jobs: auto); a run inside a
    job stays local, and each kind's wrong choice names its own variable."""
    for key in ("COURSE_ENGINE", "COURSE_CHECKS", "COURSE_RUNS", "COURSE_IN_JOB", "SLURM_JOB_ID"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("COURSE_SITE", "example-gpu-cluster")     # checks = "slurm", runs = "slurm"
    monkeypatch.setenv("PATH", str(tmp_path))                     # no sbatch: auto takes local
    assert jobs.choose("checks")[0] == "slurm" and jobs.choose("runs")[0] == "slurm"
    assert jobs.choose("jobs") == ("local", "no sbatch on PATH") and jobs.choose("checks", "auto")[0] == "local"
    monkeypatch.setenv("COURSE_CHECKS", "LOCAL")
    monkeypatch.setenv("COURSE_RUNS", "local")
    assert jobs.choose("checks")[0] == "local" and jobs.choose("runs")[0] == "local"
    assert jobs.choose("checks", "slurm")[0] == "slurm" and jobs.choose("runs", "slurm")[0] == "slurm"
    monkeypatch.setenv("COURSE_IN_JOB", "1")
    assert jobs.choose("runs", "slurm")[0] == "local" and jobs.choose("checks", "slurm")[0] == "slurm"
    monkeypatch.delenv("COURSE_IN_JOB")
    for kind, variable in (("jobs", "COURSE_ENGINE"), ("checks", "COURSE_CHECKS"), ("runs", "COURSE_RUNS")):
        with pytest.raises(ValueError, match=f"not 'lsf'.*{variable}"):
            jobs.choose(kind, "lsf")


def test_choose_takes_the_first_rung_set_in_its_order(tmp_path, monkeypatch):
    """jobs.choose's order, one rung taken away at a time, each rung set to the opposite of the one below it (so a
    rung read in the wrong place changes the answer): the call's choice, the enclosing check's (runs), COURSE_CHECKS
    or COURSE_RUNS, the profile's checks or runs, COURSE_ENGINE, the profile's engine, the kind's default."""
    from course_lib.runtime.scope import scope

    def profile(name, **keys):
        text = (ROOT / "course_lib" / "jobs" / "sites" / "local.toml").read_text()
        text = "\n".join(line for line in text.splitlines() if not line.startswith(("checks =", "runs =")))
        path = tmp_path / f"{name}.toml"
        path.write_text("".join(f'{k} = "{v}"\n' for k, v in keys.items()) + text)
        return str(path)

    for key in ("COURSE_ENGINE", "COURSE_CHECKS", "COURSE_RUNS", "COURSE_IN_JOB", "SLURM_JOB_ID"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))                     # no sbatch: auto takes local, slurm is refused
    for kind, variable in (("checks", "COURSE_CHECKS"), ("runs", "COURSE_RUNS")):
        monkeypatch.setenv("COURSE_SITE", profile("all", engine="slurm", checks="slurm", runs="slurm"))
        monkeypatch.setenv("COURSE_ENGINE", "local")
        monkeypatch.setenv(variable, "local")
        assert jobs.choose(kind, "slurm") == ("slurm", "asked for the slurm engine")
        if kind == "runs":
            with scope(engine="slurm"):
                assert jobs.choose(kind, "local") == ("local", "asked for the local engine")
                assert jobs.choose(kind) == ("slurm", "the enclosing check's engine")
        assert jobs.choose(kind) == ("local", f"{variable}=local")
        monkeypatch.delenv(variable)
        assert jobs.choose(kind) == ("slurm", f"the site profile all's {kind}")
        monkeypatch.setenv("COURSE_SITE", profile("engine", engine="slurm"))
        assert jobs.choose(kind) == ("local", "COURSE_ENGINE=local")
        monkeypatch.delenv("COURSE_ENGINE")
        assert jobs.choose(kind) == ("slurm", "the site profile engine's engine")
        monkeypatch.setenv("COURSE_SITE", profile("none"))
        assert jobs.choose(kind) == ("local", f"the default for {kind}")
    monkeypatch.setenv("COURSE_IN_JOB", "1")                      # above every rung: a run inside a job stays here
    assert jobs.choose("runs", "slurm")[0] == "local" and jobs.choose("checks", "slurm")[0] == "slurm"
    monkeypatch.delenv("COURSE_IN_JOB")
    # jobs: no rung of their own between the call's and COURSE_ENGINE, and auto by default
    monkeypatch.setenv("COURSE_SITE", profile("jobs", engine="local", checks="slurm", runs="slurm"))
    monkeypatch.setenv("COURSE_ENGINE", "slurm")
    monkeypatch.setenv("COURSE_CHECKS", "local")
    assert jobs.choose("jobs", "local") == ("local", "asked for the local engine")
    with pytest.raises(SubmitError, match="the Slurm engine was asked for, but no sbatch on PATH"):
        jobs.choose("jobs")
    monkeypatch.delenv("COURSE_ENGINE")
    assert jobs.choose("jobs") == ("local", "the site profile jobs's engine")
    monkeypatch.setenv("COURSE_SITE", profile("none"))
    assert jobs.choose("jobs") == ("local", "no sbatch on PATH")
    with pytest.raises(SiteError, match="engine must be one of"):
        load_site(profile("typo", engine="cluster"))


@pytest.mark.slow   # a job that runs for seconds
def test_the_one_wait_leaves_the_job_running_when_told_to(local):
    """runner.wait, the one loop that waits for a job: ``timeout`` returns and a Ctrl-C with interrupt_cancels=False
    stops the waiting, both leaving the job running (Job.wait's follow); a true on_poll ends the wait."""
    from course_lib.runtime import runner

    sleeper = local / "sleeper.py"
    sleeper.write_text("import time\nprint('started', flush=True)\ntime.sleep(300)\n")
    job = jobs.submit(JobSpec("sleepy", str(sleeper), launcher="python"))
    start = time.monotonic()
    job.wait(timeout=2, progress=False)
    assert 2 <= time.monotonic() - start < 30 and not job.done

    def ctrl_c():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runner.wait(job, say=None, run_timeout=float("inf"), on_poll=ctrl_c, interrupt_cancels=False)
    looks = []
    runner.wait(job, say=None, run_timeout=float("inf"), poll=0.1, on_poll=lambda: looks.append(1) or len(looks) > 2)
    assert len(looks) == 3 and not job.done
    job.cancel()
    assert job.state == "CANCELLED"


def _alive(pid):
    return bool(alive([pid]))   # running and not a zombie


@pytest.mark.slow   # a multi-process run: make test, not test-fast
def test_local_serial_job_completes_with_metrics(local):
    spec = JobSpec("serial", SERIAL, args=["--dataset", "digits", "--epochs", "1", "--dry-run"], launcher="python")
    job = jobs.submit(spec).wait(timeout=180, progress=False)
    assert job.state == "COMPLETED", job.summary()
    assert job.exit_code == 0 and job.engine == "local" and job.id.startswith("local-")
    assert job.run_dir == local / "runs" / f"serial-{job.id}"
    (rec,) = job.metrics()
    assert rec["epoch"] == 1 and rec["images_per_s"] > 0 and 0 <= rec["test_acc"] <= 1
    assert "srun" not in job.script_path.read_text().split("#SBATCH --output")[1].split("\n", 1)[0]


def test_local_failing_job_gives_exit_code_reason_and_log_tail(local):
    bad = local / "bad.py"
    bad.write_text("print('loading the data', flush=True)\nraise SystemExit('no data here: giving up')\n")
    job = jobs.submit(JobSpec("bad", str(bad), launcher="python")).wait(timeout=60, progress=False)
    assert job.state == "FAILED" and job.exit_code == 1
    assert "rank 0 failed first" in job.reason
    summary = job.summary()
    assert "no data here: giving up" in summary and "FAILED" in summary and "exit code 1" in summary


@pytest.mark.slow   # a multi-process run (3.4 s): make test, not test-fast
def test_local_cancel_stops_every_rank(local):
    sleeper = local / "sleeper.py"
    sleeper.write_text("import time\nprint('started', flush=True)\ntime.sleep(300)\n")
    job = jobs.submit(JobSpec("sleepy", str(sleeper), ntasks_per_node=2))
    deadline = time.monotonic() + 60
    while "started" not in job.log() and time.monotonic() < deadline:
        time.sleep(0.2)
    pids = [int(p) for p in (job.run_dir / "pids").read_text().split()]
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    job.cancel()
    assert job.state == "CANCELLED"
    assert not any(_alive(p) for p in pids) and job.proc.poll() is not None


@pytest.mark.slow   # waits out the 30 s the runner is given
def test_local_cancel_kills_a_runner_that_does_not_answer_and_all_below_it(local):
    # the runner is stopped (SIGSTOP): it cannot stop its ranks, so cancel kills it, its ranks and what they started
    marker = f"course-cancel-{time.monotonic_ns()}"
    sleeper = local / "sleeper.py"
    sleeper.write_text("import subprocess, sys, time\n"
                       f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', '{marker}'], "
                       "start_new_session=True)\nprint('started', flush=True)\ntime.sleep(300)\n")
    job = jobs.submit(JobSpec("deaf", str(sleeper), ntasks_per_node=2))
    deadline = time.monotonic() + 60
    while job.log().count("started") < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    pids = [int(p) for p in (job.run_dir / "pids").read_text().split()]
    assert len(pids) == 2 and all(_alive(p) for p in pids), job.log()
    servers = [p.cwd() for p in psutil.Process(job.proc.pid).children() if "forkserver" in " ".join(p.cmdline())]
    assert len(servers) == 1 and os.path.isdir(servers[0]), servers   # the ranks' fork server, in its socket folder
    os.kill(job.proc.pid, signal.SIGSTOP)
    job.cancel()
    assert job.state == "CANCELLED" and "runner killed" in job.reason, (job.state, job.reason)
    assert not any(_alive(p) for p in pids) and job.proc.poll() is not None
    assert live_processes(marker) == []
    assert not os.path.exists(servers[0]), f"the killed server's folder {servers[0]} is left behind"


@pytest.mark.slow   # a multi-process run: make test, not test-fast
def test_local_ranks_of_a_multi_rank_job_are_forked_from_one_server_and_recorded(local):
    # several ranks: a server imports torch and DDP's imports once and forks each rank; one rank starts fresh
    show = local / "show.py"
    show.write_text("import os, sys\nprint('warm', 'torch._dynamo' in sys.modules, os.getppid(), flush=True)\n")
    two = jobs.submit(JobSpec("two", str(show), ntasks_per_node=2)).wait(timeout=180, progress=False)
    one = jobs.submit(JobSpec("one", str(show), launcher="python")).wait(timeout=60, progress=False)
    assert two.state == one.state == "COMPLETED", two.summary() + one.summary()
    lines = [line.split()[-3:] for line in two.log().splitlines() if "warm " in line]   # warm, True, parent
    assert [has for _, has, _ in lines] == ["True", "True"], two.log()
    assert len({parent for *_, parent in lines}) == 1 and lines[0][2] != str(two.proc.pid)   # the server's children
    assert len((two.run_dir / "pids").read_text().split()) == 2
    assert "warm False" in one.log(), one.log()


@pytest.mark.slow
def test_a_local_job_of_two_ranks_on_one_gpu_runs_them_on_cpu_and_says_so(local, monkeypatch):
    """Notebook 03's job on a one-GPU machine (simulated: COURSE_LOCAL_GPUS=1): rank 1 would ask for cuda:1."""
    monkeypatch.setenv("COURSE_LOCAL_GPUS", "1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    show = local / "show.py"
    show.write_text("import os\nprint('visible', repr(os.environ.get('CUDA_VISIBLE_DEVICES')), flush=True)\n")
    job = jobs.submit(JobSpec("gpu1", str(show), ntasks_per_node=2)).wait(timeout=180, progress=False)
    assert job.state == "COMPLETED", job.summary()
    assert job.log().count("visible ''") == 2, job.log()
    assert "2 ranks but 1 GPU(s) here: GPUs hidden" in job.log(), job.log()


def test_local_time_limit_is_a_deadline(local):
    sleeper = local / "sleeper.py"
    sleeper.write_text("import time\ntime.sleep(300)\n")
    job = jobs.submit(JobSpec("slow", str(sleeper), time="0:03", launcher="python")).wait(timeout=90, progress=False)
    assert job.state == "TIMEOUT" and "time limit" in job.reason
    assert job.elapsed < 60


def test_local_gpu_request_is_refused_like_sbatch_would(local):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    with pytest.raises(SubmitError, match="asks for 1 GPU"):
        jobs.submit(JobSpec("gpu", SERIAL, gpus_per_node=1))


def test_run_folders_are_never_reused(local):
    runs = local / "runs"
    (runs / "x-local-1").mkdir(parents=True)
    (runs / "x-local-1" / "mine.txt").write_text("keep me")
    ok = local / "ok.py"
    ok.write_text("print('epoch=1 x=1')\n")
    job = jobs.submit(JobSpec("x", str(ok), launcher="python")).wait(timeout=60, progress=False)
    assert job.id == "local-2" and job.ok
    assert (runs / "x-local-1" / "mine.txt").read_text() == "keep me"


# The DDP solution on 2 ranks under both launchers runs in tests/test_jobs_notebooks.py (notebook 03).


def test_terminal_progress_shows_state_and_summary(local, capsys):
    bad = local / "bad.py"
    bad.write_text(textwrap.dedent("""\
        print("epoch=1 train_loss=1.0", flush=True)
        raise SystemExit(3)
    """))
    job = jobs.submit(JobSpec("bar", str(bad), args=["--epochs", "2"], launcher="python"))
    job.wait(timeout=60)
    out = capsys.readouterr()
    assert "FAILED" in out.err and "exit code 3" in out.err and "epoch=1 train_loss=1.0" in out.err
    assert job.epochs_done() == 1


# ------------------------------------------------------------------------------------------- more than one node
def test_a_job_of_its_own_master_addr_replaces_the_allocations(tmp_path):
    text = script_text(JobSpec("bad", DDP, nodes=2, env={"MASTER_ADDR": "localhost"}))
    assert "export MASTER_ADDR=localhost\n" in text and "scontrol show hostnames" not in text
    assert "export GLOO_SOCKET_IFNAME=eth1" in jobs.script(JobSpec("j", DDP, nodes=2), "local-2nodes", "slurm", "/r")
    bash_syntax_ok(text, tmp_path)


@pytest.mark.parametrize("nodelist, count", [("node[1-2]", 2), ("vm", 1), ("a,b[1,3-5]", 5), ("n[01-16]", 16)])
def test_node_lists_are_counted_without_scontrol(nodelist, count):
    from course_lib.jobs.diagnose import count_hosts

    assert count_hosts(nodelist) == count


def test_diagnose_names_a_loopback_rendezvous_on_more_than_one_node():
    from course_lib.jobs.diagnose import diagnose

    hung = "job 9 on node[1-2]: MASTER_ADDR=localhost MASTER_PORT=20009\n0: node1\n1: node2\n"
    (hint,) = diagnose(hung, state="TIMEOUT")
    assert hint.startswith("MASTER_ADDR=localhost on 2 nodes (node[1-2])") and "scontrol show hostnames" in hint
    assert diagnose(hung.replace("node[1-2]", "node1"), state="TIMEOUT") == []      # one node: loopback is fine
    assert diagnose(hung.replace("localhost", "node1"), state="COMPLETED") == []
    script = "srun torchrun --nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:29500 train.py"
    ok_header = hung.replace("localhost", "node1")
    assert "rendezvous is bound to 127.0.0.1" in diagnose(ok_header, script, "TIMEOUT")[0]
    via_master = "srun torchrun --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT x.py"
    assert "agent hosts a rendezvous of its own" in diagnose(hung, via_master, "TIMEOUT")[0]
    assert "--standalone" in diagnose(ok_header, "srun torchrun --standalone x.py", "TIMEOUT")[0]
    # nothing known, but stuck before the first epoch on two nodes: a hypothesis, called one
    assert "hypothesis" in diagnose(ok_header, "", "TIMEOUT")[0]
    assert diagnose(ok_header + "0: epoch=1 train_loss=1\n", "", "TIMEOUT") == []


def test_diagnose_from_the_shell(tmp_path):
    run = tmp_path / "ddp-9"
    run.mkdir()
    (run / "output.log").write_text("job 9 on n[1-2]: MASTER_ADDR=127.0.0.1 MASTER_PORT=1\n"
                                    "slurmstepd: error: *** JOB 9 ON n1 CANCELLED AT x DUE TO TIME LIMIT ***\n")
    r = subprocess.run([PYTHON, "-m", "course_lib.cli", "diagnose", str(run)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stdout.startswith("hint: MASTER_ADDR=127.0.0.1 on 2 nodes"), r.stdout + r.stderr


def test_ranks_by_node_reads_the_hostname_step():
    from course_lib.jobs.multinode import ranks_by_node

    class FakeJob:   # only the log and the spec are read
        def __init__(self, spec, log):
            self.spec, self.log = spec, lambda: log

    log = "job 3 on node[1-2]: MASTER_ADDR=node1 MASTER_PORT=1\n1: node2\n0: node1\n0: [default1]:x\n"
    tr = JobSpec("t", "x.py", nodes=2, ntasks_per_node=2, launcher="torchrun")
    assert ranks_by_node(FakeJob(tr, log)) == {"node1": [0, 1], "node2": [2, 3]}
    srun = JobSpec("s", "x.py", nodes=1, ntasks_per_node=2)
    assert ranks_by_node(FakeJob(srun, log)) == {"node1": [0], "node2": [1]}


def test_two_node_job_says_why_not_without_slurm(monkeypatch, capsys):
    from course_lib.jobs.multinode import two_node_job

    monkeypatch.setenv("COURSE_ENGINE", "local")
    assert two_node_job(DDP) is None
    assert "no Slurm here" in capsys.readouterr().out


def test_start_sh_refuses_a_bad_node_count_before_doing_anything(tmp_path):
    r = subprocess.run(["bash", str(ROOT / "scripts" / "local-slurm" / "start.sh"), "--nodes", "9",
                        str(tmp_path / "sl")], capture_output=True, text=True)
    assert r.returncode == 1 and "--nodes must be a number from 1 to 8, not '9'" in r.stderr
    assert not (tmp_path / "sl").exists()
