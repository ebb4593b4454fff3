"""A learner's server as a Slurm job: the hub of scripts/hub/jupyterhub_slurm_config.py (batchspawner's SlurmSpawner)
against the session's local Slurm. Through the hub's REST API: start the learner's server, see it run as the
learner's own job (squeue's user column, with the partition and time limit the hub was given) under slurmstepd,
reach it through the hub's proxy with the learner's token (it serves the learner's workspace with the course
kernel), submit a course job from the server's environment as a kernel would (its srun rank sees the job script's
and the kernel's variables), stop the server, and see the job and every process of the learner gone.
Skips, saying why, where the machine cannot host a hub (tests/hub_support.py) or a local Slurm.
"""
import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import hub_support as hs
import psutil
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
SINGLEUSER = hs.HUB_PREFIX / "venv/bin/batchspawner-singleuser"
RUNUSER = shutil.which("runuser", path="/usr/sbin:/sbin:/usr/bin:/bin") or "runuser"
START_TIMEOUT = 300   # the hub's deadline from sbatch to a server that answers (a loaded 2-core machine)

_reason = hs.why_not() or (None if SINGLEUSER.exists() else f"no {SINGLEUSER}: run `make hub-test-install` (as root)")
if _reason:
    pytest.skip(f"no real hub here: {_reason}", allow_module_level=True)


def _squeue(cluster, *args: str) -> list[str]:
    r = subprocess.run(["squeue", "-h", *args], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, SLURM_CONF=str(cluster.conf)))
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def _learner_processes(uid: int) -> list[str]:
    found = []
    for p in psutil.process_iter(["uids", "cmdline", "status"]):
        if p.info["uids"] and uid in (p.info["uids"].real, p.info["uids"].effective) \
                and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:160]}")
    return found


def _like_a_kernel(name: str, environ: dict, code: str) -> subprocess.CompletedProcess:
    """``code`` run by the shared install's Python as ``name`` in their workspace's notebooks/, with ``environ``
    (the server's) and HUB_PROBE=set-in-the-kernel, as a kernel of that server runs."""
    env = dict(environ, HUB_PROBE="set-in-the-kernel")
    return subprocess.run([RUNUSER, "-u", name, "--", str(hs.HUB_PREFIX / "venv/bin/python"), "-"], input=code,
                          env=env, cwd=Path(environ["HOME"]) / "course" / "notebooks", capture_output=True,
                          text=True, timeout=600)


@pytest.mark.timeout(900)
def test_hub_server_runs_as_the_learners_slurm_job(slurm_cluster, tmp_path):
    name = hs.SLURM_HUB_LEARNER
    user = hs.fresh_learner(name)
    slurm_cluster.dir.chmod(0o755)   # the learner's sbatch reads slurm.conf (the munge key stays 0600)
    hub = hs.Hub(tmp_path, config="jupyterhub_slurm_config.py")
    try:
        hub.start({"SLURM_CONF": str(slurm_cluster.conf), "COURSE_SITE": "local", "COURSE_ENGINE": "slurm",
                   "COURSE_QUICK": "1", "COURSE_HUB_START_TIMEOUT": str(START_TIMEOUT),
                   "COURSE_HUB_SLURM_TIME": "1:30:00", "COURSE_HUB_SLURM_PARTITION": "debug"})
        hub.add_user(name)
        t0 = time.monotonic()
        # the REST API's body is the spawn form's answer: "CPU, 2 cores" (the node has 4: its other choice,
        # cpu-4, would leave no core for the learner's own job below)
        try:
            hub.api("POST", f"/users/{name}/server", {"server": "cpu-2"})
        except urllib.error.HTTPError as e:
            pytest.fail(f"the hub could not start {name}'s server ({e}):\n{hub.log_tail(60)}")
        hs.wait_for_server(hub, name, want_ready=True)
        ready_s = time.monotonic() - t0

        # the learner's own job, running
        jobs = _squeue(slurm_cluster, "-u", name, "-o", "%i,%u,%j,%T,%P,%l,%C")
        assert len(jobs) == 1, jobs
        job_id, *rest = jobs[0].split(",")
        assert rest == [name, "jupyterhub", "RUNNING", "debug", "1:30:00", "2"], jobs
        # the server is a process of the learner under the job's slurmstepd, not a child of the hub
        servers = [p for p in psutil.process_iter(["uids", "cmdline"]) if p.info["uids"]
                   and p.info["uids"].real == user.pw_uid and "jupyterhub-singleuser" in " ".join(p.info["cmdline"])]
        assert len(servers) == 1, [p.info["cmdline"] for p in servers]
        ancestors = [p.name() for p in servers[0].parents()]
        assert "slurmstepd" in ancestors and hub.proc.pid not in [p.pid for p in servers[0].parents()], ancestors

        # through the hub's proxy, with the learner's own token: their workspace, the course kernel
        token = hs.user_token(hub, name)
        assert "started" in hs.server_api(hub, name, "status", token)
        top = {item["name"] for item in hs.server_api(hub, name, "contents", token)["content"]}
        assert {"notebooks", "exercises", "jobs"} <= top, top
        marker = Path(user.pw_dir) / "course" / ".course-workspace.json"   # made by the job, as the learner
        assert marker.stat().st_uid == user.pw_uid, f"{marker} is not {name}'s"
        assert "multigpu-course" in hs.server_api(hub, name, "kernelspecs", token)["kernelspecs"]

        # what a kernel of this server does (its environment, as the learner): submit a course job from inside
        # the server's job; the new job is the learner's and sees what the kernel set
        r = _like_a_kernel(name, servers[0].environ(), """
from pathlib import Path
from course_lib import jobs
script = Path("../hubprobe.py").resolve()
script.write_text("import getpass, os\\nprint('rank of', getpass.getuser(), 'sees', os.environ.get('HUB_PROBE'), "
                  "'and MASTER_PORT', os.environ.get('MASTER_PORT'))\\n")
job = jobs.submit(jobs.JobSpec("hubprobe", str(script), launcher="srun")).wait(timeout=300, progress=False)
print("STATE", job.state, job.id)
print(job.log())
""")
        assert r.returncode == 0, r.stderr[-2000:]
        # (srun's ranks: the job's own exports and the kernel's environment reach them)
        assert "STATE COMPLETED" in r.stdout, r.stdout[-2000:]
        assert re.search(rf"rank of {name} sees set-in-the-kernel and MASTER_PORT \d+", r.stdout), r.stdout[-2000:]
        assert r.stdout.split("STATE COMPLETED ")[1].split()[0] != job_id

        # stop: the job leaves the queue (scancel) and nothing of the learner runs on
        t1 = time.monotonic()
        hub.api("DELETE", f"/users/{name}/server")
        hs.wait_for_server(hub, name, want_ready=False)
        assert _squeue(slurm_cluster, "-j", job_id, "-o", "%T") == [], "the job is still queued or running"
        final = _squeue(slurm_cluster, "-t", "all", "-j", job_id, "-o", "%T")
        assert final and final[0] in ("CANCELLED", "COMPLETED"), final
        left = _learner_processes(user.pw_uid)
        for _ in range(60):      # slurmd ends the job's processes just after scancel returns
            if not left:
                break
            time.sleep(1)
            left = _learner_processes(user.pw_uid)
        assert not left, left
        print(f"\n[hub-slurm] job {job_id} as {name}: spawn to ready {ready_s:.1f} s, "
              f"stop {time.monotonic() - t1:.1f} s, final state {final[0]}")
    finally:
        hub.stop()
        hs.clean_up_learner(slurm_cluster, name, user.pw_uid)


