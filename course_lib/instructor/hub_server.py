"""The settings of every learner's server started from a shared install (``make shared-install``).

``python -m course_lib.instructor.hub_server VENV`` sets, in ``VENV/etc/jupyter/jupyter_server_config.json``
(other settings there are kept), what every Jupyter server run from that environment reads (the hub's servers, on
the login node or as Slurm jobs, and a centre's own hub that starts its servers from this environment). Not a
``jupyter_server_config.d/`` file: jupyter_server reads those for ``jpserver_extensions`` only (checked: the
kernel settings below were ignored there).
- the course kernel only: ``KernelSpecManager.allowed_kernelspecs = ["multigpu-course"]`` and it is the default.
  The notebooks name ``python3`` in their metadata (what a clone's ``make lab`` and the CI's papermill use); with
  that kernel hidden, JupyterLab opens a notebook whose kernel is missing on the one installed kernel of the same
  language, the course's, instead of asking, and a new notebook starts on it too;
- ``course_lib.instructor.activity`` on: a busy kernel, a live job or a course command counts as the server's
  activity, so that a hub's idle culler leaves it running.

- the terminals' shell: ``bash --rcfile PREFIX/lab/bashrc -i``, the start-up file that ``make lab`` gives its
  terminals (``course write lab-settings --lab-dir``, course_lib/instructor/hub.py): the login profiles, then the
  environment's ``bin`` first on PATH, so ``course`` is found in a JupyterLab terminal (a login shell's
  /etc/profile sets PATH afresh and drops it).

``server_choices(site, time)``: what a learner may ask for when their server is a Slurm job (the spawn form of
scripts/hub/jupyterhub_slurm_config.py), from the site profile's node shape.
"""
from __future__ import annotations

import sys
from pathlib import Path

from course_lib.instructor.hub import merge_settings, server_config, write_lab_dir

KERNEL = "multigpu-course"


def settings(terminal: dict | None = None) -> dict:
    server = {"jpserver_extensions": {"course_lib.instructor.activity": True}}
    return {"ServerApp": {**server, **(terminal or {})}, "KernelSpecManager": {"allowed_kernelspecs": [KERNEL]},
            "MappingKernelManager": {"default_kernel_name": KERNEL}}


def terminal(venv: Path) -> dict:
    """The terminals' settings of ``make lab``, for an install: its bashrc written into ``PREFIX/lab`` (beside
    ``PREFIX/venv``) by the same function."""
    lab_dir = venv.parent / "lab"
    write_lab_dir(lab_dir, venv)
    return {"terminado_settings": server_config(lab_dir)["ServerApp"].get("terminado_settings", {})}


def server_choices(site, time: str, partition: str = "") -> list[dict]:
    """The servers a learner may pick, first the default: CPU servers of 2 cores and of up to 8 (on the site's
    ``check_partition``, its partition for CPU work, else ``partition``), and where nodes have GPUs, 1 GPU with
    its share of the cores and a whole node's GPUs with all of them (on ``partition``). ``partition`` replaces
    both; ``time`` is every choice's time limit. Each: key, label, and batchspawner's request (partition,
    nprocs, ngpus, runtime)."""
    cpu_part, gpu_part = partition or site.check_partition or site.partition, partition or site.partition

    def choice(key, label, part, cpus, gpus=0):
        where = f"partition {part}" if part else "the default partition"
        return {"key": key, "label": f"{label} ({where}, up to {time})", "partition": part,
                "nprocs": str(cpus), "ngpus": str(gpus) if gpus else "", "runtime": time}

    small = min(2, site.cpus_per_node)
    out = [choice(f"cpu-{small}", f"CPU, {small} core{'s' * (small > 1)}", cpu_part, small)]
    if min(8, site.cpus_per_node) > small:
        big = min(8, site.cpus_per_node)
        out.append(choice(f"cpu-{big}", f"CPU, {big} cores", cpu_part, big))
    gpus = site.gpus_per_node
    if gpus:
        out.append(choice("gpu-1", "1 GPU", gpu_part, max(1, site.cpus_per_node // gpus), 1))
    if gpus > 1:
        out.append(choice(f"gpu-{gpus}", f"{gpus} GPUs", gpu_part, site.cpus_per_node, gpus))
    return out


def write(venv: str | Path) -> Path:
    path = Path(venv) / "etc" / "jupyter" / "jupyter_server_config.json"

    new = settings(terminal(Path(venv)))

    def update(data: dict) -> None:
        for section, values in new.items():
            for key, value in values.items():
                old = data.setdefault(section, {}).get(key)
                data[section][key] = {**old, **value} if isinstance(old, dict) and isinstance(value, dict) else value

    merge_settings(path, update)
    return path


if __name__ == "__main__":
    print(f"hub server settings: wrote {write(sys.argv[1] if len(sys.argv) > 1 else sys.prefix)}")
