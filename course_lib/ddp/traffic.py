"""Step 2's traffic: what the script's own collectives send in its training loop, next to what averaging needs.

The values cannot show it: a script that all-reduces (and divides) every gradient again after DDP's backward, or
broadcasts the parameters after every step, keeps every rank's parameters identical, and the check's parameters are
the same as the solution's. Only the traffic doubles. The probe (``hooks``) adds up, per iteration over a DataLoader,
the elements of the tensors handed to each collective the script calls (``note``); ``judge`` compares the training
loader's per optimizer step with the model's parameter count: DDP needs none of the script's own (its all-reduce
runs inside backward, out of Python's sight), a script that averages the gradients itself one parameter's worth.
A scalar per step (a loss for the log) is far below either, and is not judged. The barriers in the loop are
counted too (``note_barrier``): one at every step only makes the faster ranks wait (Step 6, ``barriers``).
"""
from course_lib.ddp.messages import where

SLACK = 0.5   # in parameters' worth per step: well above a few scalars, well below one more copy of the gradients


def note(entry: dict, name: str, numel: int, place) -> None:
    """Add a collective's ``numel`` to a DataLoader iteration's record; ``place()``: its line, at the first such call
    in the iteration (a stack walk per collective name and epoch, not per call)."""
    sent = entry.setdefault("sent", {})
    if name not in sent:
        entry.setdefault("sent_at", {})[name] = place() or None
    sent[name] = sent.get(name, 0) + numel


def note_barrier(entry: dict, place) -> None:
    """A ``dist.barrier()`` inside a DataLoader iteration, counted; ``place()``: the line of the first."""
    entry["barriers"] = entry.get("barriers", 0) + 1
    if entry["barriers"] == 1:
        entry["barrier_at"] = place() or None


def barriers(loaders: list) -> tuple | None:
    """Step 6's failure when a rank called a barrier at every optimizer step of its training loop (the notebook:
    barriers only to time an epoch); ``loaders``: each rank's training loader record."""
    for rank, loader in enumerate(loaders):
        iters = (loader or {}).get("iters", [])
        steps, calls = sum(it["steps"] for it in iters), sum(it.get("barriers", 0) for it in iters)
        if steps and calls >= steps:
            at = where(next((it["barrier_at"] for it in iters if it.get("barrier_at")), None))
            return False, (f"rank {rank} called dist.barrier() {calls} times inside its training loop, at each of its "
                           f"{steps} optimizer steps{f' (the first{at})' if at else ''}: DDP's all-reduce in every "
                           "backward already keeps the ranks in step, so each barrier only makes the faster ranks "
                           "wait. Barriers are for timing (one before the clock starts, one before it stops): drop "
                           "this one.")
    return None


def judge(loaders: list, size: int, ddp_averaged: bool, summed: bool) -> str | None:
    """The failure message when a rank's own collectives in its training loop sent at least ``SLACK`` parameters'
    worth per optimizer step more than averaging needs (``ddp_averaged``: DDP did it, so nothing); else None.
    ``loaders``: each rank's training loader record (``steps.train_loader``); ``size``: the parameter count;
    ``summed``: the first step used the sum of the ranks' (already averaged) gradients (``averaging.judge``)."""
    need = 0 if ddp_averaged else 1
    worst = None
    for rank, loader in enumerate(loaders):
        iters = (loader or {}).get("iters", [])
        steps = sum(it["steps"] for it in iters)
        if not steps or not size:
            continue
        sent: dict = {}
        for it in iters:
            for name, n in it.get("sent", {}).items():
                sent[name] = sent.get(name, 0) + n
        per_step = sum(sent.values()) / steps / size
        if per_step >= need + SLACK and (worst is None or per_step > worst[1]):
            names = sorted(sent, key=sent.get, reverse=True)
            at = next((it["sent_at"][name] for name in names for it in iters if it.get("sent_at", {}).get(name)),
                      None)
            worst = rank, per_step, [f"{name} {sent[name] / steps / size:.1f}" for name in names], at
    if worst is None:
        return None
    rank, per_step, calls, at = worst
    measured = (f"rank {rank}'s own collectives in the training loop sent {per_step:.1f} times the model's {size:,} "
                f"parameters per optimizer step ({', '.join(calls)}; the largest{where(at) or ' in the loop'})")
    if ddp_averaged:
        result = (f"the first step used {len(loaders)} times the averaged gradient: the script summed DDP's "
                  "average again" if summed else f"the values are unchanged, but about {1 + per_step:.0f} times "
                  "the traffic of DDP's own all-reduce crosses the network each step")
        return (f"DistributedDataParallel already averages every gradient inside backward, but {measured}: {result}. "
                "Drop them: after backward every rank holds the averaged gradient, and the same step on every rank "
                "keeps the copies identical without any broadcast.")
    return (f"the script averages the gradients itself, which takes one all_reduce of each gradient per step, but "
            f"{measured}. Send each gradient once per step (or wrap the model in DistributedDataParallel).")
