"""A learner's workspace: ``course init DIR``, ``course update [DIR]`` and ``course restore PATH`` (README, "Running
a workshop on JupyterHub"; docs/jupyterhub.md). Its marker, ``.course-workspace.json``, records the course version
and the digest of every file (and of a notebook's cells) as copied, so that ``update`` tells an edit from an
untouched file, as nbgitpuller does; a notebook the learner only ran is no edit. Inside it every learner path
resolves there (course_lib.core.paths); the install is only read.
"""
import hashlib
import json
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path

from course_lib import registry
from course_lib.core import atomic
from course_lib.core.paths import MARKER, course_root, find_workspace

TREES = ("notebooks", "exercises", "jobs")   # jobs: the *.sbatch scripts for a shell, never anyone's runs
SKIP = {"__pycache__", ".ipynb_checkpoints"}
NEW_SUFFIX = ".course-new"   # the course's version beside a file both sides changed
MINE_SUFFIX = ".mine"        # the learner's version, kept by ``restore``


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cells_digest(data: bytes) -> str | None:
    """A notebook's cells as written (types and sources), without what running it adds: outputs, execution
    counts, metadata. Running a notebook is not an edit. None: not a notebook that can be read."""
    try:
        cells = json.loads(data).get("cells", [])
        text = json.dumps([(c.get("cell_type"), "".join(c.get("source", ""))) for c in cells])
    except (ValueError, AttributeError, TypeError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def course_bytes(src: Path) -> bytes:
    """The course's file as a learner's copy holds it: a job-script exercise gets the site's own lines (partition,
    account, ... from ``$COURSE_SITE``: course_lib.sbatch.site_lines), everything else as it is."""
    data = src.read_bytes()
    return site_text(data.decode()).encode() if src.suffix == ".sbatch" else data


def site_text(text: str) -> str:
    """A job-script exercise's text with its site block written for ``$COURSE_SITE`` (workspaces, nbgrader)."""
    from course_lib.core.site import load_site
    from course_lib.sbatch import site_lines

    return site_lines.render(text, load_site()) if site_lines.written_for(text) is not None else text


def _copy(src: Path, dest: Path) -> str:
    """Write the learner's copy of ``src``; its digest."""
    data = course_bytes(src)
    dest.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def source_files(root: Path, trees) -> dict[str, Path]:
    """``{relative path: source file}`` for the shipped trees (no caches, no checkpoints)."""
    files = {}
    for tree in trees:
        found = (root / tree).glob("*.sbatch") if tree == "jobs" else (root / tree).rglob("*")
        for path in sorted(found):
            if path.is_file() and not SKIP & set(path.parts):
                files[path.relative_to(root).as_posix()] = path
    return files


def _version() -> str:
    try:
        return metadata.version("multigpu-course")
    except metadata.PackageNotFoundError:   # pragma: no cover - a plain checkout without install
        return "unknown"


def _write_marker(folder: Path, trees, digests: dict[str, str], cells: dict[str, str]) -> None:
    """The record: each file's digest as copied and, for notebooks, the digest of its cells (``cells_digest``)."""
    record = {"course_version": _version(), "install": str(course_root()), "trees": list(trees),
              "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "files": digests,
              "cells": cells}
    atomic.write_text(folder / MARKER, json.dumps(record, indent=1, sort_keys=True) + "\n")


def read_marker(folder: Path) -> dict:
    path = folder / MARKER
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        root = course_root()
        if folder == root or root in folder.parents:   # never tell a learner to write into the install
            raise WorkspaceError(f"{folder} is the course install, not a workspace: give your own "
                                 f"(`course update ~/course`)") from e
        raise WorkspaceError(f"{folder} is not a course workspace ({path}: {e}); "
                             f"make one with `course init {folder}`") from e


def to_update(folder: str | Path | None = None) -> Path:
    """The workspace that ``update`` merges into: ``folder``, else the one the current folder is in, else
    ``~/course`` (the hub's, for a terminal opened outside it)."""
    if folder:
        return Path(folder).expanduser().resolve()
    here = find_workspace()
    if (here / MARKER).is_file():
        return here
    mine = Path.home() / "course"
    if (mine / MARKER).is_file():
        return mine.resolve()
    raise WorkspaceError("this folder is not inside a course workspace (a folder with .course-workspace.json): run "
                         "`course update` inside yours, or give its path (`course update "
                         "~/course`); a clone of the course's repository is updated with git pull")


class WorkspaceError(RuntimeError):
    """Bad input for init/update: the message says what to do."""


def init(folder: str | Path, with_solutions: bool = False, exist_ok: bool = False) -> Path:
    """Copy the course's learner trees into ``folder`` (new or empty) and mark it as a workspace."""
    folder = Path(folder).expanduser().resolve()
    if (folder / MARKER).is_file():
        if exist_ok:
            return folder
        raise WorkspaceError(f"{folder} is already a workspace: bring in a newer course with "
                             f"`course update {folder}`")
    if folder.exists() and any(folder.iterdir()):
        raise WorkspaceError(f"{folder} is not empty: choose a new folder (nothing in it was changed)")
    root = course_root()
    if folder == root or root in folder.parents:
        raise WorkspaceError(f"{folder} is inside the course install {root}: choose a folder of your own")
    trees = TREES + (("solutions",) if with_solutions else ())
    digests, cells = {}, {}
    for rel, src in source_files(root, trees).items():
        dest = folder / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        digests[rel] = _copy(src, dest)   # contents only: the learner owns the copy, whatever the install's modes
        _record_cells(cells, rel, dest)
    (folder / "jobs" / "runs").mkdir(parents=True, exist_ok=True)
    (folder / "out").mkdir(exist_ok=True)
    _write_marker(folder, trees, digests, cells)
    folder.chmod(0o700)   # a learner's work is theirs: others on the login node cannot read it
    return folder


def update(folder: str | Path | None = None) -> dict[str, list[str]]:
    """Merge the installed course into a workspace; returns ``{"added", "refreshed", "ran", "kept", "beside",
    "deleted_kept"}`` (``ran``: notebooks the learner had only run, which are refreshed: outputs are no edit)."""
    folder = to_update(folder)
    marker = read_marker(folder)
    recorded, cells = marker.get("files", {}), dict(marker.get("cells", {}))
    trees = tuple(marker.get("trees", TREES))
    result = {"added": [], "refreshed": [], "ran": [], "kept": [], "beside": [], "deleted_kept": []}
    digests = dict(recorded)
    for rel, src in source_files(course_root(), trees).items():
        dest, new = folder / rel, hashlib.sha256(course_bytes(src)).hexdigest()
        if not dest.exists():
            if rel in recorded:           # the learner deleted it: their choice stands
                result["deleted_kept"].append(rel)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            _copy(src, dest)
            result["added"].append(rel)
        elif _digest(dest) == new:
            pass                          # already the course's file
        elif _digest(dest) == recorded.get(rel):
            _copy(src, dest)              # untouched by the learner: take the new version
            result["refreshed"].append(rel)
        elif new != recorded.get(rel) and rel in cells and cells_digest(dest.read_bytes()) == cells[rel]:
            _copy(src, dest)              # a notebook the learner only ran: a run is no edit, take the new one
            result["ran"].append(rel)
        else:
            result["kept"].append(rel)    # the learner's edit wins; the record keeps the old digest
            if new != recorded.get(rel):  # ... and the course changed it too: its version goes beside it
                beside = beside_name(dest)
                _copy(src, beside)
                result["beside"].append(beside.relative_to(folder).as_posix())
            continue
        digests[rel] = new
        _record_cells(cells, rel, dest)
    _write_marker(folder, trees, digests, cells)
    return result


def beside_name(path: Path) -> Path:
    """Where the course's version of a file both sides changed goes: NAME.course-new, and a notebook's
    NAME.course-new.ipynb, which JupyterLab opens as a notebook (NAME.ipynb.course-new it opens as text)."""
    if path.suffix == ".ipynb":
        return path.with_name(path.stem + NEW_SUFFIX + path.suffix)
    return path.with_name(path.name + NEW_SUFFIX)


def _record_cells(cells: dict[str, str], rel: str, path: Path) -> None:
    """Record the cells of the course's notebook as copied (``update`` then tells a learner's run from an edit)."""
    digest = cells_digest(path.read_bytes()) if rel.endswith(".ipynb") else None
    if digest:
        cells[rel] = digest


def restore(path: str | Path) -> tuple[Path, Path | None]:
    """Put the course's version of one workspace file back; returns (the file, where the learner's edit went)."""
    target = Path(path).expanduser().resolve()
    folder = find_workspace(target.parent if target.parent.exists() else None)
    rel = target.relative_to(folder).as_posix() if folder in target.parents else None
    marker = read_marker(folder)
    sources = source_files(course_root(), tuple(marker.get("trees", TREES)))
    if rel not in sources:
        raise WorkspaceError(f"{path} is not a course file of the workspace {folder}: give a path such as "
                             f"{folder / 'exercises' / registry.get('ddp').file}")
    kept = None
    if target.exists() and target.read_bytes() != course_bytes(sources[rel]):
        kept = target.with_name(target.name + MINE_SUFFIX)
        if kept.exists():
            raise WorkspaceError(f"{kept} is already there: move it away first (nothing was changed)")
        shutil.copyfile(target, kept)
    target.parent.mkdir(parents=True, exist_ok=True)
    marker.setdefault("files", {})[rel] = _copy(sources[rel], target)
    cells = dict(marker.get("cells", {}))
    _record_cells(cells, rel, target)
    _write_marker(folder, tuple(marker.get("trees", TREES)), marker["files"], cells)
    return target, kept


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    i = sub.add_parser("init", help="DIR: a learner's copy of notebooks/ and exercises/")
    i.add_argument("dir", type=Path, metavar="DIR", help="the folder to make the workspace in")
    i.add_argument("--with-solutions", action="store_true", help="copy solutions/ too (instructors)")
    i.add_argument("--exist-ok", action="store_true", help="a workspace already there is fine (first login)")
    u = sub.add_parser("update", help="[DIR]: bring in a newer course; your edits are kept")
    u.add_argument("dir", type=Path, nargs="?", metavar="DIR",
                   help="the workspace (default: the one this folder is in)")
    r = sub.add_parser("restore", help="PATH: the course's version of one file (yours is kept as PATH.mine)")
    r.add_argument("path", type=Path, metavar="PATH", help="a file of the workspace, e.g. exercises/02_ddp/...")


def run(args) -> int:
    try:
        if args.action == "init":
            folder = init(args.dir, args.with_solutions, args.exist_ok)
            print(f"course {args.action}: {folder} is ready; open notebooks/00_welcome.ipynb there")
            return 0
        if args.action == "restore":
            target, kept = restore(args.path)
            print(f"course {args.action}: {target} is the course's version again"
                  + (f"; your version is in {kept}" if kept else ""))
            return 0
        folder = to_update(args.dir)
        print(f"course {args.action}: updating {folder} from {course_root()}")
        result = update(folder)
    except WorkspaceError as e:
        print(f"course {args.action}: {e}", file=sys.stderr)
        return 2
    for label, key in (("added", "added"), ("updated", "refreshed"), ("updated (you had only run it)", "ran"),
                       ("kept (you changed it)", "kept"),
                       ("the course's new version", "beside"), ("not restored (you deleted it)", "deleted_kept")):
        for rel in result[key]:
            print(f"{label:32s}{rel}")
    changed = sum(len(result[k]) for k in ("added", "refreshed", "ran", "kept", "deleted_kept"))
    print(f"course {args.action}: {changed} file(s) differ from before; nothing of yours was overwritten")
    if result["beside"]:
        print(f"course {args.action}: the course changed files you changed too: compare each with its .course-new "
              "copy (a notebook's opens as a notebook); `course restore PATH` takes the course's version "
              "(yours is kept as PATH.mine)")
    return 0
