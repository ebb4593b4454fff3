"""The result of a check: one verdict per step or function, shown as text, as HTML, or as CSV rows.

Every checker returns a ``Report``; the grader writes its rows, the CLI prints ``report.text()`` and
exits non-zero unless ``report.passed``, a notebook shows it as a table.
"""
import html
from dataclasses import asdict, dataclass, field

# SKIPPED: an item that could not be established here (e.g. a job script read without Slurm to run it). It is shown
# as NOT RUN, never counted as passed, and left out of the score (a report of skipped items alone has not passed).
PASS, FAIL, MISSING, SKIPPED = "pass", "fail", "missing", "skipped"
_MARK = {PASS: "PASS", FAIL: "FAIL", MISSING: "MISSING", SKIPPED: "NOT RUN"}


@dataclass
class Verdict:
    item: str          # "Step 1", "ring_allreduce", "ColumnParallelLinear", ...
    result: str        # PASS, FAIL, MISSING or SKIPPED
    message: str = ""  # what was seen and what to do; one or a few lines


@dataclass
class Report:
    exercise: str      # "ddp", "allreduce", "tp"
    path: str
    verdicts: list[Verdict] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, item: str, ok: bool, message: str = "") -> Verdict:
        v = Verdict(item, PASS if ok else FAIL, message)
        self.verdicts.append(v)
        return v

    def skip(self, item: str, message: str) -> Verdict:
        """An item not established here: NOT RUN, with why (never a PASS)."""
        v = Verdict(item, SKIPPED, message)
        self.verdicts.append(v)
        return v

    @property
    def judged(self) -> list[Verdict]:
        """The verdicts that count: every one but the skipped."""
        return [v for v in self.verdicts if v.result != SKIPPED]

    @property
    def passed(self) -> bool:
        return bool(self.judged) and all(v.result == PASS for v in self.judged)

    def tally(self) -> str:
        """"5/7 passed", with ", 1 not run" where items were skipped."""
        n_ok = sum(v.result == PASS for v in self.judged)
        n_skip = len(self.verdicts) - len(self.judged)
        return f"{n_ok}/{len(self.judged)} passed" + (f", {n_skip} not run" if n_skip else "")

    def header(self) -> str:
        """The command that makes this report, for an exercise (``course check ddp PATH``); otherwise what was
        checked (a notebook's own check, the machine's set-up): no command that does not exist."""
        from course_lib.registry import EXERCISES  # the standard library only: cheap
        if self.exercise in EXERCISES:
            return f"course check {self.exercise} {self.path}"
        return f"{self.exercise} check ({self.path})"

    def text(self) -> str:
        width = max((len(v.item) for v in self.verdicts), default=4)
        lines = [self.header()]
        for v in self.verdicts:
            msg = v.message.replace("\n", "\n" + " " * (width + 11))
            lines.append(f"  {_MARK[v.result]:<7} {v.item:<{width}}  {msg}".rstrip())
        lines.append(f"{self.tally()} in {self.seconds:.1f} s")
        return "\n".join(lines)

    __str__ = text

    def brief(self) -> str:
        """Verdicts only (no messages, no timing): deterministic, for outputs that nbval compares."""
        return "\n".join(f"{_MARK[v.result]:<7} {v.item}" for v in self.verdicts)

    def _repr_html_(self) -> str:
        colour = {PASS: "#1a7f37", FAIL: "#cf222e", MISSING: "#9a6700", SKIPPED: "#57606a"}
        rows = "".join(
            f"<tr><td><b style='color:{colour[v.result]}'>{_MARK[v.result]}</b></td>"
            f"<td style='white-space:nowrap'>{html.escape(v.item)}</td>"
            # in <pre>: JupyterLab typesets $...$ in html output as LaTeX, and MathJax skips <pre>
            f"<td style='text-align:left'><pre style='white-space:pre-wrap;margin:0;font-family:inherit'>"
            f"{html.escape(v.message)}</pre></td></tr>"
            for v in self.verdicts)
        return (f"<p><code>{html.escape(self.header())}</code>: "
                f"{self.tally()} in {self.seconds:.1f} s</p>"
                f"<table><tr><th></th><th>item</th><th style='text-align:left'>message</th></tr>{rows}</table>")

    def rows(self) -> list[dict]:
        """CSV rows for the grader: exercise, item, result, message."""
        return [{"exercise": self.exercise, "item": v.item, "result": v.result, "message": v.message}
                for v in self.verdicts]

    def to_dict(self) -> dict:
        """Everything in the report, for JSON (a check run as a Slurm job hands its report back this way)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Report":
        return cls(data["exercise"], data["path"], [Verdict(**v) for v in data["verdicts"]], data["seconds"])
