"""Scores from the verdicts: per exercise, per learner, and ``scores.csv`` (a row per learner). Each exercise is
worth one point, the share of its judged checks that pass: a ``skipped`` one neither costs nor earns
(docs/grading.md, "Which exercises, and the scores").
"""
import csv
from pathlib import Path

from course_lib.core.atomic import atomic_writer

PASS, SKIPPED = "pass", "skipped"


def judged(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["result"] != SKIPPED]


def tally(rows: list[dict]) -> tuple[int, int, int]:
    """(checks that pass, checks judged, checks skipped) of some rows."""
    counted = judged(rows)
    return sum(r["result"] == PASS for r in counted), len(counted), len(rows) - len(counted)


def exercise_score(rows: list[dict]) -> float | None:
    """One exercise's rows -> share of the judged checks that pass (None: nothing could be judged)."""
    ok, n, _ = tally(rows)
    return ok / n if n else None


def item_points(rows: list[dict]) -> list[tuple[float, float]]:
    """(score, max) of each row of one exercise: judged checks share its one point, a skipped one is worth 0."""
    n = len(judged(rows))
    return [(0.0, 0.0) if r["result"] == SKIPPED else ((1.0 if r["result"] == PASS else 0.0) / n, 1.0 / n)
            for r in rows]


def by_learner(rows: list[dict]) -> dict[str, dict[str, list[dict]]]:
    out: dict[str, dict[str, list[dict]]] = {}
    for r in rows:
        out.setdefault(r["learner"], {}).setdefault(r["exercise"], []).append(r)
    return out


class RosterError(ValueError):
    pass


def read_roster(path: Path) -> dict[str, str]:
    """``--roster CSV``: columns ``learner`` (the name of the learner's entry in SUBMISSIONS_DIR) and ``id`` (what
    the LMS or Gradescope knows them by: a student number, an e-mail); other columns are ignored."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f)
            if not {"learner", "id"} <= set(reader.fieldnames or ()):
                raise RosterError(f"--roster {path}: needs the columns learner and id (it has "
                                  f"{', '.join(reader.fieldnames or ()) or 'none'})")
            pairs = [(r["learner"], (r["id"] or "").strip()) for r in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise RosterError(f"--roster {path}: {e}") from None
    names = [n for n, _ in pairs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise RosterError(f"--roster {path}: learners listed twice: {', '.join(twice)}")
    return dict(pairs)


def table(rows: list[dict], exercises: list[str], roster: dict[str, str] | None = None,
          graded_at: dict[str, str] | None = None) -> list[dict]:
    """One dict per learner (those with rows, then those of the roster without any): the columns of scores.csv."""
    by = by_learner(rows)
    roster, graded_at = roster or {}, graded_at or {}
    names = sorted(by, key=lambda n: (n.casefold(), n)) + sorted(n for n in roster if n not in by)
    out = []
    for name in names:
        own = by.get(name, {})
        line = {"learner": name, "id": roster.get(name, ""), "graded_at": graded_at.get(name, "")}
        total = top = 0.0
        for ex in exercises:
            score = exercise_score(own[ex]) if ex in own else (0.0 if name not in by else None)
            line[ex] = "" if score is None else round(score, 4)
            if score is not None:
                total, top = total + score, top + 1
        line.update(total=round(total, 4), max=int(top))
        out.append(line)
    return out


def write_scores(path: Path, rows: list[dict], exercises: list[str], roster, graded_at) -> None:
    with atomic_writer(path, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["learner", "id", *exercises, "total", "max", "graded_at"])
        w.writeheader()
        w.writerows(table(rows, exercises, roster, graded_at))


def read_graded_at(path: Path) -> dict[str, str]:
    """learner -> graded_at from an earlier scores.csv (``--resume`` keeps the time each learner was graded)."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return {r["learner"]: r.get("graded_at", "") for r in csv.DictReader(f) if r.get("graded_at")}
    except (OSError, KeyError, csv.Error):
        return {}
