"""The grader's reports: ``grades.csv`` (one row per verdict) and ``grades.md`` (for people), rewritten whole.

Each write is atomic (course_lib.core.atomic): a reader, or an interrupted run, sees the old file or the new
one, never half of one. ``read_rows`` reads grades.csv back (``--resume``).
"""
from __future__ import annotations

import csv
import re
import signal
from pathlib import Path

from course_lib.core.atomic import atomic_writer
from course_lib.grading.feedback import write_feedback
from course_lib.registry import EXERCISES

COLUMNS = ["learner", "exercise", "item", "result", "message"]


def _cell(text: str) -> str:
    """Text for a Markdown table cell: one line, no column breaks, no HTML."""
    text = text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("\r", "").replace("\n", "<br>")


def md_name(text: str) -> str:
    """A learner's name as Markdown shows it (names are folder names: anything goes)."""
    return _cell(re.sub(r"([\\`*_\[\]#])", r"\\\1", text))


def summary_cell(rows: list[dict]) -> str:
    if not rows:
        return ""
    if any(r["result"] == "missing" for r in rows) and all(r["result"] != "pass" for r in rows):
        return "missing"
    ok = sum(r["result"] == "pass" for r in rows)
    return f"pass {ok}/{len(rows)}" if ok == len(rows) else f"**fail** {ok}/{len(rows)}"


def write_reports(out: Path, rows: list[dict], learners: list, exercises: list[str],
                  header: str, ignored: list[str], timing: dict) -> None:
    """Rewrite grades.csv, grades.md and feedback/ from all the rows so far (atomically: a reader never sees
    half)."""
    order = {ex: i for i, ex in enumerate(EXERCISES)}
    rows = sorted(rows, key=lambda r: (r["learner"].casefold(), r["learner"], order.get(r["exercise"], 9)))
    with atomic_writer(out / "grades.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    md = _markdown(rows, learners, exercises, header, ignored, timing)
    with atomic_writer(out / "grades.md", "w", encoding="utf-8") as f:
        f.write("\n".join(md) + "\n")
    write_feedback(out, rows, learners)


def _markdown(rows, learners, exercises, header, ignored, timing) -> list[str]:
    """The lines of grades.md: the class table, then a section per learner, then what was not graded."""
    by: dict[str, dict[str, list[dict]]] = {}
    for r in rows:
        by.setdefault(r["learner"], {}).setdefault(r["exercise"], []).append(r)
    cols = [ex for ex in EXERCISES if ex in exercises or any(ex in d for d in by.values())]
    names = sorted(by, key=lambda n: (n.casefold(), n))
    md = [header, "", "| learner | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name in names:
        md.append(f"| {md_name(name)} | " + " | ".join(summary_cell(by[name].get(ex, [])) for ex in cols)
                  + " |")
    found = {learner.name: learner for learner in learners}
    for name in names:
        md += _section(name, by[name], cols, found.get(name), timing.get(name))
    if ignored:
        md += ["", "## Not graded", ""] + [f"- {i}" for i in ignored]
    return md


def _section(name: str, rows: dict[str, list[dict]], cols: list[str], learner, extra: str | None) -> list[str]:
    """One learner's section: what was found where, then each verdict."""
    md = ["", f"## {md_name(name)}", ""]
    if learner:
        md += [f"- {ex}: {f.note or f.problem[1]}" for ex, f in learner.found.items()]
        md += [f"- {n}" for n in learner.notes]
        md.append("")
    md += ["| exercise | item | result | message |", "|---|---|---|---|"]
    for ex in cols:
        for r in rows.get(ex, []):
            result = r["result"] if r["result"] != "fail" else "**fail**"
            md.append(f"| {ex} | {_cell(r['item'])} | {result} | {_cell(r['message'])} |")
    if extra:
        md += ["", extra]
    return md


def read_rows(path: Path) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != COLUMNS:
            raise ValueError(f"{path} does not have the columns {', '.join(COLUMNS)}")
        return list(reader)


def outcome_rows(outcome, deadline: float) -> list[dict]:
    """The rows of one check: the checker's verdicts, or why there are none."""
    if outcome.verdicts:
        return list(outcome.verdicts)
    tail = outcome.last_lines()
    tail = f"\nlast lines it printed:\n{tail}" if tail else ""
    if outcome.timed_out:
        return [{"item": "deadline", "result": "fail",
                 "message": f"the check did not finish within {deadline:.0f} s and was stopped: your code "
                            "may wait forever (a recv nobody sends to, a collective not every rank calls) or "
                            f"loop{tail}"}]
    code = outcome.returncode
    how = (f"was killed by signal {signal.Signals(-code).name}" if code is not None and code < 0
           else f"ended with exit code {code}")
    oom = " (SIGKILL: perhaps the memory limit)" if code == -signal.SIGKILL else ""
    return [{"item": "check", "result": "fail", "message": f"the check {how}{oom} before giving a verdict{tail}"}]
