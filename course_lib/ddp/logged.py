"""Step 2's log line: a scalar (the epoch's loss) all-reduced for the log and printed without the division.

``dist.all_reduce`` sums by default, as it does for gradients; for a loss in the log the sum is W times the mean.
The probe notes each blocking all_reduce of a one-element tensor, its value before and after (``scalar``,
``note_reduce``), and the values of each epoch line the script prints with ``course_lib.metrics.format_epoch_line``
(``install``); ``judge`` finds a loss or accuracy printed as the reduced sum.
"""
import functools

KEYS = ("loss", "acc")   # the values a mean belongs to (a count of images summed over the ranks is a right total)


def install(rec) -> None:
    import course_lib.metrics as metrics

    original = metrics.format_epoch_line
    lines = rec.data.setdefault("epoch_lines", [])

    @functools.wraps(original)
    def format_epoch_line(**values):
        if len(lines) < 10:
            lines.append({k: float(v) for k, v in values.items()
                          if isinstance(v, float) and any(w in k for w in KEYS)})
        return original(**values)

    metrics.format_epoch_line = format_epoch_line


def scalar(args: tuple, kwargs: dict) -> float | None:
    """The value of a blocking all_reduce's one-element tensor before the call; None for anything else."""
    import torch

    tensor = args[0] if args else kwargs.get("tensor")
    asynchronous = args[3] if len(args) > 3 else kwargs.get("async_op", False)
    if not isinstance(tensor, torch.Tensor) or tensor.numel() != 1 or asynchronous:
        return None
    return float(tensor.detach().reshape(-1)[0])


def note_reduce(rec, before, *args, **kwargs) -> None:
    """After a blocking all_reduce of one element (``before``: its value before, from ``scalar``)."""
    if before is None:
        return
    tensor = args[0] if args else kwargs.get("tensor")
    op = args[1] if len(args) > 1 else kwargs.get("op")
    seen = rec.data.setdefault("scalar_reduces", [])
    if len(seen) < 20:
        seen.append({"before": before, "after": float(tensor.detach().reshape(-1)[0]), "op": str(op)})


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


def judge(records: list) -> str | None:
    """The failure when a rank printed a loss or accuracy that is the SUM all_reduce's result (not divided)."""
    n = len(records)
    for rank, rec in enumerate(records):
        sums = [s for s in rec.get("scalar_reduces", []) if s["op"] in ("None", "ReduceOp.SUM", "RedOpType.SUM")
                and not _close(s["before"], s["after"])]
        for line in rec.get("epoch_lines", []):
            for key, value in line.items():
                hit = next((s for s in sums if _close(value, s["after"])), None)
                if hit:
                    return (f"rank {rank} printed {key}={value:.4f}, the result of its all_reduce of a scalar "
                            f"({hit['before']:.4f} on rank {rank}, summed over the {n} ranks): all_reduce sums by "
                            f"default, so the printed {key} is the sum of the ranks' values, {n} times their mean. "
                            "Divide the reduced value by the world size.")
    return None
