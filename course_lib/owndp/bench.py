"""Notebook 10's timing run, as W ranks: ``python -m course_lib.owndp.bench PATH [--steps N] [--width D] ...``.

The same MLP with no communication, in each of the learner's four wrappers and in torch's DDP, a step each in
turn; markers ``time``, ``error``, ``buckets`` and ``allreduce`` (for the alpha-beta fit); ``--trace DIR``
profiles one more step of each of TRACED.
"""
import argparse
import gc
import statistics
import time
from pathlib import Path

from course_lib import gridrun
from course_lib.checking.learner import explain
from course_lib.core import rankkit
from course_lib.core.loader import import_path
from course_lib.owndp.cases import CLASSES, ITEMS
from course_lib.zero.demo import counting_ddp

SIZES = (4 * 1024, 256 * 1024, 4 * 1024 * 1024)     # bytes of the all-reduces timed for the cost model
TRACED = ("naive", "overlapped", "bucketed", "torch DDP")   # the variants whose step --trace profiles


def make_model(width, layers):
    import torch
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods[:-1])


def wrap(mod, variant, model, bucket_mb):
    """The wrapped model and its finish call (a no-op where there is none to call)."""
    if variant == "compute only":
        return model, lambda: None
    if variant == "torch DDP":   # its buckets noted, None where a step ends
        ddp = counting_ddp(model, bucket_cap_mb=bucket_mb)
        return ddp, lambda: ddp.buckets.append(None)
    cls = getattr(mod, CLASSES[variant])
    ddp = cls(model, bucket_size_mb=bucket_mb) if variant == "bucketed" else cls(model)
    return ddp, ddp.finish_gradient_synchronization


def one_step(net, finish, opt, x, y):
    """(seconds of a whole step, seconds of its finish call), the ranks lined up before it starts."""
    import torch.distributed as dist
    import torch.nn.functional as F
    dist.barrier()
    t0 = time.perf_counter()
    F.mse_loss(net(x), y).backward()
    t1 = time.perf_counter()
    finish()
    t2 = time.perf_counter()
    opt.step()
    opt.zero_grad()
    return time.perf_counter() - t0, t2 - t1


def time_steps(nets, x, y, steps, warmup, report):
    """{variant: (median ms of a step, median ms of its finish call)}. The variants take turns, one step each, so
    that other work on a shared machine slows them alike; the median leaves out the few steps it slowed most. A
    variant whose code raises is reported (``report(variant, exc)``) and dropped: the same on every rank."""
    took = {v: [] for v in nets}
    for i in range(warmup + steps):
        for v in list(nets):
            try:
                t = one_step(*nets[v], x, y)
            except Exception as e:
                report(v, e)
                del nets[v], took[v]
                continue
            if i >= warmup:
                took[v].append(t)
    return {v: tuple(1000 * statistics.median(s[k] for s in ts) for k in (0, 1)) for v, ts in took.items()}


def trace_step(net, finish, opt, x, y, out):
    """One step under torch.profiler, its phases labelled as course_lib.trace.timeline reads them back (the finish
    call inside backward: the gradients are not synchronised before it returns); the trace goes to ``out``."""
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, record_function
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("forward"):
            loss = F.mse_loss(net(x), y)
        with record_function("backward"):
            loss.backward()
            finish()
        with record_function("optimizer"):
            opt.step()
            opt.zero_grad()
    prof.export_chrome_trace(str(out))


def time_allreduce(rank):
    """The median time of 5 all-reduces of each of SIZES."""
    import torch
    import torch.distributed as dist
    for nbytes in SIZES:
        t = torch.ones(nbytes // 4)
        dist.all_reduce(t)                         # warm-up: the connections are made
        took = []
        for _ in range(5):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            took.append(time.perf_counter() - t0)
        rankkit.emit("allreduce", rank=rank, bytes=nbytes, ms=1000 * statistics.median(took))


def build(mod, width, layers, bucket_mb, report):
    """{variant: (wrapped model, its finish call, its optimizer)}, each on a fresh copy of the same model."""
    import torch
    nets = {}
    for variant in ("compute only", *(ITEMS if mod else ()), "torch DDP"):
        model = make_model(width, layers)
        try:
            net, finish = wrap(mod, variant, model, bucket_mb)
        except Exception as e:   # the learner's code: the same on every rank, so no rank is left waiting
            report(variant, e)
            continue
        nets[variant] = (net, finish, torch.optim.SGD(model.parameters(), lr=1e-3))
    return nets


def run(path, steps, warmup, width, layers, batch, bucket_mb, trace=None):
    import torch
    import torch.distributed as dist
    rank, _ = gridrun.start()
    torch.set_num_threads(1)       # one core per rank, as the ranks of a CPU job share the node's cores

    def report(variant, e):
        rankkit.emit("error", variant=variant, rank=rank, message=explain(e, path, "own_ddp.py"))
    try:
        mod = import_path(path, "learner_own_ddp")
    except Exception as e:
        mod = None
        report("all", e)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)
    nets = build(mod, width, layers, bucket_mb, report)
    for variant, (step_ms, finish_ms) in time_steps(nets, x, y, steps, warmup, report).items():
        rankkit.emit("time", variant=variant, rank=rank, step_ms=step_ms, finish_ms=finish_ms)
    if "torch DDP" in nets:        # its buckets in the last step (DDP rebuilds them after the first)
        last = [4 * n if n else n for n in nets["torch DDP"][0].buckets[:-1][::-1]]     # float32
        rankkit.emit("buckets", rank=rank, bytes=last[:last.index(None) if None in last else None][::-1])
    for variant in [v for v in TRACED if v in nets] if trace else ():
        out = Path(trace) / variant.replace(" ", "_") / f"trace-rank{rank}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        trace_step(*nets[variant], x, y, out)
    nets.clear()                   # drop torch's DDP before the process group goes (gloo + DDP at exit)
    gc.collect()
    time_allreduce(rank)
    dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--bucket-mb", type=float, default=4.0)
    p.add_argument("--trace", default=None, help="folder: profile one more step of the TRACED variants there")
    a = p.parse_args(argv)
    run(a.path, a.steps, a.warmup, a.width, a.layers, a.batch, a.bucket_mb, a.trace)
    return 0


if __name__ == "__main__":
    rankkit.exit_now(main())
