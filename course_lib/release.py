"""Write exercises/ from solutions/: ``course release`` (``--check``: fail if exercises/ would change).

solutions/ is the one source. What a learner must write is marked with nbgrader's delimiters, so
instructors who use nbgrader can take the files as they are::

    ### BEGIN SOLUTION
    # STUB: train_sampler = None        <- becomes ``train_sampler = None`` in the exercise
    train_sampler = DistributedSampler(train_set)
    ### END SOLUTION

In the exercise each marked region becomes its stub: the region's ``# STUB: `` lines without that prefix
(at the marker's indentation), or, with none, nbgrader's own stub ``raise NotImplementedError()``.
Everything outside the regions is copied as it is. ``solution_view`` gives the file without markers and
stub lines: the clean solution a learner reads (and the diff notebook 02 shows).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from course_lib import ROOT

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = re.compile(r"^(\s*)# STUB:(?: (.*))?$")
NOT_EXERCISES = ("01_serial",)   # the serial baseline is a solution only


class MarkerError(ValueError):
    pass


def _regions(text: str, name: str):
    """Yield ("text", line) and ("region", indent, [lines]) items of a marked source."""
    region, indent = None, ""
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        stripped = line.strip()
        if stripped == BEGIN:
            if region is not None:
                raise MarkerError(f"{name}:{number}: {BEGIN} inside another region")
            region, indent = [], line[: len(line) - len(line.lstrip())]
        elif stripped == END:
            if region is None:
                raise MarkerError(f"{name}:{number}: {END} without {BEGIN}")
            yield ("region", indent, region)
            region = None
        elif region is not None:
            region.append(line)
        else:
            yield ("text", line)
    if region is not None:
        raise MarkerError(f"{name}: {BEGIN} is never closed")


def exercise_view(text: str, name: str = "<source>") -> str:
    out = []
    for item in _regions(text, name):
        if item[0] == "text":
            out.append(item[1])
            continue
        _, indent, lines = item
        stubs = [m for m in (STUB.match(line.rstrip("\n")) for line in lines) if m]
        if stubs:
            out.extend(f"{m.group(1)}{m.group(2) or ''}".rstrip() + "\n" for m in stubs)
        else:
            out.append(f"{indent}# YOUR CODE HERE\n{indent}raise NotImplementedError()\n")
    return "".join(out)


def solution_view(text: str, name: str = "<source>") -> str:
    out = []
    for item in _regions(text, name):
        if item[0] == "text":
            out.append(item[1])
        else:
            out.extend(line for line in item[2] if not STUB.match(line.rstrip("\n")))
    return "".join(out)


def plan(solutions: Path, exercises: Path) -> dict[Path, str]:
    """{exercise path: content} for every file under solutions/ that is an exercise."""
    files = {}
    for src in sorted(solutions.rglob("*")):
        rel = src.relative_to(solutions)
        if not src.is_file() or rel.parts[0] in NOT_EXERCISES or "__pycache__" in rel.parts:
            continue
        text = src.read_text(encoding="utf-8")
        files[exercises / rel] = exercise_view(text, str(src)) if src.suffix == ".py" else text
    return files


def add_arguments(p):
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if exercises/ is out of date")
    p.add_argument("--solutions", type=Path, default=ROOT / "solutions")
    p.add_argument("--exercises", type=Path, default=ROOT / "exercises")


def run(args) -> int:
    try:
        files = plan(args.solutions, args.exercises)
    except MarkerError as e:
        print(f"release: {e}", file=sys.stderr)
        return 2
    stale = [p for p, text in files.items() if not p.is_file() or p.read_text(encoding="utf-8") != text]
    if args.check:
        for p in stale:
            print(f"out of date: {p} (run `course release`)")
        print(f"{len(files) - len(stale)}/{len(files)} exercise files up to date")
        return 1 if stale else 0
    for p in stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(files[p], encoding="utf-8")
        print(f"wrote {p}")
    print(f"{len(files)} exercise files, {len(stale)} written")
    return 0
