"""The grader's reports, each rewritten whole and atomically (a reader, or an interrupted run, sees the old file or
the new one): ``grades.csv`` (a row per verdict; ``read_rows`` reads it back for ``--resume``), ``scores.csv``
(course_lib.grading.scores), ``grades.md``, feedback/ and the exports ``--format`` asks for: Gradescope's
results.json per learner and ``lms.csv`` (docs/grading.md, "Exports", gives both formats).
"""
import csv
import json
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.core.atomic import atomic_writer, write_text
from course_lib.grading.causes import DEADLINE, annotate, explain, limits_hit
from course_lib.grading.feedback import file_stem, no_math, slug, write_feedback
from course_lib.grading.scores import SKIPPED, by_learner, item_points, table, tally, write_scores
from course_lib.registry import EXERCISES

COLUMNS = ["learner", "exercise", "item", "result", "message"]
FORMATS = ("gradescope", "lms")
LOG_TAIL = 2000     # characters of a check's log shown to instructors in the hidden test


@dataclass
class Outputs:
    """What goes beside grades.csv and grades.md: the exports asked for, the roster, when each learner was graded."""
    formats: tuple[str, ...] = ()
    roster: dict[str, str] | None = None
    graded_at: dict[str, str] = field(default_factory=dict)


def _cell(text: str) -> str:
    """Text for a Markdown table cell: one line, no column breaks, no HTML."""
    text = no_math(text).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("\r", "").replace("\n", "<br>")


def md_name(text: str) -> str:
    """A learner's name as Markdown shows it (names are folder names: anything goes)."""
    return _cell(re.sub(r"([\\`*_\[\]#])", r"\\\1", text))


def summary_cell(rows: list[dict]) -> str:
    """An exercise's cell in the class table: skipped checks (NOT RUN) are named, not counted."""
    if not rows:
        return ""
    if any(r["result"] == "missing" for r in rows) and all(r["result"] != "pass" for r in rows):
        return "missing"
    ok, n, skipped = tally(rows)
    if not n:
        return f"not run {len(rows)}"
    return (f"pass {ok}/{n}" if ok == n else f"**fail** {ok}/{n}") + (f", {skipped} not run" if skipped else "")


def write_reports(out: Path, rows: list[dict], learners: list, exercises: list[str],
                  header: str, ignored: list[str], timing: dict, outputs: Outputs | None = None) -> None:
    """Rewrite grades.csv, scores.csv, grades.md, feedback/ and the exports from all the rows so far."""
    outputs = outputs or Outputs()
    order = {ex: i for i, ex in enumerate(EXERCISES)}
    rows = sorted(rows, key=lambda r: (r["learner"].casefold(), r["learner"], order.get(r["exercise"], 9)))
    with atomic_writer(out / "grades.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    cols = [ex for ex in EXERCISES if ex in exercises or any(r["exercise"] == ex for r in rows)]
    with atomic_writer(out / "grades.md", "w", encoding="utf-8") as f:
        f.write("\n".join(_markdown(rows, learners, cols, header, ignored, timing)) + "\n")
    write_feedback(out, rows, learners)
    write_scores(out / "scores.csv", rows, cols, outputs.roster, outputs.graded_at)
    if "gradescope" in outputs.formats:
        write_gradescope(out, rows, learners, cols, outputs.roster, outputs.graded_at, timing)
    if "lms" in outputs.formats:
        write_lms(out / "lms.csv", rows, cols, outputs.roster)


def _markdown(rows, learners, cols, header, ignored, timing) -> list[str]:
    """The lines of grades.md: the class table, then a section per learner, then what was not graded."""
    by = by_learner(rows)
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
        md += [f"- {n}" for n in learner.found_notes()] + [""]
    md += ["| exercise | item | result | message |", "|---|---|---|---|"]
    for ex in cols:
        for r in rows.get(ex, []):
            result = {"fail": "**fail**", "skipped": "not run"}.get(r["result"], r["result"])
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


def fold_general(rows: list[dict], exercise: str) -> list[dict]:
    """An exercise with declared items (a cases module's ITEMS) is scored on them: where an item failed, a failing
    row of the check as a whole ("check run": a launch the limits broke) goes into each failing item's message
    instead of counting as one item more. So the count does not depend on the isolation in force (a fork bomb
    was 0/4 where RLIMIT_NPROC stops it, which also broke the one-rank run, and 0/3 under a cgroup's pids limit)."""
    ex = EXERCISES.get(exercise)
    declared = tuple(getattr(ex.cases_module(), "ITEMS", ())) if ex is not None and ex.cases else ()
    items = set(declared)
    general = [r for r in rows if r["item"] not in items and r["result"] == "fail"]
    failed = [r for r in rows if r["item"] in items and r["result"] == "fail"]
    if items and [r["item"] for r in rows] == ["check"] and general:
        # the check died before any verdict (a fork bomb can take the sandbox's worker down with it, or only
        # break a launch: it depends on timing): each item fails with why, as when a launch broke
        return [{"item": i, "result": "fail", "message": general[0]["message"]} for i in declared]
    if not items or not general or not failed:
        return rows
    also = "\n".join(f"(the check as a whole: {r['item']}: {r['message'].strip().splitlines()[-1]})" for r in general)
    return [{**r, "message": f"{r['message']}\n{also}"} if r in failed else r for r in rows if r not in general]


def outcome_rows(outcome, limits) -> list[dict]:
    """The rows of one check: the checker's verdicts, or why there are none; a limit that stopped it is named
    (course_lib.grading.causes)."""
    if outcome.verdicts:
        return annotate(list(outcome.verdicts), outcome, limits)
    tail = outcome.last_lines()
    tail = f"\nlast lines it printed:\n{tail}" if tail else ""
    hit = [explain(h, limits) for h in limits_hit(outcome) if h != DEADLINE]
    if outcome.timed_out:
        return [{"item": "deadline", "result": "fail", "message": "\n".join(hit + [explain(DEADLINE, limits)]) + tail}]
    code = outcome.returncode
    how = (f"was killed by signal {signal.Signals(-code).name}" if code is not None and code < 0
           else f"ended with exit code {code}")
    if hit:
        return [{"item": "check", "result": "fail", "message": "\n".join(hit) + f"\n(the check {how})"}]
    return [{"item": "check", "result": "fail", "message": f"the check {how} before giving a verdict{tail}"}]


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


def write_gradescope(out: Path, rows: list[dict], learners: list, exercises: list[str], roster, graded_at,
                     timing: dict) -> None:
    """``out/gradescope/<learner>/results.json`` for every learner with rows."""
    by = by_learner(rows)
    found = {lr.name: {ex: f.note or f.problem[1] for ex, f in lr.found.items()} for lr in learners}
    for line in table(rows, exercises, roster, graded_at):
        name = line["learner"]
        if name in by:
            data = results_json(out, name, by[name], line, exercises, found.get(name, {}), timing.get(name, ""))
            path = out / "gradescope" / file_stem(name) / "results.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text(path, json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def write_lms(path: Path, rows: list[dict], exercises: list[str], roster) -> None:
    """One CSV for an LMS: id, learner, a column per exercise, total."""
    with atomic_writer(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "learner", *exercises, "total"])
        for line in table(rows, exercises, roster):
            w.writerow([line["id"] or line["learner"], line["learner"], *(line[ex] for ex in exercises),
                        line["total"]])
