"""One profiled training step of the course's CNN, run as a rank (``python -m course_lib.trace.step``).

Serial when the launcher gives one rank, DDP otherwise (gloo on CPU, NCCL on ``cuda:LOCAL_RANK``). A few warm-up
steps first (DDP builds its buckets in the order gradients arrive during the first backward), then one step under
``torch.profiler``, labelled ``forward``, ``backward`` and ``optimizer`` with ``record_function``. Each rank writes
``trace-rank<R>.json`` (Chrome trace format: chrome://tracing or https://ui.perfetto.dev open it).
Several ``--trace DIR CAP`` pairs trace one step per bucket setting in the same processes, each with a fresh model
and DDP wrapper (start-up and the process group are paid once).
DDP's all-reduce runs through a comm hook that does what DDP's default does (average the bucket: divide, then sum)
and keeps each collective's Work, so the profiler stops only after every Work of the step has ended. Gloo completes
a collective's future before it ends the collective's profiler record on its own thread (``finishWorkGloo``, then
``Work::finish``), and ``Work.wait()`` returns only after ``Work::finish``. Without the wait, the profiler could stop
while that thread still wrote to it: on a loaded 2-core machine a rank aborted with glibc's "malloc(): unsorted double
linked list corrupted" in about 1 of 100 to 200 launches (its core dump: gloo's thread tearing down the step's last
all-reduce while the main thread was in ``disableProfiler``).
The batch is random images: the time of a step does not depend on the pixel values.
"""
import argparse
import gc
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from course_lib.core.rankkit import rank_env
from course_lib.model import Net


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", nargs=2, action="append", required=True, metavar=("DIR", "CAP"),
                   help="folder for trace-rank<R>.json and DDP's bucket size in MiB ('default': DDP's default, "
                        "25 MiB after a first bucket of 1 MiB); repeat it to trace several settings")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args(argv)
    env = rank_env()
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{env.local_rank}" if cuda else "cpu")
    if env.world_size > 1:
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if cuda else "gloo", rank=env.rank, world_size=env.world_size)
    for folder, cap in args.trace:
        trace_one(Path(folder), None if cap == "default" else float(cap), args, env, device)
    if env.world_size > 1:
        dist.destroy_process_group()


def step(model, opt, x, y) -> None:
    """One labelled training step (the labels are the phases the timeline reads back)."""
    with record_function("forward"):
        loss = F.nll_loss(model(x), y)
    with record_function("backward"):
        loss.backward()
    with record_function("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)
    if x.is_cuda:
        torch.cuda.synchronize(x.device)


def average_keeping_work(works: list, bucket):   # no return annotation: DDP checks it against a typing object
    """DDP's default for a bucket (divide by the world size, then all-reduce the sum); the Work goes to ``works``."""
    work = dist.all_reduce(bucket.buffer().div_(dist.get_world_size()), async_op=True)
    works.append(work)
    return work.get_future().then(lambda fut: fut.value()[0])


def trace_one(out: Path, cap: float | None, args, env, device) -> None:
    """Warm-up steps, then one profiled step of a fresh model (DDP with bucket_cap_mb=cap on several ranks)."""
    torch.manual_seed(0)
    model = Net().to(device)
    works: list = []
    if env.world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)   # None: DDP's default
        model.register_comm_hook(works, average_keeping_work)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(args.batch_size, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (args.batch_size,), device=device)

    for _ in range(args.warmup):
        step(model, opt, x, y)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    works.clear()
    with profile(activities=activities) as prof:
        step(model, opt, x, y)
        for work in works:   # every collective of the step has ended its profiler record (module docstring)
            work.wait()
    out.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out / f"trace-rank{env.rank}.json"))
    print(f"rank {env.rank}: traced one step of batch {args.batch_size} on {device}"
          + (f", bucket_cap_mb={cap}" if env.world_size > 1 else ""), flush=True)
    # a DDP model goes before the process group (a clean shutdown, notebook 02's Step 6)
    del model, opt
    gc.collect()


if __name__ == "__main__":
    main()
