"""An exercise nobody started: a released starter, unchanged (line endings and trailing blanks aside), is not run
and scores 0, since a starter runs and a checker can find items its own code earns (docs/grading.md). The
starters are exercises/ as shipped and, where solutions/ can be read, the ``--no-hints`` ones written from it.
"""
import re
from functools import lru_cache
from pathlib import Path

from course_lib.core.paths import LayoutError, course_root
from course_lib.registry import EXERCISES

NOT_STARTED = ("not started: the file is the released starter, unchanged (nothing of it is the learner's work, "
               "so it is not run and every item scores 0)")


# a job script's site block (course_lib.sbatch.site_lines): written for whichever site the learner's copy came from
SITE_BLOCK = re.compile(r"(?ms)^# >>> site '[^']*'.*?^# <<< site[^\n]*$")


def normalised(text: str) -> str:
    """What an unchanged starter still is after an editor saved it: no CR, no trailing blanks, one final newline;
    a job script's site block, written for the hub's site, is left out."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    return SITE_BLOCK.sub("# (site block)", "\n".join(lines)).strip("\n")


@lru_cache(maxsize=None)
def starters(exercise: str) -> frozenset[str]:
    """The normalised texts of ``exercise``'s starters that this user can read (none: an empty set)."""
    from course_lib.instructor.release import MarkerError, exercise_view

    ex, texts = EXERCISES[exercise], set()
    try:
        root = course_root()
    except LayoutError:        # the course's package without its sources (a Gradescope bundle): no starter known
        return frozenset()
    try:
        texts.add(normalised((root / "exercises" / ex.file).read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError):
        pass
    try:
        source = (root / "solutions" / ex.file).read_text(encoding="utf-8")
        texts.update(normalised(exercise_view(source, ex.file, hints=hints)) for hints in (True, False))
    except (OSError, UnicodeDecodeError, MarkerError):   # solutions withheld from this user: exercises/ only
        pass
    return frozenset(texts)


def is_starter(path: Path, exercise: str) -> bool:
    """Whether the file at ``path`` is one of ``exercise``'s starters, unchanged."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return normalised(text) in starters(exercise)
