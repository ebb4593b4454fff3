"""What bash does with the script's lines that the ranks depend on: it runs them in order (an export below the
launch line comes too late for the ranks), and single quotes stop it expanding ``$(...)``.
"""
import re

from course_lib.sbatch.script import Script
from course_lib.sbatch.training import launches


def training_line(s: Script) -> int | None:
    """The first line that starts a python script or torchrun (``python -c '...'``, a quick look, is not one)."""
    for line, name, rest in launches(s):
        first = next((k for k, w in enumerate(rest) if not w.startswith("-")), len(rest))
        if name == "torchrun" or (first < len(rest) and "-c" not in rest[:first]):
            return line
    return None


def after_launch(s: Script, names) -> list[str]:
    """Exports of ``names`` below the first line that starts the training: the ranks started there never see them."""
    start = training_line(s)
    if start is None:
        return []
    return [f"line {s.exports[name][0]}: export {name}=... comes after the line that starts the training (line "
            f"{start}): bash runs the lines in order, so the ranks started there never see it; move it above line "
            f"{start}" for name in names if name in s.exports and s.exports[name][0] > start]


def single_quoted(s: Script, name: str, fix: str) -> list[str]:
    """``export NAME='$(...)'``: bash expands nothing between single quotes, so the ranks get the text itself."""
    if name not in s.exports:
        return []
    line, value = s.exports[name]
    text = value.strip()
    if not (text.startswith("'") and re.search(r"[$`]", text)):
        return []
    return [f"line {line}: {name}={value}: the single quotes stop bash from running or expanding what is inside, so "
            f"the ranks get that text itself, not a host; drop the quotes (or use double quotes): {fix}"]


# Slurm sets these per task; in the batch step (sbatch(1): the script runs as task 0 on the first node) each is 0
# ($SLURM_NODEID, ${SLURM_NODEID}, or the bare name inside $(( )), where bash reads it too)
PER_TASK = re.compile(r"\$\{?(SLURM_NODEID|SLURM_PROCID|SLURM_LOCALID)\b"
                      r"|\$\(\([^)]*?\b(SLURM_NODEID|SLURM_PROCID|SLURM_LOCALID)\b")


def batch_expands(command: str, start: int) -> bool:
    """Whether the batch step's bash expands the ``$`` at ``command[start]``: not between single quotes (outside
    double ones) and not escaped. Inside ``srun bash -c '...'`` it is the bash srun starts on each node that does."""
    single = double = escaped = False
    for ch in command[:start]:
        if escaped:
            escaped = False
        elif ch == "\\" and not single:
            escaped = True
        elif ch == "'" and not double:
            single = not single
        elif ch == '"' and not single:
            double = not double
    return not single and not escaped


def per_task_in_batch(command: str, after: int = 0) -> str | None:
    """The first per-task variable (``$SLURM_NODEID``, ...) from ``command[after]`` on that the batch step's bash
    expands."""
    return next((m.group(1) or m.group(2) for m in PER_TASK.finditer(command, after)
                 if batch_expands(command, m.start())), None)
