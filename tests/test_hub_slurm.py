"""A learner's server as a Slurm job: the hub of scripts/hub/jupyterhub_slurm_config.py (batchspawner's SlurmSpawner)
against the session's local Slurm. Through the hub's REST API: start the learner's server, see it run as the
learner's own job (squeue's user column, with the partition and time limit the hub was given) under slurmstepd,
reach it through the hub's proxy with the learner's token (it serves the learner's workspace with the course
kernel), submit a course job from the server's environment as a kernel would (its srun rank sees the job script's
and the kernel's variables), stop the server, and see the job and every process of the learner gone.
Skips, saying why, where the machine cannot host a hub (tests/hub_support.py) or a local Slurm.
"""
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


def _clean_up(cluster, name: str, uid: int) -> None:
    """Whatever a failed test left: the learner's jobs cancelled, their processes ended."""
    subprocess.run(["scancel", "-u", name], capture_output=True, timeout=60,
                   env=dict(os.environ, SLURM_CONF=str(cluster.conf)))
    procs = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)


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
        try:
            hub.api("POST", f"/users/{name}/server")
        except urllib.error.HTTPError as e:
            pytest.fail(f"the hub could not start {name}'s server ({e}):\n{hub.log_tail(60)}")
        hs.wait_for_server(hub, name, want_ready=True)
        ready_s = time.monotonic() - t0

        # the learner's own job, running
        jobs = _squeue(slurm_cluster, "-u", name, "-o", "%i,%u,%j,%T,%P,%l")
        assert len(jobs) == 1, jobs
        job_id, *rest = jobs[0].split(",")
        assert rest == [name, "jupyterhub", "RUNNING", "debug", "1:30:00"], jobs
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
        _clean_up(slurm_cluster, name, user.pw_uid)
