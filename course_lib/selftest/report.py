"""The self-check's report: ``report.json`` (for programs) and ``report.md`` (for people) in one folder."""
from __future__ import annotations

import json
from pathlib import Path

from course_lib.core.atomic import write_text
from course_lib.selftest.runs import FAIL, NOT_POSSIBLE, PASS

STATUSES = (PASS, FAIL, NOT_POSSIBLE)


def counts(results: list[dict]) -> dict:
    return {s: sum(r["status"] == s for r in results) for s in STATUSES}


def as_json(probe: dict, results: list[dict], started: str, seconds: float) -> dict:
    return {"probe": probe, "started": started, "seconds": round(seconds, 1), "counts": counts(results),
            "ok": not any(r["status"] == FAIL for r in results), "items": results}


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def as_markdown(data: dict, machine: str) -> str:
    c = data["counts"]
    lines = ["# GPU self-check", "",
             f"Started {data['started']}, {data['seconds']:.0f} s. Machine: {machine}.", "",
             f"**{c[PASS]} PASS, {c[FAIL]} FAIL, {c[NOT_POSSIBLE]} NOT POSSIBLE HERE**", "",
             "| item | result | s | what | details |", "| --- | --- | ---: | --- | --- |"]
    for r in data["items"]:
        detail = r["detail"].splitlines()[0] if r["detail"] else ""
        lines.append(f"| {r['name']} | {r['status']} | {r['seconds']:.0f} | {_cell(r['what'])} | {_cell(detail)} |")
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
    """Write report.json and report.md into ``folder`` (atomically: a reader never sees half a report)."""
    folder.mkdir(parents=True, exist_ok=True)
    js, md = folder / "report.json", folder / "report.md"
    write_text(js, json.dumps(data, indent=2) + "\n")
    write_text(md, as_markdown(data, machine))
    return js, md
