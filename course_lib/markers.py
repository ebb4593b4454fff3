"""The solution markers of solutions/ (nbgrader's delimiters and the course's ``# STUB:`` lines), read by the
lessons that show a solution (``ddp.stepdiff``) and by the release that writes exercises/ from it
(``instructor.release``, whose docstring gives the format)::

    ### BEGIN SOLUTION
    # STUB: train_sampler = None        <- becomes ``train_sampler = None`` in the exercise
    train_sampler = DistributedSampler(train_set)
    ### END SOLUTION
"""
import re

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = re.compile(r"^(\s*)# STUB:(?: (.*))?$")


class MarkerError(ValueError):
    pass


def regions(text: str, name: str):
    """Yield ("text", line) and ("region", indent, [lines]) items of a marked source."""
    region, indent = None, ""
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        stripped = line.strip()
        for marker, word in ((BEGIN, "BEGIN SOLUTION"), (END, "END SOLUTION")):
            if word in line and stripped != marker:
                raise MarkerError(f"{name}:{number}: nbgrader reads this line as a marker; write {marker} "
                                  "alone on its line, or reword it")
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


def solution_view(text: str, name: str = "<source>") -> str:
    """The clean solution: markers and STUB lines removed."""
    out = []
    for item in regions(text, name):
        if item[0] == "text":
            out.append(item[1])
        else:
            out.extend(line for line in item[2] if not STUB.match(line.rstrip("\n")))
    return "".join(out)
