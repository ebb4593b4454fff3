"""Where things are: the course sources (read-only) and the learner's workspace (everything written).

- ``course_root()``: the folder that holds notebooks/, exercises/, solutions/ and jobs/ as shipped.
  In a clone it is the repository; ``$COURSE_HOME`` names it for any other kind of install.
- ``workspace()``: where a learner's paths resolve (their exercise files, job runs, ``out/``). For now
  the course root itself: a clone is its own workspace.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

# the folder that holds the course_lib package: put on PYTHONPATH of jobs so they import this course_lib
PACKAGE_PARENT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("notebooks", "exercises", "solutions")


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


def workspace() -> Path:
    """The learner's workspace: where exercise files are read and runs and outputs are written."""
    return course_root()
