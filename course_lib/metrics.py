"""Read the per-epoch lines that every training script of the course prints.

A line looks like ``epoch=1 train_loss=0.3012 test_loss=0.1001 test_acc=0.9690 images_per_s=5234.1
images_per_s_rank=2617.0 epoch_s=11.46``: ``key=value`` pairs after ``epoch=``. In a multi-rank log a line
may carry a rank label in front (``[rank 1] `` from course_lib.runtime.launch, ``1: `` from ``srun --label``).
"""
import re

EPOCH_LINE = re.compile(r"^(?:\[rank (?P<r1>\d+)\] |(?P<r2>\d+): )?(?P<body>epoch=\S+(?: \S+=\S+)*)\s*$")


def format_epoch_line(**values) -> str:
    """``epoch=1 train_loss=0.3012 ...``: floats with 4 significant decimals, the rest as they are."""
    return " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())


def _number(text: str):
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def parse_epoch_lines(text: str, rank: int | None = 0) -> list[dict]:
    """The epoch records in ``text`` as dicts of numbers, in order.

    ``rank=0`` keeps unlabelled lines and rank 0's (the usual report); ``rank=None`` keeps all, each with
    its ``rank`` (None when unlabelled).
    """
    records = []
    for line in text.splitlines():
        m = EPOCH_LINE.match(line.strip("\r"))
        if not m:
            continue
        label = m.group("r1") or m.group("r2")
        line_rank = int(label) if label is not None else None
        if rank is not None and line_rank not in (None, rank):
            continue
        rec = {k: _number(v) for k, v in (pair.split("=", 1) for pair in m.group("body").split())}
        if rank is None:
            rec["rank"] = line_rank
        records.append(rec)
    return records
