"""One rank of ``course bench allreduce``: times the learner's all-reduces and gloo's on the same tensors.

An algorithm that fails a first small sum (a watchdog stops a hang) is left out with a ``skip`` marker.
"""
import argparse
import os
import time

from course_lib.checking.learner import learner_line
from course_lib.checking.watchdog import Watchdog
from course_lib.core.loader import import_path
from course_lib.core.rankkit import RankEnvError, emit, exit_now, rank_env

FLOAT_BYTES = 4


def iterations(nbytes: int, quick: bool) -> int:
    """More calls for small sizes (microseconds each), a few for 64 MiB."""
    budget = (16 if quick else 128) * 2**20          # bytes all-reduced per (size, algorithm)
    return max(2 if quick else 5, min(10 if quick else 50, budget // max(nbytes, 1)))


def load_algorithms(path: str, names: list[str]) -> dict:
    import torch.distributed as dist
    algos = {}
    learner = [n for n in names if n != "gloo"]
    if learner:
        try:
            module = import_path(path, "learner_allreduce")
        except BaseException as e:
            for n in learner:
                emit("skip", algo=n, why=f"{os.path.basename(path)} could not be loaded: {type(e).__name__}: {e}")
            learner = []
        for n in learner:
            fn = getattr(module, f"{n}_allreduce", None)
            if fn is None:
                emit("skip", algo=n, why=f"no {n}_allreduce in {os.path.basename(path)}")
            else:
                algos[n] = fn
    if "gloo" in names:
        algos["gloo"] = dist.all_reduce
    return algos


def sane(name, fn, path, rank, world, timeout: float) -> bool:
    """Run ``fn`` once on 1,009 elements; False (and a skip marker) unless every rank got the sum."""
    import torch
    import torch.distributed as dist
    x = torch.arange(1009, dtype=torch.float32) * (rank + 1)
    expected = torch.arange(1009, dtype=torch.float32) * (world * (world + 1) // 2)
    deadline = Watchdog(timeout, lambda frames: emit(      # a hang: a ``stuck`` marker, and this rank exits
        "stuck", fn=name, case=-1, seconds=timeout, where=learner_line(frames, path)))
    deadline.arm()
    try:
        fn(x)
        ok, why = torch.allclose(x, expected), "wrong sum on a 1,009-element test"
    except Exception as e:
        ok, why = False, f"raised {type(e).__name__}: {e}"
    flag = torch.tensor([0 if ok else 1])
    dist.all_reduce(flag)
    deadline.disarm()
    if int(flag):
        if rank == 0:
            emit("skip", algo=name, why=why if not ok else "wrong sum on another rank")
        return False
    return True


def time_one(fn, tensor, iters: int) -> float:
    """Mean seconds per call on the slowest rank."""
    import torch
    import torch.distributed as dist
    fn(tensor)                                        # warm-up: connections, buffers
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn(tensor)
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path")
    p.add_argument("--sizes", required=True, help="comma-separated sizes in bytes")
    p.add_argument("--algos", default="naive,ring,tree,gloo")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sanity-timeout", type=float, default=20.0)
    args = p.parse_args(argv)
    try:
        env = rank_env()
    except RankEnvError as e:
        p.error(str(e))
    import torch
    import torch.distributed as dist
    rank, world = env.rank, env.world_size
    dist.init_process_group("gloo", rank=rank, world_size=world)
    algos = load_algorithms(args.path, args.algos.split(","))
    algos = {n: fn for n, fn in algos.items() if sane(n, fn, args.path, rank, world, args.sanity_timeout)}
    reps = 2 if args.quick else 3
    for nbytes in map(int, args.sizes.split(",")):
        tensor = torch.zeros(max(1, nbytes // FLOAT_BYTES))   # zeros: the sum stays finite over many calls
        iters = iterations(nbytes, args.quick)
        best = {}
        # repetitions interleave the algorithms, and the best one counts: on a shared machine a burst of
        # someone else's work then slows one repetition, not one algorithm
        for _ in range(reps):
            for name, fn in algos.items():
                best[name] = min(best.get(name, float("inf")), time_one(fn, tensor, iters))
        if rank == 0:
            for name, seconds in best.items():
                emit("time", algo=name, ranks=world, bytes=tensor.numel() * FLOAT_BYTES, iters=iters,
                     reps=reps, seconds=seconds)
    emit("done")
    dist.destroy_process_group()
    exit_now(0)      # an orderly interpreter shutdown with torch loaded is slow


if __name__ == "__main__":
    main()
