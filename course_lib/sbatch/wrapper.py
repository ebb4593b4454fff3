"""A wrapper script that srun starts on each task (``srun bash run_node.sh``, ``srun ./run_node.sh``): the launch
line is inside it. It is read as ``srun bash -c '<its lines>'``, which the rules already read: the bash that srun
starts on each task runs it, so a per-task variable there ($SLURM_NODEID) is that task's own, and the variables the
job script exported reach it.
"""
import shlex
from dataclasses import replace
from pathlib import Path

from course_lib.sbatch.script import Script, Simple, parse
from course_lib.sbatch.training import PYTHONS

SHELLS = {"bash", "sh"}


def wrapper_of(c: Simple) -> tuple[int, str] | None:
    """(where the command srun runs starts in ``c.words``, the file as written) for ``srun ... bash FILE``, ``sh
    FILE``, ``./FILE`` or a path to a ``.sh`` file; None where srun runs something else (``bash -c '...'`` too)."""
    if c.name != "srun":
        return None
    for i, w in enumerate(c.words[1:], 1):
        base = w.rsplit("/", 1)[-1]
        if base in PYTHONS | {"torchrun"}:
            return None
        if base in SHELLS:
            rest = c.words[i + 1:]
            first = next((k for k, x in enumerate(rest) if not x.startswith("-")), None)
            # bash -c, -lc, ...: the command is the text, which words_run reads
            if first is None or any("c" in o for o in rest[:first] if not o.startswith("--")):
                return None
            return i, rest[first]
        if not w.startswith("-") and (w.startswith("./") or w.endswith(".sh")):
            return i, w
    return None


def inline(s: Script, folders: list[Path]) -> Script:
    """``s`` with each srun line that runs a wrapper script read as ``srun ... bash -c '<the wrapper's lines>'``;
    ``folders``: where the wrapper is looked for (the job's working directory, then the job script's folder). A
    wrapper that is not there goes to ``s.unread``, its srun line left as it is."""
    simple, commands, unread = [], list(s.commands), []
    for c in s.simple:
        found = wrapper_of(c)
        path = next((f / found[1] for f in folders if (f / found[1]).is_file()), None) if found else None
        if path is None:
            unread += [(c.line, found[1], folders)] if found else []
            simple.append(c)
            continue
        i, written = found
        body = "; ".join(text for _, text in parse(path.read_text(errors="replace")).commands)
        via = "-c " if c.words[i].rsplit("/", 1)[-1] in SHELLS else "bash -c "
        simple.append(replace(c, words=c.words[:i] + ["bash", "-c", body]))
        commands = [(n, _replaced(text, written, via + shlex.quote(body)) if n == c.line else text)
                    for n, text in commands]
    return replace(s, simple=simple, commands=commands, unread=unread)


def _replaced(text: str, written: str, new: str) -> str:
    """``text`` with the first ``written`` (bare or quoted) replaced by ``new``."""
    old = next((q for q in (f'"{written}"', f"'{written}'", written) if q in text), written)
    return text.replace(old, new, 1)
