"""The NCCL_ALGO experiment of notebook 05: time NCCL's all-reduce as NCCL chooses, then forced to Ring and Tree.

NCCL chooses ring or tree (and a protocol) from the topology and the message size; ``NCCL_ALGO=Ring``
or ``NCCL_ALGO=Tree`` forces one, and ``NCCL_DEBUG=INFO`` prints what it set up. Run on GPUs, one rank
per GPU, under srun or torchrun::

    NCCL_ALGO=Tree NCCL_DEBUG=INFO srun python -m course_lib.allreduce.nccl_experiment --sizes 1M 16M 256M

``job_script()`` writes that as an sbatch script for a GPU cluster. Without CUDA GPUs the module says so
and exits 0: the experiment is for a GPU cluster.

Rank 0 prints one line per size (``result_line``). With one rank nothing crosses between GPUs: the bus
bandwidth, algbw x 2(W-1)/W, is 0 by definition, so that line says ``busbw n/a`` and why instead of a figure.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from course_lib.core.rankkit import RankEnvError, rank_env

SIZES = ("1M", "16M", "256M")


NO_BUSBW = "busbw n/a (W=1: nothing crosses between GPUs, 2(W-1)/W = 0)"


def result_line(algo: str | None, world: int, nbytes: int, seconds: float) -> str:
    """What rank 0 prints for one size: the algorithm (or ``(NCCL chooses)``), W, the size, the time per
    all-reduce and the bus bandwidth (``busbw n/a`` and why for W < 2)."""
    from course_lib.allreduce.bench import human
    from course_lib.allreduce.costmodel import busbw

    bw = f"busbw {busbw(nbytes, seconds, world) / 1e9:7.2f} GB/s" if world >= 2 else NO_BUSBW
    return f"NCCL_ALGO={algo or '(NCCL chooses)'} W={world} {human(nbytes):>8}: {seconds * 1e6:9.1f} us  {bw}"


def gpus() -> int:
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def job_script(nodes: int = 2, gpus_per_node: int = 4, partition: str | None = None,
               account: str | None = None, sizes=SIZES) -> str:
    """An sbatch script that runs the experiment with NCCL_ALGO unset (the baseline: NCCL chooses), Ring, Tree."""
    extra = "".join(f"#SBATCH --{k}={v}\n" for k, v in (("partition", partition), ("account", account)) if v)
    return f"""#!/bin/bash
#SBATCH --job-name=nccl-algo
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={gpus_per_node}
#SBATCH --gpus-per-node={gpus_per_node}
#SBATCH --time=00:10:00
{extra}export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=$(( 10000 + SLURM_JOB_ID % 20000 ))   # from the job id (notebook 03): no clash on a shared node
export NCCL_DEBUG=INFO                 # NCCL prints its set-up: channels, rings, trees
export NCCL_DEBUG_SUBSYS=INIT,TUNING   # ... and the algorithm/protocol tuning
unset NCCL_ALGO
for algo in "" Ring Tree; do           # "": the baseline, NCCL_ALGO not set at all (NCCL chooses per call)
    echo "=== NCCL_ALGO=${{algo:-(unset: NCCL chooses)}}"
    env ${{algo:+NCCL_ALGO=$algo}} srun python -m course_lib.allreduce.nccl_experiment --sizes {' '.join(sizes)}
done
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", default=list(SIZES))
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args(argv)
    if gpus() == 0:
        print("no CUDA GPU here: the NCCL_ALGO experiment needs NVIDIA GPUs and NCCL (run it as a job on a "
              "GPU cluster: course_lib.allreduce.nccl_experiment.job_script()); skipped")
        return 0
    try:
        rank, local, world, _launcher = rank_env()
    except RankEnvError as e:
        print(f"nccl_experiment: {e}", file=sys.stderr)
        return 2
    import torch
    import torch.distributed as dist

    from course_lib.allreduce.bench import parse_size
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", local))
    for nbytes in map(parse_size, args.sizes):
        x = torch.ones(nbytes // 4, device="cuda")
        for _ in range(3):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / args.iters
        if rank == 0:
            print(result_line(os.environ.get("NCCL_ALGO"), world, nbytes, seconds), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
