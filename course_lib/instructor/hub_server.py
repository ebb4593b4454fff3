"""The settings of every learner's server started from a shared install (``make shared-install``): ``python -m
course_lib.instructor.hub_server VENV`` sets them in ``VENV/etc/jupyter/jupyter_server_config.json``, keeping the
others there (docs/jupyterhub.md). Not a ``jupyter_server_config.d/`` file: jupyter_server reads those for
``jpserver_extensions`` only (checked: the kernel settings were ignored there). The course kernel only, and the
default (the notebooks name ``python3``, which JupyterLab then maps to the one installed kernel of that language);
``course_lib.instructor.activity`` on; the terminals' shell of ``make lab`` (its bashrc puts the environment's
``bin`` first on PATH, which a login shell's /etc/profile drops). ``server_choices``: the spawn form of
scripts/hub/jupyterhub_slurm_config.py.
"""
import sys
from pathlib import Path

from course_lib.instructor.hub import merge_settings, server_config, write_lab_dir

KERNEL = "multigpu-course"


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
    big = min(8, site.cpus_per_node)
    if big > small:
        out.append(choice(f"cpu-{big}", f"CPU, {big} cores", cpu_part, big))
    gpus = site.gpus_per_node
    if gpus:
        out.append(choice("gpu-1", "1 GPU", gpu_part, max(1, site.cpus_per_node // gpus), 1))
    if gpus > 1:
        out.append(choice(f"gpu-{gpus}", f"{gpus} GPUs", gpu_part, site.cpus_per_node, gpus))
    return out


def write(venv: str | Path) -> Path:
    venv = Path(venv)
    lab_dir = venv.parent / "lab"     # the terminals of ``make lab``: its bashrc, in PREFIX/lab beside PREFIX/venv
    write_lab_dir(lab_dir, venv)
    server = {"jpserver_extensions": {"course_lib.instructor.activity": True},
              "terminado_settings": server_config(lab_dir)["ServerApp"].get("terminado_settings", {})}
    new = {"ServerApp": server, "KernelSpecManager": {"allowed_kernelspecs": [KERNEL]},
           "MappingKernelManager": {"default_kernel_name": KERNEL}}
    path = venv / "etc" / "jupyter" / "jupyter_server_config.json"
    merge_settings(path, new)
    return path


if __name__ == "__main__":
    print(f"hub server settings: wrote {write(sys.argv[1] if len(sys.argv) > 1 else sys.prefix)}")
