# The hub of jupyterhub_config.py, but each learner's server is a Slurm job of that learner (batchspawner's
# SlurmSpawner), as HPC centres run their hubs: the hub submits a batch script with `sbatch` as the learner, the
# job makes the learner's workspace if it is not there yet and runs JupyterLab in it on a compute node, and the
# hub proxies to it there. Stopping the server cancels the job (`scancel`).
#
#   COURSE_PREFIX=/opt/multigpu-course SLURM_CONF=... jupyterhub -f scripts/hub/jupyterhub_slurm_config.py
#
# Everything of jupyterhub_config.py applies (the same environment variables); in addition, all optional:
#   COURSE_SITE              the site profile (course_lib/jobs/sites): its account, reservation and qos go into
#                            the server's batch script, its node shape and partitions make the spawn form's choices
#   COURSE_HUB_SLURM_TIME    the server job's time limit (default 8:00:00, a workshop day)
#   COURSE_HUB_SLURM_PARTITION  a partition for every server choice instead of the profile's (an interactive one)
#   COURSE_HUB_API_IP        where the hub's API listens (default 127.0.0.1: only right when jobs run on this machine)
#   COURSE_HUB_CONNECT_IP    the address of the hub's API that compute nodes use (c.JupyterHub.hub_connect_ip)
#   COURSE_HUB_START_TIMEOUT seconds from sbatch to a server that answers (default 300: a queue, a loaded node)
import os
import shutil
from pathlib import Path

import batchspawner  # noqa: F401 - registers the hub's /hub/api/batchspawner handler; fails here if missing

c = get_config()  # noqa: F821 - JupyterHub provides it
load_subconfig(str(Path(__file__).with_name("jupyterhub_config.py")))  # noqa: F821 - JupyterHub provides it

from course_lib.core.site import load_site  # noqa: E402
from course_lib.instructor.hub_server import server_choices  # noqa: E402 - the shared install's course

prefix = Path(os.environ.get("COURSE_PREFIX", "/opt/multigpu-course"))
bin_dir = prefix / "venv" / "bin"
site = load_site()     # COURSE_SITE, else the generic profile; a wrong name stops the hub with the profile's message

# compute nodes must reach the hub's API: the server tells the hub its port there, and checks logins with it
c.JupyterHub.hub_ip = os.environ.get("COURSE_HUB_API_IP", "127.0.0.1")
if os.environ.get("COURSE_HUB_CONNECT_IP"):
    c.JupyterHub.hub_connect_ip = os.environ["COURSE_HUB_CONNECT_IP"]

c.JupyterHub.spawner_class = "batchspawner.SlurmSpawner"
# sbatch, squeue and scancel run as the learner, so the job is the learner's own. batchspawner's default is
# `sudo -E -u {username}`; the hub runs as root here, and runuser (util-linux) needs no sudoers rule. It keeps
# the environment (SLURM_CONF, the hub's variables for the job). `cd` first: the hub's own folder may be closed
# to the learner, and sbatch records the folder it was called from.
# (runuser is in sbin, which the servers' PATH leaves out)
_runuser = shutil.which("runuser", path="/usr/sbin:/sbin:/usr/bin:/bin") or "runuser"
c.SlurmSpawner.exec_prefix = f"cd {{homedir}} && {_runuser} -u {{username}} --"
c.SlurmSpawner.batchspawner_singleuser_cmd = str(bin_dir / "batchspawner-singleuser")
c.Spawner.cmd = [str(bin_dir / "jupyterhub-singleuser")]
c.SlurmSpawner.req_srun = ""            # the server is the batch step itself: its kernels are not task 0 of a step
c.Spawner.start_timeout = int(os.environ.get("COURSE_HUB_START_TIMEOUT", "300"))
c.Spawner.http_timeout = 300

# -- the spawn form: the learner picks a server (CPU or GPU) from choices made from the site profile
choices = server_choices(site, os.environ.get("COURSE_HUB_SLURM_TIME", "8:00:00"),
                         os.environ.get("COURSE_HUB_SLURM_PARTITION", ""))
c.SlurmSpawner.options_form = "<label for='course-server'>Your server</label>\n" \
    "<select name='server' id='course-server' class='form-control'>\n" + "".join(
        f"<option value='{ch['key']}'{' selected' * (i == 0)}>{ch['label']}</option>\n"
        for i, ch in enumerate(choices)) + "</select>\n"


def _options_from_form(formdata: dict) -> dict:
    return {"server": formdata.get("server", [choices[0]["key"]])[0]}


def _request_the_choice(spawner) -> None:
    """Before each start (form or REST API, whose body is the user_options): the chosen server's partition,
    cores, GPUs and time limit become batchspawner's request; no choice is the first one."""
    key = (spawner.user_options or {}).get("server", choices[0]["key"])
    chosen = next((ch for ch in choices if ch["key"] == key), None)
    if chosen is None:
        raise ValueError(f"no server {key!r} on this hub; the choices are {', '.join(ch['key'] for ch in choices)}")
    spawner.req_partition, spawner.req_nprocs = chosen["partition"], chosen["nprocs"]
    spawner.req_ngpus, spawner.req_runtime = chosen["ngpus"], chosen["runtime"]


c.SlurmSpawner.options_from_form = _options_from_form
c.Spawner.pre_spawn_hook = _request_the_choice

# the site's account, reservation and qos (the partition comes with the choice)
_site_lines = "".join(f"#SBATCH --{key}={value}\n" for key, value in dict(site.sbatch_options()).items()
                      if key != "partition")
_gpu_line = "--gres=gpu:{{ngpus}}" if site.gpu_request == "gres" else "--gpus-per-node={{ngpus}}"
# batchspawner fills the {{...}} (jinja2); {{cmd}} is batchspawner-singleuser + jupyterhub-singleuser + its options
c.SlurmSpawner.batch_script = f"""#!/bin/bash
#SBATCH --job-name=jupyterhub
#SBATCH --output={{{{homedir}}}}/.jupyterhub-slurm-%j.log
#SBATCH --chdir={{{{homedir}}}}
#SBATCH --export={{{{keepvars}}}}
#SBATCH --time={{{{runtime}}}}
{{% if partition %}}#SBATCH --partition={{{{partition}}}}
{{% endif %}}{{% if nprocs %}}#SBATCH --cpus-per-task={{{{nprocs}}}}
{{% endif %}}{{% if ngpus %}}#SBATCH {_gpu_line}
{{% endif %}}{_site_lines}
set -eu
# --export above leaves SLURM_EXPORT_ENV (the hub's list) in the job's environment, and srun reads that
# variable as its own --export: left here, it would reach the learner's kernels, their jobs, and those jobs'
# srun, whose ranks would then get only the hub's variables (no MASTER_ADDR/MASTER_PORT of the job script)
unset SLURM_EXPORT_ENV
# the first start makes the learner's workspace, as in jupyterhub_config.py
"{bin_dir}/course" init --exist-ok "$HOME/course" >/dev/null
# ... and works in it: a terminal opened without a folder starts there
cd "$HOME/course"
exec {{{{cmd}}}}
"""
