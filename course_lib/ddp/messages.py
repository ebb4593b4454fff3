"""How a run's evidence is quoted in a learner's message: file names, a rank's last lines, the first
sentence of a library's error, a line of the learner's file."""
import re
from pathlib import Path

ENV_HELP = "srun sets SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS; torchrun sets RANK, LOCAL_RANK, WORLD_SIZE"


def short(path) -> str:
    return Path(path).name if path else "?"


def tail(run, rank: int) -> str:
    """The last 4 lines ``rank`` printed before any traceback (the error itself is reported on its own)."""
    lines = list(run.result.ranks[rank].lines) if rank < len(run.result.ranks) else []
    if "Traceback (most recent call last):" in lines:
        lines = lines[:lines.index("Traceback (most recent call last):")]
    lines = [line for line in lines if line.strip()][-4:]
    if not lines:
        return f"rank {rank} printed nothing before that"
    return f"last lines rank {rank} printed:\n" + "\n".join("    " + line[:160] for line in lines)


def first(text: str, limit: int = 220) -> str:
    """The first sentence of a (long, library-made) error message."""
    text = re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", text.strip().splitlines()[0] if text.strip() else "")
    m = re.match(r"(.{20,}?[.!])(\s|$)", text)
    return cut(m.group(1) if m else text, limit)


def cut(text: str, limit: int) -> str:
    """``text``, or its first ``limit`` characters ending in "..." when it is longer."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def ranks_text(ranks) -> str:
    """'rank 1' or 'ranks 0, 2'."""
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def where(where: dict | None) -> str:
    """' at line 42 of script.py: code' for the probe's record of a place in the learner's file."""
    if not where or not where.get("line"):
        return ""
    code = f": {where['code']}" if where.get("code") else ""
    return f" at line {where['line']} of {short(where.get('file'))}{code}"
