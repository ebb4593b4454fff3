"""Feedback to hand back: ``feedback/<learner>.md`` and ``.html``, one learner's rows and nothing of anyone else's:
what was found, each verdict with its message (the hints: they say what to fix), and how to check again. Files are
selected by exact name from the rows, never by prefix, so ``ann`` never sees ``anna``'s rows.
"""
import hashlib
import html
import re
from pathlib import Path

from course_lib.core.atomic import write_text
from course_lib.grading.scores import by_learner, tally
from course_lib.registry import EXERCISES

PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+-]{0,60}")


def slug(name: str) -> str:
    """A cleaned name plus a hash of the name: distinct for distinct names, safe as a folder (the logs' folders)."""
    safe = re.sub(r"[^\w.-]+", "_", name).strip("._-")[:40] or "learner"
    return f"{safe}-{hashlib.sha1(name.encode('utf-8', 'surrogateescape')).hexdigest()[:6]}"


def file_stem(name: str) -> str:
    """The learner's name as a file name: itself when it is a plain one, else its ``slug``."""
    if PLAIN.fullmatch(name) and not name.endswith("."):
        return name
    return slug(name)


def no_math(text: str) -> str:
    """Markdown text with each ``$`` escaped: JupyterLab (and GitHub) read ``$...$`` as LaTeX, which garbles a hint
    such as ``MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)``."""
    return re.sub(r"(?<!\\)\$", r"\\$", text)


SHOWN = {"skipped": "NOT RUN"}    # a skipped check could not be established where grading ran: it does not count


def _summary(rows: list[dict]) -> str:
    ok, n, skipped = tally(rows)
    skipped = f" ({skipped} not run, not counted)" if skipped else ""
    if not n:
        return "no check could be run here" + skipped
    if ok == n:
        return f"all {ok} checks pass" + skipped
    if all(r["result"] == "missing" for r in rows):
        return "not handed in"
    return f"{ok} of {n} checks pass" + skipped


def _again(ex: str) -> str:
    e = EXERCISES.get(ex)
    if e is None:
        return ""
    return f"Check again before handing in: `course check {ex} exercises/{e.file}` (notebook {e.notebook})."


def markdown(name: str, own: dict[str, list[dict]], found_notes: list[str]) -> str:
    md = [f"# Feedback for {name}", ""]
    if found_notes:
        md += ["What the grader found:", ""] + [f"- {n}" for n in found_notes] + [""]
    for ex, rows in own.items():
        md += [f"## {ex}: {_summary(rows)}", ""]
        for r in rows:
            message = no_math(r["message"]).replace("\n", "\n  ")
            md.append(f"- **{SHOWN.get(r['result'], r['result'])}** {r['item']}" + (f": {message}" if message else ""))
        md += ["", _again(ex), ""]
    return "\n".join(md).rstrip() + "\n"


def to_html(name: str, own: dict[str, list[dict]], found_notes: list[str]) -> str:
    e = html.escape
    colour = {"pass": "#1a7f37", "fail": "#cf222e", "missing": "#9a6700", "skipped": "#57606a"}
    parts = [f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>Feedback for {e(name)}</title></head>",
             f"<body style='font-family:sans-serif;max-width:60em'><h1>Feedback for {e(name)}</h1>"]
    if found_notes:
        parts.append("<p>What the grader found:</p><ul>" + "".join(f"<li>{e(n)}</li>" for n in found_notes)
                     + "</ul>")
    for ex, rows in own.items():
        parts.append(f"<h2>{e(ex)}: {e(_summary(rows))}</h2><table border='1' cellpadding='4'>"
                     "<tr><th>item</th><th>result</th><th>message</th></tr>")
        for r in rows:
            parts.append(f"<tr><td>{e(r['item'])}</td><td style='color:{colour.get(r['result'], '#000')}'>"
                         f"<b>{e(SHOWN.get(r['result'], r['result']))}</b></td>"
                         "<td><pre style='white-space:pre-wrap;margin:0'>"
                         f"{e(r['message'])}</pre></td></tr>")
        parts.append(f"</table><p>{e(_again(ex)).replace('`', '')}</p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_feedback(out: Path, rows: list[dict], learners: list) -> None:
    """Write ``out/feedback/<learner>.md`` and ``.html`` for every learner that has rows."""
    folder = out / "feedback"
    folder.mkdir(parents=True, exist_ok=True)
    notes = {lr.name: lr.found_notes() for lr in learners}
    for name, own in sorted(by_learner(rows).items()):
        stem = file_stem(name)
        write_text(folder / f"{stem}.md", markdown(name, own, notes.get(name, [])))
        write_text(folder / f"{stem}.html", to_html(name, own, notes.get(name, [])))
