"""Grade a class: ``course grade SUBMISSIONS_DIR`` runs the checkers on every learner's exercise folder.

Each entry of SUBMISSIONS_DIR is one learner: a copy of exercises/ (complete or not), a zip of one, or a
single exercise file. For each learner and exercise the checker runs on a temporary copy, in a sandbox
(course_lib.grading_sandbox: deadline, bounded output, process limits, everything killed afterwards);
the submissions are only read. Results go to ``--out``:
- ``grades.csv``: learner, exercise, item, result (pass, fail or missing), message; one row per verdict, and
  a ``missing`` row for an exercise that was not handed in;
- ``grades.md``: one table for the class, then one section per learner with what was found and the messages;
- ``logs/``: what each check printed (its first and last KB).
Both files are rewritten as each learner finishes, so an interrupted run loses nothing; ``--resume`` skips
what is in grades.csv. Exit code 0 when grading ran (learners' failures are results), 2 when it could not.
"""
from __future__ import annotations

import csv
import hashlib
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import zipfile
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

# exercise -> its file in exercises/ (DESIGN.md); the order is the order of the course
FILES = {"ddp": "02_ddp/mnist_classify_ddp.py", "allreduce": "05_allreduce/allreduce.py",
         "tp": "06_tensor_parallel/tp.py"}
COLUMNS = ["learner", "exercise", "item", "result", "message"]
JUNK = {"__MACOSX", ".DS_Store", "Thumbs.db", "desktop.ini", ".git", ".ipynb_checkpoints", "__pycache__"}
MAX_FILE = 1 << 20            # an exercise file is a few KB; a bigger one is not graded
MAX_WALK = 5000               # entries looked at in one learner's folder
MAX_DEPTH = 6
MAX_UNZIP = 50 << 20          # bytes unpacked from one learner's zip


@dataclass
class Found:
    """What was found for one exercise of one learner."""
    path: Path | None = None   # the file to grade
    seen: Path | None = None   # the file that was found (also when it cannot be graded)
    note: str = ""             # where it was found and how
    problem: tuple[str, str] | None = None   # (result, message) when there is nothing to run


@dataclass
class Learner:
    name: str
    entry: str                             # what SUBMISSIONS_DIR held: "folder", "zip", "file", "symlink"
    source: str = ""                       # its name in SUBMISSIONS_DIR
    found: dict[str, Found] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- what the learner handed in

def precheck(path: Path) -> str | None:
    """Why ``path`` cannot be run as a Python exercise file (None: it can)."""
    size = path.stat().st_size
    if size > MAX_FILE:
        return f"the file is {size / 2**20:.1f} MB; an exercise file is a few KB: hand in the .py file itself"
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not a Python text file (byte {e.start} is not UTF-8): hand in the .py file itself"
    if text.lstrip().startswith("{") and '"cells"' in text:
        return "this is a notebook (.ipynb JSON), not a Python file: File > Save and Export as > Executable Script"
    try:
        compile(text, str(path.name), "exec", dont_inherit=True)
    except SyntaxError as e:
        return f"not valid Python: line {e.lineno}: {e.msg}" + (f"\n    {e.text.strip()}" if e.text else "")
    except (ValueError, RecursionError, MemoryError) as e:
        return f"not valid Python: {type(e).__name__}: {e}"
    return None


def _walk(folder: Path) -> list[tuple[PurePosixPath, Path]]:
    """(path relative to folder, path) of the files under ``folder``; symlinks to folders are not followed."""
    files, seen = [], 0
    for top, dirs, names in os.walk(folder, followlinks=False):
        rel_top = Path(top).relative_to(folder)
        dirs[:] = sorted(d for d in dirs if d not in JUNK) if len(rel_top.parts) < MAX_DEPTH else []
        for name in sorted(names):
            seen += 1
            if seen > MAX_WALK:
                return files
            if name not in JUNK:
                files.append((PurePosixPath(*rel_top.parts, name), Path(top) / name))
    return files


def _same_file_name(name: str, wanted: str) -> bool:
    """allreduce.py, Allreduce.py, 'allreduce (1).py', allreduce-2.py: what browsers and learners produce."""
    stem = re.escape(PurePosixPath(wanted).stem)
    return re.fullmatch(rf"{stem}(\s*\(\d+\)|[-_ ]?\d+|[-_ ]?copy)?\.py", name, re.I) is not None


