"""Where things are: the course sources (read-only) and the learner's workspace (everything written).

- ``course_root()``: the folder that holds notebooks/, exercises/, solutions/ and jobs/ as shipped.
  In a clone it is the repository; ``$COURSE_HOME`` names it for any other kind of install.
- ``workspace()``: where a learner's paths resolve (their exercise files, job runs, ``out/``):
  ``$COURSE_WORKSPACE``, else the current folder or the nearest parent holding ``.course-workspace.json``
  (written by ``course init``), else the course root (a clone is its own workspace).
- ``tree_dir(tree)``, ``runs_dir()``, ``out_dir()``: the learner's folders inside it. A workspace made
  without ``--with-solutions`` reads ``solutions/`` from the install, which it never writes.
"""
import os
from functools import lru_cache
from pathlib import Path

# the folder that holds the course_lib package: put on PYTHONPATH of jobs so they import this course_lib
PACKAGE_PARENT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("notebooks", "exercises", "solutions")
MARKER = ".course-workspace.json"


class LayoutError(RuntimeError):
    """The course sources cannot be found (a non-editable install without $COURSE_HOME)."""


def _is_course(folder: Path) -> bool:
    return all((folder / d).is_dir() for d in SOURCE_DIRS)


@lru_cache(maxsize=None)
def course_root() -> Path:
    """The course sources: ``$COURSE_HOME``, else the folder the package sits in when it is a clone."""
    home = os.environ.get("COURSE_HOME")
    if home:
        folder = Path(home).expanduser().resolve()
        if not _is_course(folder):
            raise LayoutError(f"COURSE_HOME={home} holds no {', '.join(SOURCE_DIRS)}: point it at the course folder")
        return folder
    folder = PACKAGE_PARENT
    if _is_course(folder):
        return folder
    raise LayoutError("the course sources (notebooks/, exercises/, solutions/) are not beside course_lib: "
                      "set COURSE_HOME to the folder that holds them")


def find_workspace(start: str | os.PathLike | None = None) -> Path:
    """``$COURSE_WORKSPACE``, else ``start`` (the cwd) or its nearest parent with the marker, else the course root."""
    named = os.environ.get("COURSE_WORKSPACE")
    if named:
        folder = Path(named).expanduser().resolve()
        if not (folder / MARKER).is_file() and not _is_course(folder):
            raise LayoutError(f"COURSE_WORKSPACE={named} is not a course workspace: "
                              f"make one with `course init {named}`")
        return folder
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / MARKER).is_file():
            return folder
    return course_root()


workspace = find_workspace   # the learner's workspace: where exercise files are read and runs and outputs written


def tree_dir(tree: str) -> Path:
    """``exercises`` (or ``solutions``) as a learner sees it: the workspace's copy, else the install's."""
    own = workspace() / tree
    return own if own.is_dir() or tree == "exercises" else course_root() / tree


def runs_dir() -> Path:
    """Where this learner's job run folders go."""
    return workspace() / "jobs" / "runs"


def out_dir() -> Path:
    """Where this learner's outputs (reports, answers, screenshots) go: ``$COURSE_OUT_DIR``, else ``out/``."""
    named = os.environ.get("COURSE_OUT_DIR")
    return Path(named).expanduser().resolve() if named else workspace() / "out"
