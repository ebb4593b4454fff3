"""Stands in for ``python`` and ``torchrun`` inside the checked job: each rank prints one ``@@probe {json}`` line
of what it saw (rank, script, MASTER_ADDR/PORT, threads, CPUs, GPUs), then joins a gloo group through ``env://``
and all-reduces a one, with a deadline. A torchrun line is run by the real torchrun with this module as its script.
"""
import json
import os
import socket
import sys
import time

MARK = "@@probe "
WATCHED = ("MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK", "CUDA_VISIBLE_DEVICES",
           "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def say(**fields) -> None:
    """One record: on stdout for the job's log, and whole, in one unbuffered write, to a file of this process in
    $COURSE_PROBE_DIR (torchrun's --tee copies a child's output in pieces, which can cut a line)."""
    line = MARK + json.dumps(fields)
    print(line, flush=True)
    if os.environ.get("COURSE_PROBE_DIR"):
        with open(os.path.join(os.environ["COURSE_PROBE_DIR"], f"{socket.gethostname()}-{os.getpid()}.jsonl"), "ab",
                  buffering=0) as f:
            f.write((line + "\n").encode())


def _identity() -> tuple[str, int, int, int]:
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return "torchrun", int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0))
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:   # as the course's DDP script reads them
        return "srun", int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0))
    return "none", 0, 1, 0


def as_rank(script: str, timeout: float, args: list[str] = ()) -> int:
    import datetime

    import torch
    import torch.distributed as dist

    how, rank, world, local = _identity()
    say(kind="rank", launcher=how, rank=rank, world=world, local_rank=local, host=socket.gethostname(),
        script=script, cwd=os.getcwd(), found=os.path.isfile(script), args=args,
        cpus=len(os.sched_getaffinity(0)), env={k: os.environ.get(k) for k in WATCHED})
    if how == "srun" and world > 1 and "SLURM_STEP_NUM_TASKS" not in os.environ:
        # srun sets SLURM_STEP_NUM_TASKS for its tasks; the batch step has only the job's SLURM_NTASKS, so this
        # process was not started by srun and its peers never will be: joining would wait for them until timeout
        say(kind="group", rank=rank, ok=False, error=f"not started by srun: this process runs in the job's batch "
            f"step, where SLURM_NTASKS={world} counts the job's tasks, not processes that exist; the other "
            f"{world - 1} never start, so init_process_group would wait for them until its timeout")
        return 1
    start = time.monotonic()
    try:
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout))
        t = torch.ones(1)
        dist.all_reduce(t)
        dist.destroy_process_group()
        say(kind="group", rank=rank, ok=t.item() == world, sum=t.item(), seconds=round(time.monotonic() - start, 2))
    except Exception as e:     # what the rank would have died of; the check names it
        say(kind="group", rank=rank, ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
        return 1
    return 0


def as_torchrun(args: list[str]) -> int:
    from torch.distributed.run import get_args_parser, run

    say(kind="torchrun", argv=args, host=socket.gethostname(), env={k: os.environ.get(k) for k in WATCHED})
    parsed = get_args_parser().parse_args(args)
    parsed.training_script_args = ["--rank-of", parsed.training_script, *parsed.training_script_args]
    parsed.training_script = os.path.abspath(__file__)
    parsed.module = parsed.no_python = False
    try:
        run(parsed)
    except Exception as e:
        say(kind="torchrun-error", error=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
        return 1
    return 0


def main(argv: list[str]) -> int:
    timeout = float(os.environ.get("COURSE_PROBE_TIMEOUT", "30"))
    if argv[:1] == ["--rank-of"]:                       # under torchrun
        return as_rank(argv[1], timeout, argv[2:])
    role, args = argv[0], argv[1:]
    if role == "python" and args[:2] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"]):
        role, args = "torchrun", args[2:]
    if role == "torchrun":
        return as_torchrun(args)
    script = next((a for a in args if not a.startswith("-")), None)
    if args[:1] in (["-c"], ["-m"]) or script is None:   # not a training script: the real python does it
        os.execv(sys.executable, [sys.executable, *args])
    return as_rank(script, timeout, args[args.index(script) + 1:])


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)   # a stand-in has nothing to tear down; an interpreter with torch spends ~0.5 CPU-s on it
