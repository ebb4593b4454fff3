"""The environment of a rank started on this machine: what srun (plus the course's job script) gives a task, and
what every local launch sets (unbuffered output, gloo over loopback, one OpenMP thread)."""
import os
import sys


def srun_env(rank: int, nprocs: int, port: int, base: dict) -> dict:
    """The environment srun (plus the course's job script) gives task ``rank`` of a one-node job, over ``base``."""
    env = dict(base)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        env.pop(name, None)  # a torchrun-style variable left over would contradict the SLURM_* ones
    env.update({
        "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NTASKS": str(nprocs),
        "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "localhost",
        "SLURM_JOB_ID": env.get("SLURM_JOB_ID", "local"),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    })
    return env


def base_env(extra: dict | None) -> dict:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")   # local processes talk over loopback
    # torch sets 1 under torchrun; do the same for srun-style so both styles compare fairly
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env