def test_spawn_form_offers_the_sites_cpu_and_gpu_servers(tmp_path):
    """The spawn form of a GPU site's hub (example-gpu-cluster: 4 GPUs, 64 cores per node): two CPU and two GPU
    choices; the batch script batchspawner renders for each carries its partition, cores and GPUs; a choice the
    hub does not offer is refused with the list. No Slurm needed: the config loaded as ``jupyterhub -f`` does."""
    code = """
import json, types
from batchspawner.batchspawner import format_template
out = {"form": cfg.SlurmSpawner.options_form, "scripts": {}}
for key in ("cpu-2", "cpu-8", "gpu-1", "gpu-4", "gpu-9"):
    s = types.SimpleNamespace(user_options={"server": key})
    try:
        cfg.Spawner.pre_spawn_hook(s)
    except ValueError as e:
        out["scripts"][key] = f"refused: {e}"
        continue
    out["scripts"][key] = format_template(cfg.SlurmSpawner.batch_script, homedir="/h", keepvars="PATH", cmd="srv",
                                          partition=s.req_partition, nprocs=s.req_nprocs, ngpus=s.req_ngpus,
                                          runtime=s.req_runtime)
print(json.dumps(out))
"""
    env = hs.Hub(tmp_path).env({"COURSE_SITE": "example-gpu-cluster", "COURSE_HUB_SLURM_TIME": "2:00:00"})
    out = json.loads(hs.with_config(env, code, "jupyterhub_slurm_config.py"))
    labels = re.findall(r"<option value='([\w-]+)'[^>]*>([^<]+)</option>", out["form"])
    assert labels == [("cpu-2", "CPU, 2 cores (partition gpu, up to 2:00:00)"),
                      ("cpu-8", "CPU, 8 cores (partition gpu, up to 2:00:00)"),
                      ("gpu-1", "1 GPU (partition gpu, up to 2:00:00)"),
                      ("gpu-4", "4 GPUs (partition gpu, up to 2:00:00)")], out["form"]
    lines = {key: [ln for ln in text.splitlines() if ln.startswith("#SBATCH")] for key, text in out["scripts"].items()
             if not text.startswith("refused")}
    site = ["#SBATCH --account=my-project", "#SBATCH --reservation=workshop"]
    head = ["#SBATCH --job-name=jupyterhub", "#SBATCH --output=/h/.jupyterhub-slurm-%j.log", "#SBATCH --chdir=/h",
            "#SBATCH --export=PATH", "#SBATCH --time=2:00:00", "#SBATCH --partition=gpu"]
    assert lines["cpu-2"] == [*head, "#SBATCH --cpus-per-task=2", *site], lines["cpu-2"]
    assert lines["gpu-1"] == [*head, "#SBATCH --cpus-per-task=16", "#SBATCH --gpus-per-node=1", *site], lines
    assert lines["gpu-4"] == [*head, "#SBATCH --cpus-per-task=64", "#SBATCH --gpus-per-node=4", *site], lines
    assert out["scripts"]["gpu-9"] == "refused: no server 'gpu-9' on this hub; the choices are cpu-2, cpu-8, " \
                                      "gpu-1, gpu-4", out["scripts"]["gpu-9"]