def locate(folder: Path, exercise: str, files=None) -> Found:
    """Find the file of ``exercise`` in a learner's folder (see README: where files may be)."""
    wanted = PurePosixPath(FILES[exercise])
    files = _walk(folder) if files is None else files
    ranked = []
    for rel, path in files:
        if rel == wanted:
            ranked.append((0, rel, path, "at its place"))
        elif rel.parts[-len(wanted.parts):] == wanted.parts:
            ranked.append((1, rel, path, "in a sub-folder"))
        elif _same_file_name(rel.name, wanted.name):
            ranked.append((2, rel, path, f"outside {wanted.parent}/" if rel.name == wanted.name
                           else f"under another name (expected {wanted.name})"))
    if not ranked:
        near = [str(rel) for rel, _ in files if rel.stem.lower() == wanted.stem.lower()]
        hint = f"; found {', '.join(near[:3])}, which is not a .py file" if near else ""
        return Found(problem=("missing", f"not handed in: no {wanted} in the folder{hint}"))
    ranked.sort(key=lambda r: (r[0], len(r[1].parts), str(r[1])))
    _, rel, path, how = ranked[0]
    note = f"`{rel}`" + ("" if how == "at its place" else f" ({how})")
    if len(ranked) > 1:
        note += "; also there, not graded: " + ", ".join(f"`{r[1]}`" for r in ranked[1:4])
    return _usable(Found(path=path, seen=path, note=note), folder, rel)


def _usable(found: Found, folder: Path, rel) -> Found:
    """Refuse symlinks that leave the learner's folder and files that are not Python."""
    path = found.path
    if path.is_symlink():
        target = Path(os.path.realpath(path))
        if not target.is_relative_to(Path(os.path.realpath(folder))) or not target.is_file():
            found.problem = ("fail", f"{rel} is a symbolic link to {os.readlink(path)}, outside your folder; "
                                     "it is not followed: hand in the file itself")
            found.path = None
            return found
        found.path = target
    elif not path.is_file():
        found.problem = ("fail", f"{rel} is not a regular file")
        found.path = None
        return found
    why = precheck(found.path)
    if why:
        found.problem = ("fail", why)
        found.path = None
    return found


def _guess_exercise(path: Path) -> tuple[str | None, str]:
    """Which exercise a lone file is: by its name, else by what it defines."""
    name = path.name.lower()
    tokens = set(re.split(r"[^a-z0-9]+", path.stem.lower()))
    if "allreduce" in name:
        return "allreduce", "its name"
    if "ddp" in tokens or "mnist" in name:
        return "ddp", "its name"
    if "tp" in tokens or "tensor" in name:
        return "tp", "its name"
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_FILE).decode("utf-8", "replace")
    except OSError:
        return None, ""
    for exercise, marker in (("allreduce", r"def\s+ring_allreduce"), ("tp", r"class\s+ColumnParallelLinear"),
                             ("ddp", r"DistributedDataParallel|def\s+train\s*\(")):
        if re.search(marker, text):
            return exercise, "what it defines"
    return None, ""


