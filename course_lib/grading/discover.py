"""What each learner handed in: the entries of SUBMISSIONS_DIR, and for each exercise the file to grade.

An entry is one learner: a copy of exercises/ (complete or not, files where learners put them), a zip of
one, or a single exercise file (recognised by its name, else by what it defines). Nothing here runs a
learner's code; files that cannot be run get their reason (``Found.problem``) instead.
"""
import os
import re
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from course_lib import registry
from course_lib.grading.starters import NOT_STARTED, is_starter
from course_lib.registry import EXERCISES

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
    folder: Path | None = None             # the folder that was searched (a zip's: where it was unpacked)

    def found_notes(self) -> list[str]:
        """What was found for each exercise (or why nothing can run), then the notes: for grades.md and feedback."""
        return [f"{ex}: {f.note or f.problem[1]}" for ex, f in self.found.items()] + self.notes


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
    if path.suffix.lower() == ".sbatch":     # a job script (course check sbatch reads it as bash)
        return None
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
    stem, suffix = re.escape(PurePosixPath(wanted).stem), re.escape(PurePosixPath(wanted).suffix)
    return re.fullmatch(rf"{stem}(\s*\(\d+\)|[-_ ]?\d+|[-_ ]?copy)?{suffix}", name, re.I) is not None


def locate(folder: Path, exercise: str, files: list) -> Found:
    """Find the file of ``exercise`` among ``files`` (``_walk(folder)``): see README, where files may be."""
    wanted = PurePosixPath(EXERCISES[exercise].file)
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
    return _usable(Found(path=path, seen=path, note=note), folder, rel, exercise)


def _usable(found: Found, folder: Path, rel, exercise: str) -> Found:
    """Refuse symlinks that leave the learner's folder, files that are not Python, and a released starter,
    unchanged: the learner did nothing that earns a mark (grading.starters)."""
    path = found.path
    if path.is_symlink():
        found.path = Path(os.path.realpath(path))
        inside = found.path.is_relative_to(Path(os.path.realpath(folder))) and found.path.is_file()
        why = None if inside else (f"{rel} is a symbolic link to {os.readlink(path)}, outside your folder; "
                                   "it is not followed: hand in the file itself")
    else:
        why = None if path.is_file() else f"{rel} is not a regular file"
    why = why or precheck(found.path) or (NOT_STARTED if is_starter(found.path, exercise) else None)
    if why:
        found.problem, found.path = ("fail", why), None
    return found


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


def discover(submissions: Path, exercises: list[str], scratch: Path, only: set[str] | None = None):
    """The learners in SUBMISSIONS_DIR, each with what was found for each exercise (``only``: just the
    entries of these names, as a Slurm task grading one learner asks)."""
    learners: list[Learner] = []
    ignored: list[str] = []
    root = Path(os.path.realpath(submissions))
    for n, entry in enumerate(sorted(submissions.iterdir(), key=lambda p: p.name.casefold())):
        # a name that is not valid UTF-8 (an old zip tool's) is shown with replacement characters
        name = entry.name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        if only is not None and name not in only:
            continue
        if name in JUNK:
            ignored.append(f"`{name}` (not a submission)")
            continue
        if entry.is_symlink():
            target = Path(os.path.realpath(entry))
            if not target.is_relative_to(root) or target == root:
                msg = (f"`{name}` is a symbolic link to {os.readlink(entry)}, outside SUBMISSIONS_DIR; "
                       "it is not followed: copy the work into the folder instead")
                learners.append(Learner(name, "symlink", name, notes=[msg],
                                        found={ex: Found(problem=("fail", msg.replace("`", ""))) for ex in exercises}))
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
    names = [learner.name for learner in learners]
    for learner in learners:
        if names.count(learner.name) > 1 and learner.source != learner.name:
            learner.name = learner.source
    return learners


def _folder_learner(name: str, folder: Path, kind: str, exercises: list[str], source: str) -> Learner:
    learner = Learner(name, kind, source, folder=folder)
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
    try:   # which exercise it is: by its name, else by what it defines (the registry's rules)
        with open(path, "rb") as f:
            text = f.read(MAX_FILE).decode("utf-8", "replace")
    except OSError:
        text = None          # by its name only
    exercise, how = registry.guess(path.name, text)
    where = f"a single file `{path.name}` at the top of SUBMISSIONS_DIR"
    if exercise is None:
        learner.notes.append(f"{where}: which exercise it is could not be told (name it after the exercise "
                             "file, e.g. allreduce.py, or put it in a folder like exercises/)")
    else:
        learner.notes.append(f"{where}, graded as {exercise} (by {how})")
    for ex in exercises:
        if ex == exercise:
            learner.found[ex] = _usable(Found(path=path, seen=path, note=f"`{path.name}` (a single file)"),
                                        path.parent, path.name, ex)
        else:
            learner.found[ex] = Found(problem=("missing", f"not handed in (only the single file {path.name})"))
    return learner
