"""Cut a model into p stages of consecutive layers: by layer count (GPipe's simple partition), or by measured time
so that the slowest stage, which sets the pipeline's pace, is as fast as it can be."""
import functools
import itertools
import statistics
import time

from course_lib.pp.pipe import split_layers as by_count  # noqa: F401 - notebook 12's partition by layer count


def time_layers(layers, x, reps: int = 5) -> list[float]:
    """Each layer's forward + backward in seconds (the median of ``reps``), fed the previous layer's output."""
    import torch
    out = []
    for layer in layers:
        runs = []
        for _ in range(reps + 1):   # the first run (allocations, first touch of the weights) is not timed
            inp = x.detach().requires_grad_()
            t0 = time.perf_counter()
            y = layer(inp)
            y.backward(torch.ones_like(y))
            runs.append(time.perf_counter() - t0)
        out.append(statistics.median(runs[1:]))
        x = y.detach()
    return out


def by_time(times: list[float], p: int) -> list[range]:
    """Consecutive layers whose largest stage time is the smallest possible (exact, by dynamic programming)."""
    n, prefix = len(times), [0.0, *itertools.accumulate(times)]

    @functools.lru_cache(maxsize=None)
    def best(start: int, parts: int) -> tuple[float, tuple]:
        if parts == 1:
            return prefix[n] - prefix[start], (n,)
        options = ((end, *best(end, parts - 1)) for end in range(start + 1, n - parts + 2))
        return min((max(prefix[end] - prefix[start], rest), (end, *cuts)) for end, rest, cuts in options)

    _, cuts = best(0, p)
    return [range(a, b) for a, b in zip((0, *cuts[:-1]), cuts)]


def stage_times(times: list[float], stages: list[range]) -> list[float]:
    return [sum(times[i] for i in r) for r in stages]