def _unzip(archive: Path, dest: Path) -> str | None:
    """Unpack a learner's zip safely into ``dest``; returns why not, or None."""
    try:
        with zipfile.ZipFile(archive) as z:
            members = [m for m in z.infolist() if not m.is_dir()]
            if len(members) > MAX_WALK or sum(m.file_size for m in members) > MAX_UNZIP:
                return f"{archive.name} is too big to unpack ({len(members)} files)"
            for m in members:
                rel = PurePosixPath(m.filename)
                if rel.is_absolute() or ".." in rel.parts or (m.external_attr >> 16) & 0o170000 == 0o120000:
                    continue        # absolute paths, escapes and symbolic links are skipped
                target = dest.joinpath(*rel.parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                with z.open(m) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
    except (zipfile.BadZipFile, OSError, RuntimeError, ValueError, NotImplementedError) as e:
        return f"{archive.name} could not be unpacked: {e}"
    return None


def discover(submissions: Path, exercises: list[str], scratch: Path, skip: set[Path] = frozenset()):
    """The learners in SUBMISSIONS_DIR, each with what was found for each exercise."""
    learners: list[Learner] = []
    ignored: list[str] = []
    root = Path(os.path.realpath(submissions))
    for n, entry in enumerate(sorted(submissions.iterdir(), key=lambda p: p.name.casefold())):
        # a name that is not valid UTF-8 (an old zip tool's) is shown with replacement characters
        name = entry.name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        if name in JUNK or Path(os.path.realpath(entry)) in skip:
            ignored.append(f"`{name}` (not a submission)")
            continue
        if entry.is_symlink():
            target = Path(os.path.realpath(entry))
            if not target.is_relative_to(root) or target == root:
                learner = Learner(name, "symlink", name)
                msg = (f"`{name}` is a symbolic link to {os.readlink(entry)}, outside SUBMISSIONS_DIR; "
                       "it is not followed: copy the work into the folder instead")
                learner.notes.append(msg)
                learner.found = {ex: Found(problem=("fail", msg.replace("`", ""))) for ex in exercises}
                learners.append(learner)
                continue
        if entry.is_dir():
            learners.append(_folder_learner(name, entry, "folder", exercises, name))
        elif entry.is_file() and entry.suffix.lower() == ".zip":
            dest = scratch / f"zip-{n}"
            dest.mkdir(parents=True)
            why = _unzip(entry, dest)
            if why:
                learner = Learner(Path(name).stem, "zip", name, notes=[why])
                learner.found = {ex: Found(problem=("fail", why)) for ex in exercises}
            else:
                learner = _folder_learner(Path(name).stem, dest, "zip", exercises, name)
                learner.notes.insert(0, f"unpacked from `{name}`")
            learners.append(learner)
        elif entry.is_file():
            learners.append(_file_learner(entry, exercises, name))
        else:
            ignored.append(f"`{name}` (not a file or folder)")
    return _unique(learners), ignored


def _unique(learners: list[Learner]) -> list[Learner]:
    """A lone file or zip named like a folder (bob/ and bob.zip) keeps its full name: names are the key."""
    names = [l.name for l in learners]
    for l in learners:
        if names.count(l.name) > 1 and l.source != l.name:
            l.name = l.source
    return learners


def _folder_learner(name: str, folder: Path, kind: str, exercises: list[str], source: str) -> Learner:
    learner = Learner(name, kind, source)
    files = _walk(folder)
    for ex in exercises:
        learner.found[ex] = locate(folder, ex, files)
    used = {f.seen for f in learner.found.values() if f.seen}
    others = [str(rel) for rel, p in files if p not in used and rel.suffix != ".pyc"]
    if not files:
        learner.notes.append("the folder is empty")
    elif others:
        more = f" and {len(others) - 8} more" if len(others) > 8 else ""
        learner.notes.append(f"{len(others)} other file(s), not graded: "
                             + ", ".join(f"`{o}`" for o in others[:8]) + more)
    return learner


def _file_learner(path: Path, exercises: list[str], name: str) -> Learner:
    learner = Learner(Path(name).stem, "file", name)
    exercise, how = _guess_exercise(path)
    where = f"a single file `{path.name}` at the top of SUBMISSIONS_DIR"
    if exercise is None:
        learner.notes.append(f"{where}: which exercise it is could not be told (name it after the exercise "
                             "file, e.g. allreduce.py, or put it in a folder like exercises/)")
    else:
        learner.notes.append(f"{where}, graded as {exercise} (by {how})")
    for ex in exercises:
        if ex == exercise:
            learner.found[ex] = _usable(Found(path=path, seen=path, note=f"`{path.name}` (a single file)"),
                                        path.parent, path.name)
        else:
            learner.found[ex] = Found(problem=("missing", f"not handed in (only the single file {path.name})"))
    return learner


# ---------------------------------------------------------------- reports

def _cell(text: str) -> str:
    """Text for a Markdown table cell: one line, no column breaks, no HTML."""
    text = text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("\r", "").replace("\n", "<br>")


def _md_name(text: str) -> str:
    """A learner's name as Markdown shows it (names are folder names: anything goes)."""
    return _cell(re.sub(r"([\\`*_\[\]#])", r"\\\1", text))


def summary_cell(rows: list[dict]) -> str:
    if not rows:
        return ""
    if any(r["result"] == "missing" for r in rows) and all(r["result"] != "pass" for r in rows):
        return "missing"
    ok = sum(r["result"] == "pass" for r in rows)
    return f"pass {ok}/{len(rows)}" if ok == len(rows) else f"**fail** {ok}/{len(rows)}"


def write_reports(out: Path, rows: list[dict], learners: list[Learner], exercises: list[str],
                  header: str, ignored: list[str], timing: dict) -> None:
    """Rewrite grades.csv and grades.md from all the rows so far (atomically: a reader never sees half)."""
    order = {ex: i for i, ex in enumerate(FILES)}
    rows = sorted(rows, key=lambda r: (r["learner"].casefold(), r["learner"], order.get(r["exercise"], 9)))
    _atomic(out / "grades.csv", lambda f: _csv(f, rows), newline="")
    by = {}
    for r in rows:
        by.setdefault(r["learner"], {}).setdefault(r["exercise"], []).append(r)
    cols = [ex for ex in FILES if ex in exercises or any(ex in d for d in by.values())]
    md = [header, "", "| learner | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name in sorted(by, key=lambda n: (n.casefold(), n)):
        md.append(f"| {_md_name(name)} | " + " | ".join(summary_cell(by[name].get(ex, [])) for ex in cols)
                  + " |")
    notes = {l.name: l for l in learners}
    for name in sorted(by, key=lambda n: (n.casefold(), n)):
        md += ["", f"## {_md_name(name)}", ""]
        learner = notes.get(name)
        if learner:
            md += [f"- {ex}: {f.note or f.problem[1]}" for ex, f in learner.found.items()]
            md += [f"- {n}" for n in learner.notes]
            md.append("")
        md += ["| exercise | item | result | message |", "|---|---|---|---|"]
        for ex in cols:
            for r in by[name].get(ex, []):
                result = r["result"] if r["result"] != "fail" else "**fail**"
                md.append(f"| {ex} | {_cell(r['item'])} | {result} | {_cell(r['message'])} |")
        extra = timing.get(name)
        if extra:
            md += ["", extra]
    if ignored:
        md += ["", "## Not graded", ""] + [f"- {i}" for i in ignored]
    _atomic(out / "grades.md", lambda f: f.write("\n".join(md) + "\n"))


def _csv(f, rows):
    w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)


def _atomic(path: Path, write, **kw) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", **kw) as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_rows(path: Path) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != COLUMNS:
            raise ValueError(f"{path} does not have the columns {', '.join(COLUMNS)}")
        return list(reader)


# ---------------------------------------------------------------- grading one check

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


def _slug(name: str) -> str:
    safe = re.sub(r"[^\w.-]+", "_", name).strip("._-")[:40] or "learner"
    return f"{safe}-{hashlib.sha1(name.encode('utf-8', 'surrogateescape')).hexdigest()[:6]}"


# ---------------------------------------------------------------- the command

def add_arguments(p):
    p.add_argument("submissions", type=Path, metavar="SUBMISSIONS_DIR",
                   help="a folder with one entry per learner: a copy of exercises/, a zip of one, or a single file")
    p.add_argument("--out", type=Path, default=None,
                   help="where grades.csv, grades.md and logs/ go (default: grades/<name of SUBMISSIONS_DIR>)")
    p.add_argument("--exercise", action="append", choices=list(FILES), metavar="EX",
                   help=f"grade only this exercise ({', '.join(FILES)}); repeat for more; default: all")
    p.add_argument("--jobs", "-j", type=int, default=1, help="checks run at the same time (default 1)")
    p.add_argument("--timeout", type=float, default=600, help="deadline in seconds for one check (default 600)")
    p.add_argument("--run-timeout", type=float, default=None,
                   help="deadline passed to the checker for each multi-process run (default: the checker's)")
    p.add_argument("--max-processes", type=int, default=512, help="processes and threads one check may have")
    p.add_argument("--memory-mb", type=int, default=4096, help="memory of one check (where cgroups are usable)")
    p.add_argument("--resume", action="store_true", help="keep grades.csv in --out and grade only what is not there")


def run(args) -> int:
    from course_lib.grading_sandbox import Limits

    subs: Path = args.submissions
    if not subs.is_dir():
        print(f"grade: {subs} is not a folder (give the folder that holds one folder per learner)", file=sys.stderr)
        return 2
    exercises = [ex for ex in FILES if ex in (args.exercise or FILES)]
    out: Path = args.out or Path("grades") / (subs.resolve().name or "class")
    if Path(os.path.realpath(out)).is_relative_to(Path(os.path.realpath(subs))):
        print(f"grade: --out {out} is inside SUBMISSIONS_DIR, which grading never writes into", file=sys.stderr)
        return 2
    if args.jobs < 1 or args.timeout <= 0:
        print("grade: --jobs must be 1 or more and --timeout positive", file=sys.stderr)
        return 2
    csv_path = out / "grades.csv"
    done_rows: list[dict] = []
    if csv_path.exists():
        if not args.resume:
            print(f"grade: {csv_path} exists from an earlier run: --resume continues it, or choose another --out",
                  file=sys.stderr)
            return 2
        try:
            done_rows = read_rows(csv_path)
        except (OSError, ValueError) as e:
            print(f"grade: cannot resume: {e}", file=sys.stderr)
            return 2
    try:
        (out / "logs").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"grade: cannot write to {out}: {e}", file=sys.stderr)
        return 2
    limits = Limits(deadline=args.timeout, run_timeout=args.run_timeout, max_processes=args.max_processes,
                    memory_mb=args.memory_mb)
    with tempfile.TemporaryDirectory(prefix="course-grade-") as scratch:
        return _grade(subs, out, exercises, limits, args.jobs, done_rows, Path(scratch))


