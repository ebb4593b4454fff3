"""Time a pipeline schedule stage by stage: ``python -m course_lib.pp.measure --pp-file PATH`` as p ranks, one stage
per rank, gloo; each rank prints one ``PPEVENT {json}`` line per step, read back by ``timeline.parse``.

Each forward_step / backward_step call is made to last ``--forward-ms`` / ``--backward-ms`` at least with a sleep
standing for a GPU kernel: on a laptop the ranks share fewer cores than there are stages, so real arithmetic would
measure the machine's contention; what is left to measure is what the schedule decides (the bubble, the
micro-batches held).
"""
import argparse
import json
import time

from course_lib import gridrun
from course_lib.core.loader import import_path
from course_lib.pp import pipe as pp
from course_lib.pp.timeline import PREFIX


def wrap(mod, fwd_s: float, bwd_s: float, events: list, clock):
    """Replace mod.forward_step / backward_step by timed ones that last at least fwd_s / bwd_s."""
    originals = mod.forward_step, mod.backward_step
    by_output: dict = {}

    def timed(kind, i, fn, least, *args):
        t0 = clock()
        out = fn(*args)
        left = least - (clock() - t0)
        if left > 0:
            time.sleep(left)
        events.append({"kind": kind, "i": i, "t0": t0, "t1": clock()})
        return out

    def forward_step(pipe, x, target=None):
        i = sum(e["kind"] == "F" for e in events)
        y = timed("F", i, originals[0], fwd_s, pipe, x, target)
        by_output[id(y)] = (i, y)
        return y

    def backward_step(pipe, x, y, grad):
        i, _ = by_output.pop(id(y), (-1, None))
        return timed("B", i, originals[1], bwd_s, pipe, x, y, grad)

    mod.forward_step, mod.backward_step = forward_step, backward_step
    return originals


def step(mod, schedule: str, m: int, a, rank: int, world: int) -> dict:
    import torch.distributed as dist
    model = pp.make_model(2 * world, a.width)
    xs, ys = pp.make_batch(m, a.micro, a.width)
    pipe = pp.make_pipe(model, world, rank, m, a.micro)
    events: list = []
    dist.barrier()
    start = time.monotonic()
    originals = wrap(mod, a.forward_ms / 1000, a.backward_ms / 1000, events, lambda: time.monotonic() - start)
    try:
        loss = getattr(mod, schedule)(pipe, xs, ys)
    finally:
        mod.forward_step, mod.backward_step = originals
    end = time.monotonic() - start
    dist.barrier()
    return {"schedule": schedule, "p": world, "m": m, "stage": rank, "events": events, "end": end, "loss": loss}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pp-file", required=True)
    p.add_argument("--m", default="1,2,3,4,5,6,7,8", help="micro-batch counts, comma-separated")
    p.add_argument("--schedules", default="afab,one_f_one_b")
    p.add_argument("--forward-ms", type=float, default=20.0)
    p.add_argument("--backward-ms", type=float, default=40.0)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--micro", type=int, default=4)
    a = p.parse_args(argv)
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    rank, world = gridrun.start(timeout_s=60)
    mod = import_path(a.pp_file, "learner_pp")
    for schedule in a.schedules.split(","):
        for m in (int(v) for v in a.m.split(",")):
            print(PREFIX + json.dumps(step(mod, schedule, m, a, rank, world)), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
