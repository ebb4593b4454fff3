# The hub of jupyterhub_config.py, but each learner's server is a Slurm job of that learner (batchspawner's
# SlurmSpawner), as HPC centres run their hubs: the hub submits a batch script with `sbatch` as the learner, the
# job makes the learner's workspace if it is not there yet and runs JupyterLab in it on a compute node, and the
# hub proxies to it there. Stopping the server cancels the job (`scancel`).
#
#   COURSE_PREFIX=/opt/multigpu-course SLURM_CONF=... jupyterhub -f scripts/hub/jupyterhub_slurm_config.py
#
# Everything of jupyterhub_config.py applies (the same environment variables); in addition, all optional:
#   COURSE_SITE              the site profile (course_lib/jobs/sites): its partition, account, reservation and qos
#                            go into the server's batch script
#   COURSE_HUB_SLURM_TIME    the server job's time limit (default 8:00:00, a workshop day)
#   COURSE_HUB_SLURM_CPUS    --cpus-per-task of the server job (default: the partition's default)
#   COURSE_HUB_SLURM_PARTITION  a partition for the servers other than the site profile's (e.g. an interactive one)
#   COURSE_HUB_API_IP        where the hub's API listens (default 127.0.0.1: only right when jobs run on this machine)
#   COURSE_HUB_CONNECT_IP    the address of the hub's API that compute nodes use (c.JupyterHub.hub_connect_ip)
#   COURSE_HUB_START_TIMEOUT seconds from sbatch to a server that answers (default 300: a queue, a loaded node)
import os
import shutil
from pathlib import Path

import batchspawner  # noqa: F401 - registers the hub's /hub/api/batchspawner handler; fails here if missing

c = get_config()  # noqa: F821 - JupyterHub provides it
load_subconfig(str(Path(__file__).with_name("jupyterhub_config.py")))  # noqa: F821 - JupyterHub provides it

from course_lib.jobs.site import load_site  # noqa: E402 - the shared install's course, on the hub's path

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
c.SlurmSpawner.req_runtime = os.environ.get("COURSE_HUB_SLURM_TIME", "8:00:00")
c.SlurmSpawner.req_nprocs = os.environ.get("COURSE_HUB_SLURM_CPUS", "")
c.Spawner.start_timeout = int(os.environ.get("COURSE_HUB_START_TIMEOUT", "300"))
c.Spawner.http_timeout = 300

_options = dict(site.sbatch_options())     # partition, account, reservation, qos: those the profile sets
if os.environ.get("COURSE_HUB_SLURM_PARTITION"):
    _options["partition"] = os.environ["COURSE_HUB_SLURM_PARTITION"]
_site_lines = "".join(f"#SBATCH --{key}={value}\n" for key, value in _options.items())
# batchspawner fills the {{...}} (jinja2); {{cmd}} is batchspawner-singleuser + jupyterhub-singleuser + its options
c.SlurmSpawner.batch_script = f"""#!/bin/bash
#SBATCH --job-name=jupyterhub
#SBATCH --output={{{{homedir}}}}/.jupyterhub-slurm-%j.log
#SBATCH --chdir={{{{homedir}}}}
#SBATCH --export={{{{keepvars}}}}
#SBATCH --time={{{{runtime}}}}
{{% if nprocs %}}#SBATCH --cpus-per-task={{{{nprocs}}}}
{{% endif %}}{_site_lines}
set -eu
# --export above leaves SLURM_EXPORT_ENV (the hub's list) in the job's environment, and srun reads that
# variable as its own --export: left here, it would reach the learner's kernels, their jobs, and those jobs'
# srun, whose ranks would then get only the hub's variables (no MASTER_ADDR/MASTER_PORT of the job script)
unset SLURM_EXPORT_ENV
# the first start makes the learner's workspace, as in jupyterhub_config.py
"{bin_dir}/course" workspace init --exist-ok "$HOME/course" >/dev/null
exec {{{{cmd}}}}
"""
