"""The environments a rank meets on a cluster, for the checkpoint checker's steps: a writer or an RNG state picked by
an environment variable goes wrong in one of them, while dist.get_rank() is right in all."""
import contextlib
import os


def two_nodes(rank: int, world: int) -> dict:
    """Rank ``rank`` of ``world`` nodes with one rank each, as torchrun and srun set it: the local rank is 0 on every
    node, so a writer or an RNG state chosen by the local rank is rank 0's on every node."""
    return {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank), "SLURM_LOCALID": "0",
            "SLURM_NODEID": str(rank), "SLURM_NNODES": str(world), "SLURM_JOB_NUM_NODES": str(world),
            "SLURM_NTASKS_PER_NODE": "1"}


def one_node(rank: int, world: int) -> dict:
    """``world`` ranks on one node (srun or torchrun): the local rank is the rank."""
    return {"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world), "GROUP_RANK": "0", "SLURM_LOCALID": str(rank),
            "SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1"}


def torchrun_in_batch(rank: int, world: int) -> dict:
    """torchrun started by an sbatch script (requeue.sbatch): the batch step is one Slurm task, so every rank
    inherits SLURM_PROCID=0 and SLURM_LOCALID=0; only torchrun's RANK and LOCAL_RANK tell them apart."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "GROUP_RANK": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS": "1",
            "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1"}


@contextlib.contextmanager
def environment(env: dict):
    """``env`` in os.environ while active; every variable as it was afterwards."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