def _grade(subs, out, exercises, limits, jobs, done_rows, scratch) -> int:
    from course_lib.grading_sandbox import run_check

    learners, ignored = discover(subs, exercises, scratch)
    done = {(r["learner"], r["exercise"]) for r in done_rows}
    rows = list(done_rows)
    timing: dict[str, str] = {}
    header = (f"# Grades of `{subs}`\n\n{len(learners)} learners; exercises: {', '.join(exercises)}; "
              f"deadline {limits.deadline:.0f} s per check. Results: pass, **fail**, missing (not handed in).")
    lock = threading.Lock()
    kills: dict[int, object] = {}
    todo = [(l, ex) for l in learners for ex in exercises if (l.name, ex) not in done]
    pending = {l.name: sum(1 for t in todo if t[0] is l) for l in learners}
    seconds: dict[str, list[str]] = {}

    stopping = threading.Event()
    errors: list[str] = []

    def started(n, kill):
        kills[n] = kill
        if stopping.is_set():     # Ctrl-C came while this check was starting
            kill()

    def task(n, learner, ex):
        found = learner.found[ex]
        if found.problem:
            return learner, ex, [{"item": "file", "result": found.problem[0], "message": found.problem[1]}], None
        if stopping.is_set():
            return None
        try:
            outcome = run_check(ex, found.path, FILES[ex], limits, on_start=lambda k: started(n, k))
        except OSError as e:       # the grader's own trouble (disk full, no /tmp): say so, go on
            errors.append(f"{learner.name} / {ex}: {e}")
            return learner, ex, [{"item": "grader", "result": "fail",
                                  "message": f"the grader could not run this check: {e}"}], None
        kills.pop(n, None)
        log = out / "logs" / _slug(learner.name) / f"{ex}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(outcome.output, encoding="utf-8", errors="replace")
        return learner, ex, outcome_rows(outcome, limits.deadline), outcome

    def finished(learner, ex, new_rows, outcome):
        with lock:
            rows.extend({"learner": learner.name, "exercise": ex, **r} for r in new_rows)
            if outcome is not None:
                extra = f"{ex} {outcome.seconds:.1f} s"
                if outcome.output_bytes > 1 << 20:
                    extra += f", printed {outcome.output_bytes / 2**20:.1f} MB (log keeps its first and last KB)"
                if outcome.leftovers:
                    extra += f", {outcome.leftovers} process(es) left running were killed"
                seconds.setdefault(learner.name, []).append(extra)
            pending[learner.name] -= 1
            n_ok = sum(r["result"] == "pass" for r in new_rows)
            took = f" in {outcome.seconds:.1f} s" if outcome else ""
            print(f"  {learner.name} / {ex}: {n_ok}/{len(new_rows)} passed{took}", flush=True)
            if pending[learner.name] == 0:
                if learner.name in seconds:
                    timing[learner.name] = "Check times: " + "; ".join(seconds[learner.name]) + "."
                write_reports(out, rows, learners, exercises, header, ignored, timing)

    print(f"grading {len(learners)} learners x {len(exercises)} exercises in {subs} "
          f"({len(todo)} checks to run, {len(done)} already in {out / 'grades.csv'}), {jobs} at a time", flush=True)
    write_reports(out, rows, learners, exercises, header, ignored, timing)
    start = time.monotonic()
    pool = ThreadPoolExecutor(max_workers=jobs)
    futures = {pool.submit(task, n, l, ex) for n, (l, ex) in enumerate(todo)}
    old = signal.signal(signal.SIGTERM, _raise_interrupt) if threading.current_thread() is threading.main_thread() else None
    try:
        while futures:
            ready, futures = wait(futures, timeout=0.5, return_when=FIRST_COMPLETED)
            for f in ready:
                if f.result() is not None:
                    finished(*f.result())
    except KeyboardInterrupt:
        stopping.set()
        for f in futures:
            f.cancel()
        for kill in list(kills.values()):
            kill()
        pool.shutdown(wait=True, cancel_futures=True)
        print(f"interrupted: the learners graded so far are in {out}; --resume continues", file=sys.stderr)
        return 130
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    write_reports(out, rows, learners, exercises, header, ignored, timing)
    print(f"graded in {time.monotonic() - start:.1f} s: {out / 'grades.csv'}, {out / 'grades.md'}")
    if errors:
        print("grade: some checks could not run (rows 'grader' in the report):\n  " + "\n  ".join(errors),
              file=sys.stderr)
        return 2
    return 0


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt
