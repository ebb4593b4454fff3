"""The workshop's shell-ready job scripts (jobs/*.sbatch), rendered from the same template as notebook jobs.

With the ``generic`` profile (what jobs/ holds) they ask for CPUs only and run on any Slurm; rendered
for a GPU site (``COURSE_SITE=mysite course write jobs --out DIR``) they ask for one rank per GPU. A shared install
(``make shared-install SITE=...``) renders them for its learners' workspaces (``install``): the install's python and
course_lib, the serial script from the install (a workspace holds no solutions/), the exercise from the workspace.
"""
import shlex
from pathlib import Path

from course_lib import registry
from course_lib.core.site import Site
from course_lib.core.spec import JobSpec, render

SERIAL = f"solutions/{registry.SERIAL}"
DDP = f"exercises/{registry.get('ddp').file}"
ARGS = ["--dataset", "auto", "--epochs", "3"]

# file name -> (one-line title, how the job differs from the others)
SCRIPTS = {
    "serial.sbatch": ("serial baseline, one process", dict(launcher="python", script=SERIAL)),
    "ddp_srun.sbatch": ("DDP on one node, one srun task per rank", dict(launcher="srun", script=DDP)),
    "ddp_torchrun.sbatch": ("DDP on one node, torchrun starts the ranks", dict(launcher="torchrun", script=DDP)),
    "ddp_torchrun_2nodes.sbatch": ("DDP on two nodes, one torchrun per node",
                                   dict(launcher="torchrun", script=DDP, nodes=2)),
}


def specs(site: Site) -> dict[str, JobSpec]:
    """The workshop's jobs on ``site``: one rank per GPU where it has GPUs, else 2 CPU ranks per node."""
    ranks = site.gpus_per_node or 2
    cpus = max(1, site.cpus_per_node // ranks)
    out = {}
    for filename, (_, how) in SCRIPTS.items():
        serial = how["launcher"] == "python"
        out[filename] = JobSpec(
            name=filename.split(".")[0].replace("_", "-"), args=ARGS, time=site.time or "00:30:00",
            ntasks_per_node=1 if serial else ranks, cpus_per_task=cpus,
            gpus_per_node=(1 if serial else ranks) if site.gpus_per_node else 0,
            monitor=not serial, **how)
    return out


def render_all(site: Site, install: Path | None = None) -> dict[str, str]:
    """file name -> script text, as ``course write jobs`` writes them; ``install``: a shared install's PREFIX."""
    python, pythonpath, serial = site.python or "python", '"$SLURM_SUBMIT_DIR"', SERIAL
    if install:
        python = site.python or shlex.quote(str(install / "venv" / "bin" / "python"))
        pythonpath, serial = shlex.quote(str(install / "course")), str(install / "course" / SERIAL)
    where = "your workspace" if install else "the course's folder"
    texts = {}
    for filename, spec in specs(site).items():
        title = SCRIPTS[filename][0]
        header = [
            f"Workshop job: {title}.",
            f"Submit from {where}:  sbatch jobs/{filename}",
            f"Output: {spec.name}-<job id>.out there. Partition, account: sbatch -p P -A A jobs/{filename}",
            "(or set SBATCH_PARTITION / SBATCH_ACCOUNT)"
            + ("." if install else "; activate the course's environment first."),
        ]
        if spec.script == DDP:
            header.append("Your exercise by default; the reference: "
                          f"SCRIPT=solutions/{registry.get('ddp').file} sbatch jobs/{filename}")
        header.append("Written by `course write jobs` from course_lib/jobs/templates/sbatch.sh.j2 "
                      f"(site '{site.name}'): change the template, not this file.")
        header.insert(4, "Arguments after the script name go to the training script: "
                         f"sbatch jobs/{filename} --epochs 1")
        spec_for_shell = JobSpec(**{**spec.to_dict(), "script": "SCRIPT_PLACEHOLDER",
                                    "args": [*spec.args, "ARGS_PLACEHOLDER"]})
        text = render(spec_for_shell, site, python=python, torchrun=f"{python} -m torch.distributed.run" if install
                      else "torchrun", pythonpath=pythonpath, output="%x-%j.out", header=header)
        script = f'"${{SCRIPT:-{spec.script}}}"' if spec.script == DDP else shlex.quote(serial)
        texts[filename] = text.replace("SCRIPT_PLACEHOLDER", script).replace("ARGS_PLACEHOLDER", '"$@"')
    return texts
