"""Notebook 04: the learning rate for a larger global batch, and what a run costs.

Three functions, each a few lines; notebook 04 checks them on known values and then uses them:
``lr_at`` drives the warm-up + cosine run, ``scaling_rows`` makes the strong-scaling table, and
``gpu_hours_to_target`` prices each run by the GPU-hours (here: rank-hours) it took to reach the target accuracy.
"""
import math


def lr_at(step, total_steps, base_lr, peak_lr, warmup_steps):
    """The learning rate of optimizer step ``step`` (0, 1, ..., total_steps).

    Warm-up as Goyal et al. (2017) do it: start from the small-batch rate ``base_lr`` at step 0 and raise it by the
    same amount every step, to ``peak_lr`` (e.g. n x base_lr on n ranks) at ``warmup_steps``. Then a cosine decay from
    ``peak_lr`` at ``warmup_steps`` down to 0 at ``total_steps``. With ``warmup_steps=0`` the cosine starts at step 0.
    """
    ### BEGIN SOLUTION
    if step < warmup_steps:
        return base_lr + (peak_lr - base_lr) * step / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return peak_lr * 0.5 * (1.0 + math.cos(math.pi * progress))
    ### END SOLUTION


def scaling_rows(epoch_seconds):
    """Strong scaling: ``{ranks: seconds per epoch}`` -> one dict per number of ranks, fewest ranks first.

    Each row: ``ranks``, ``seconds`` (per epoch), ``speedup`` = T(r0) / T(n), ``efficiency`` = speedup x r0 / n
    (1.0 is ideal), and ``cost`` = n x T(n) / (r0 x T(r0)): the rank-seconds (GPU-seconds on a GPU cluster) an epoch
    costs, relative to the smallest run. r0 is the smallest number of ranks given (usually 1).
    """
    ### BEGIN SOLUTION
    r0 = min(epoch_seconds)
    t0 = epoch_seconds[r0]
    rows = []
    for n in sorted(epoch_seconds):
        t = epoch_seconds[n]
        speedup = t0 / t
        rows.append({"ranks": n, "seconds": t, "speedup": speedup, "efficiency": speedup * r0 / n,
                     "cost": n * t / (r0 * t0)})
    return rows
    ### END SOLUTION


def gpu_hours_to_target(curve, ranks, target, gpus_per_rank=1):
    """GPU-hours until a run first reaches ``target`` test accuracy, or None if it never does.

    ``curve`` is the run's ``[(training seconds so far, test accuracy), ...]`` after each epoch; the run holds
    ``ranks x gpus_per_rank`` GPUs for that long.
    """
    ### BEGIN SOLUTION
    for seconds, accuracy in curve:
        if accuracy >= target:
            return seconds * ranks * gpus_per_rank / 3600
    return None
    ### END SOLUTION
