"""Grades for other systems: Gradescope's ``results.json`` per learner (``--format gradescope``) and one CSV an LMS
imports (``--format lms``). Both come from the same rows and scores as grades.csv and scores.csv
(course_lib.grading.scores: each exercise one point, the share of its judged checks that pass; skipped checks
count for nothing).

Gradescope (its autograder specification, "Output format"): ``gradescope/<learner>/results.json`` with ``score``,
``execution_time``, ``output``, ``visibility``, ``extra_data`` and ``tests``: one test per verdict, named
"exercise: item", with its ``score``, ``max_score``, ``status``, ``output`` (the message the learner acts on) and
``visibility`` "visible"; per exercise one more test, "visibility": "hidden", that only instructors see: what the
grader found where, how long the check took, and the last lines of the check's log (tracebacks of the course's
internals, the grader's paths). ``extra_data`` holds the learner, the roster id, the maximum and the time.

LMS (``lms.csv``): a row per learner, columns id (the roster's, else the learner's name), learner, one per
exercise (points out of 1), total; blank where nothing could be judged.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from course_lib.core.atomic import atomic_writer, write_text
from course_lib.grading.feedback import file_stem, slug
from course_lib.grading.scores import SKIPPED, by_learner, item_points, table

LOG_TAIL = 2000     # characters of a check's log shown to instructors in the hidden test


def _log_tail(out: Path, learner: str, ex: str) -> str:
    try:
        text = (out / "logs" / slug(learner) / f"{ex}.log").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log: the check did not run)"
    return text[-LOG_TAIL:] or "(the check printed nothing)"


def results_json(out: Path, learner: str, own: dict[str, list[dict]], line: dict, exercises: list[str],
                 found: dict[str, str], timing: str) -> dict:
    """One learner's results.json, as a dict."""
    tests = []
    for n, ex in enumerate(e for e in exercises if e in own):
        for m, (r, (score, top)) in enumerate(zip(own[ex], item_points(own[ex]))):
            test = {"name": f"{ex}: {r['item']}", "number": f"{n + 1}.{m + 1}", "score": round(score, 4),
                    "max_score": round(top, 4), "output": r["message"] or r["result"], "visibility": "visible"}
            if r["result"] == SKIPPED:
                test["output"] = f"NOT RUN (does not count): {r['message']}"
            else:
                test["status"] = "passed" if r["result"] == "pass" else "failed"
            tests.append(test)
        details = [found.get(ex, ""), timing, "log of the check (last lines):\n" + _log_tail(out, learner, ex)]
        tests.append({"name": f"{ex}: grader details (instructors only)", "number": f"{n + 1}.0", "score": 0.0,
                      "max_score": 0.0, "output": "\n".join(d for d in details if d), "visibility": "hidden"})
    summary = ", ".join(f"{ex} {line[ex]}" for ex in exercises if line.get(ex, "") != "")
    return {"score": line["total"], "output": f"Score {line['total']} of {line['max']} ({summary}): each exercise "
                                              "is worth one point, shared by its checks.",
            "visibility": "visible", "tests": tests,
            "extra_data": {"learner": learner, "id": line["id"], "max": line["max"], "graded_at": line["graded_at"]}}


def write_gradescope(out: Path, rows: list[dict], learners: list, exercises: list[str], roster=None,
                     graded_at=None, timing=None) -> list[Path]:
    """``out/gradescope/<learner>/results.json`` for every learner with rows; the paths."""
    by = by_learner(rows)
    found = {lr.name: {ex: f.note or f.problem[1] for ex, f in lr.found.items()} for lr in learners}
    written = []
    for line in table(rows, exercises, roster, graded_at):
        name = line["learner"]
        if name not in by:
            continue
        data = results_json(out, name, by[name], line, exercises, found.get(name, {}), (timing or {}).get(name, ""))
        path = out / "gradescope" / file_stem(name) / "results.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        written.append(path)
    return written


def write_lms(path: Path, rows: list[dict], exercises: list[str], roster=None) -> None:
    """One CSV for an LMS: id, learner, a column per exercise, total."""
    with atomic_writer(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "learner", *exercises, "total"])
        for line in table(rows, exercises, roster):
            w.writerow([line["id"] or line["learner"], line["learner"], *(line[ex] for ex in exercises),
                        line["total"]])
