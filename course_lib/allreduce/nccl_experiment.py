"""The NCCL_ALGO experiment of notebook 05: time NCCL's all-reduce as NCCL chooses, then forced to Ring and Tree.

One rank per GPU, under srun or torchrun (``job_script()``); without CUDA GPUs it says so and exits 0.
"""
import argparse
import os
import sys
import time

from course_lib.core.rankkit import RankEnvError, rank_env

SIZES = ("1M", "16M", "256M")
NO_BUSBW = "busbw n/a (W=1: nothing crosses between GPUs, 2(W-1)/W = 0)"


def result_line(algo: str | None, world: int, nbytes: int, seconds: float) -> str:
    """Rank 0's line for one size (with one rank nothing crosses between GPUs: no busbw)."""
    from course_lib.allreduce.bench import human
    from course_lib.allreduce.costmodel import busbw

    bw = f"busbw {busbw(nbytes, seconds, world) / 1e9:7.2f} GB/s" if world >= 2 else NO_BUSBW
    return f"NCCL_ALGO={algo or '(NCCL chooses)'} W={world} {human(nbytes):>8}: {seconds * 1e6:9.1f} us  {bw}"


def job_script(nodes: int = 2, gpus_per_node: int = 4) -> str:
    """An sbatch script that runs the experiment with NCCL_ALGO unset (the baseline: NCCL chooses), Ring, Tree."""
    return f"""#!/bin/bash
#SBATCH --job-name=nccl-algo
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={gpus_per_node}
#SBATCH --gpus-per-node={gpus_per_node}
#SBATCH --time=00:10:00
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=$(( 10000 + SLURM_JOB_ID % 20000 ))   # from the job id (notebook 03): no clash on a shared node
export NCCL_DEBUG=INFO                 # NCCL prints its set-up: channels, rings, trees
export NCCL_DEBUG_SUBSYS=INIT,TUNING   # ... and the algorithm/protocol tuning
unset NCCL_ALGO
for algo in "" Ring Tree; do           # "": the baseline, NCCL_ALGO not set at all (NCCL chooses per call)
    echo "=== NCCL_ALGO=${{algo:-(unset: NCCL chooses)}}"
    env ${{algo:+NCCL_ALGO=$algo}} srun python -m course_lib.allreduce.nccl_experiment --sizes {' '.join(SIZES)}
done
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", default=list(SIZES))
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("no CUDA GPU here: the NCCL_ALGO experiment needs NVIDIA GPUs and NCCL (run it as a job on a "
              "GPU cluster: course_lib.allreduce.nccl_experiment.job_script()); skipped")
        return 0
    try:
        rank, local, world, _launcher = rank_env()
    except RankEnvError as e:
        print(f"nccl_experiment: {e}", file=sys.stderr)
        return 2
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
