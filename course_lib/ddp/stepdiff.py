"""The lesson of notebook 02: the diff from the serial script to the DDP script, hunk by hunk, by step.

Every changed hunk of the DDP exercise's solution (its clean view: no exercise markers) against the serial
script it starts from (both named by course_lib.registry) carries a ``# Step N`` comment; ``hunks()`` returns them
with the steps they name, ``show(step)`` displays one step's hunks (HTML in Jupyter, text elsewhere).
"""
import ast
import difflib
import html
import re
from dataclasses import dataclass

from course_lib import registry
from course_lib.markers import solution_view

SERIAL = registry.reference("serial")
DDP = registry.reference("ddp")
MARK = re.compile(r"#\s*Step (\d)")


@dataclass
class Hunk:
    header: str           # "@@ -88,0 +112,6 @@"
    lines: list[str]      # "-old", "+new" and " context" lines
    steps: set[int]       # the steps its added lines name
    in_docstring: bool    # only the module docstring changed (it describes the steps; no marker needed)

    def text(self) -> str:
        return "\n".join([self.header, *self.lines])


def _docstring_lines(text: str) -> range:
    node = next(iter(ast.parse(text).body), None)
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return range(node.lineno, node.end_lineno + 1)
    return range(0)


def hunks(serial: str | None = None, ddp: str | None = None, context: int = 0) -> list[Hunk]:
    """The hunks of serial -> DDP (the clean solution view), each with the steps it is marked with."""
    serial = SERIAL.read_text(encoding="utf-8") if serial is None else serial
    ddp = solution_view(DDP.read_text(encoding="utf-8")) if ddp is None else ddp
    a, b = serial.splitlines(), ddp.splitlines()
    doc_a, doc_b = _docstring_lines(serial), _docstring_lines(ddp)
    out = []
    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(context):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        lines, steps, changed_a, changed_b = [], set(), [], []
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                lines += [" " + line for line in a[a1:a2]]
                continue
            lines += ["-" + line for line in a[a1:a2]]
            lines += ["+" + line for line in b[b1:b2]]
            steps |= {int(m) for line in b[b1:b2] for m in MARK.findall(line)}
            changed_a += range(a1 + 1, a2 + 1)
            changed_b += range(b1 + 1, b2 + 1)
        in_doc = all(n in doc_a for n in changed_a) and all(n in doc_b for n in changed_b)
        out.append(Hunk(f"@@ -{i1 + 1},{i2 - i1} +{j1 + 1},{j2 - j1} @@", lines, steps, in_doc))
    return out


WITHHELD = ("Step {step}: the reference solution is withheld in this install (a graded workshop), so its change "
            "is not shown; the step's text above and its check say what to write.")


class StepDiff:
    """One step's change, shown as a coloured diff in a notebook (folded unless ``open``): ``show(3)`` displays the
    hunks marked ``# Step 3``."""

    def __init__(self, step: int, open: bool = True):
        self.step, self.open = step, open
        try:
            self.hunks, self.withheld = [h for h in hunks(context=2) if step in h.steps], False
        except PermissionError:     # a graded workshop's install keeps solutions/ from learners (SOLUTIONS_GROUP)
            self.hunks, self.withheld = [], True

    def __str__(self) -> str:
        if self.withheld:
            return WITHHELD.format(step=self.step)
        return "\n".join(h.text() for h in self.hunks)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        if self.withheld:
            return f"<p>{html.escape(str(self))}</p>"
        colour = {"+": "#e6ffec", "-": "#ffebe9"}
        rows = []
        for h in self.hunks:
            rows.append(f"<div style='color:#6e7781'>{html.escape(h.header)}</div>")
            for line in h.lines:
                bg = colour.get(line[:1], "transparent")
                rows.append(f"<div style='background:{bg};white-space:pre'>{html.escape(line)}</div>")
        body = "<pre style='font-size:12px;line-height:1.35'>" + "".join(rows) + "</pre>"
        n = len(self.hunks)
        summary = f"Step {self.step}: the change from the serial script ({n} place{'s' if n != 1 else ''})"
        return f"<details{' open' if self.open else ''}><summary>{summary}</summary>{body}</details>"


show = StepDiff
