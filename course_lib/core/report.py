"""The result of a check: one verdict per step or function, shown as text, as HTML, or as CSV rows.

Every checker returns a ``Report``; the grader writes its rows, the CLI prints ``report.text()`` and
exits non-zero unless ``report.passed``, a notebook shows it as a table.
"""
from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field

PASS, FAIL, MISSING = "pass", "fail", "missing"
_MARK = {PASS: "PASS", FAIL: "FAIL", MISSING: "MISSING"}


@dataclass
class Verdict:
    item: str          # "Step 1", "ring_allreduce", "ColumnParallelLinear", ...
    result: str        # PASS, FAIL or MISSING
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

    @property
    def passed(self) -> bool:
        return bool(self.verdicts) and all(v.result == PASS for v in self.verdicts)

    def text(self) -> str:
        width = max((len(v.item) for v in self.verdicts), default=4)
        lines = [f"course check {self.exercise} {self.path}"]
        for v in self.verdicts:
            msg = v.message.replace("\n", "\n" + " " * (width + 11))
            lines.append(f"  {_MARK[v.result]:<7} {v.item:<{width}}  {msg}".rstrip())
        n_ok = sum(v.result == PASS for v in self.verdicts)
        lines.append(f"{n_ok}/{len(self.verdicts)} passed in {self.seconds:.1f} s")
        return "\n".join(lines)

    __str__ = text

    def brief(self) -> str:
        """Verdicts only (no messages, no timing): deterministic, for outputs that nbval compares."""
        return "\n".join(f"{_MARK[v.result]:<7} {v.item}" for v in self.verdicts)

    def _repr_html_(self) -> str:
        colour = {PASS: "#1a7f37", FAIL: "#cf222e", MISSING: "#9a6700"}
        rows = "".join(
            f"<tr><td><b style='color:{colour[v.result]}'>{_MARK[v.result]}</b></td><td>{html.escape(v.item)}</td>"
            f"<td style='text-align:left;white-space:pre-wrap'>{html.escape(v.message)}</td></tr>"
            for v in self.verdicts)
        n_ok = sum(v.result == PASS for v in self.verdicts)
        return (f"<p><code>course check {self.exercise} {html.escape(self.path)}</code>: "
                f"{n_ok}/{len(self.verdicts)} passed in {self.seconds:.1f} s</p>"
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
