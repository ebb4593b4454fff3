"""The self-check's report.json and report.md, rewritten atomically before the first item and after each, so a
killed run leaves a report marked incomplete.
"""
import json
from pathlib import Path

from course_lib.core.atomic import write_text
from course_lib.selftest.runs import FAIL, NOT_POSSIBLE, NOT_RUN, PASS

STATUSES = (PASS, FAIL, NOT_POSSIBLE, NOT_RUN)
# exit codes of the check (docs/gpu-check.md)
OK, FAILED, BAD_INPUT, REQUIRED_MISSING = 0, 1, 2, 3


def exit_code(results: list[dict], required=()) -> int:
    """0: every item that could run here passed; 1: an item FAILed; 3: none failed, but an item named in
    ``required`` did not PASS (NOT POSSIBLE HERE, or NOT RUN for the budget)."""
    if any(r["status"] == FAIL for r in results):
        return FAILED
    passed = {r["name"] for r in results if r["status"] == PASS}
    return REQUIRED_MISSING if set(required) - passed else OK


def as_json(probe: dict, results: list[dict], started: str, seconds: float, *, pending=(), running: str = "",
            required=(), budget: float | None = None) -> dict:
    """The report as data. ``pending``: items not started yet; ``running``: the item under way (a report read
    while ``complete`` is false comes from a run that is still going or was killed)."""
    code = exit_code(results, required)
    return {"probe": probe, "started": started, "seconds": round(seconds, 1),
            "counts": {s: sum(r["status"] == s for r in results) for s in STATUSES},
            "complete": not pending and not running, "running": running, "pending": list(pending),
            "required": list(required), "budget_s": budget, "exit_code": code, "ok": code == OK,
            "not_possible": [r["name"] for r in results if r["status"] in (NOT_POSSIBLE, NOT_RUN)], "items": results}


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def headline(data: dict) -> str:
    c = data["counts"]
    line = f"{c[PASS]} PASS, {c[FAIL]} FAIL, {c[NOT_POSSIBLE]} NOT POSSIBLE HERE"
    return line + (f", {c[NOT_RUN]} NOT RUN (budget)" if c[NOT_RUN] else "")


def as_markdown(data: dict, machine: str) -> str:
    lines = ["# GPU self-check", "",
             f"Started {data['started']}, {data['seconds']:.0f} s. Machine: {machine}.", "",
             f"**{headline(data)}** (exit code {data['exit_code']})", ""]
    if not data["complete"]:
        lines += [f"**Incomplete**: this report was written while `{data['running'] or '?'}` ran; if the run is "
                  f"over, it was stopped there. Not started: {', '.join(data['pending']) or 'none'}.", ""]
    if data["not_possible"]:
        lines += [f"Not tested here: {', '.join(data['not_possible'])} (see why below).", ""]
    lines += ["| item | result | s | what | precision | details |", "| --- | --- | ---: | --- | --- | --- |"]
    for r in data["items"]:
        detail = r["detail"].splitlines()[0] if r["detail"] else ""
        lines.append(f"| {r['name']} | {r['status']} | {r['seconds']:.0f} | {_cell(r['what'])} | "
                     f"{_cell(r.get('precision', ''))} | {_cell(detail)} |")
    figures = [r for r in data["items"] if r["figures"]]
    if figures:
        lines += ["", "## Figures", ""]
        lines += [f"- {r['name']}: " + ", ".join(f"{k} = {v}" for k, v in r["figures"].items()) for r in figures]
    failed = [r for r in data["items"] if r["status"] == FAIL]
    if failed:
        lines += ["", "## Failures", ""]
        for r in failed:
            lines += [f"### {r['name']}", "", "```", r["detail"], "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def write(folder: Path, data: dict, machine: str) -> tuple[Path, Path]:
    """Write report.md, then report.json (whoever sees a state in report.json finds report.md at it or later)."""
    folder.mkdir(parents=True, exist_ok=True)
    js, md = folder / "report.json", folder / "report.md"
    write_text(md, as_markdown(data, machine))
    write_text(js, json.dumps(data, indent=2) + "\n")
    return js, md
