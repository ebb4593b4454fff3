"""Write a made-up class of learners' submissions for the grader's tests: ``python make_class.py DIR``.

What real classes hand in: complete work, partial work in a flat folder, the untouched starter inside a
nested exercises/ folder, broken files, a hanging file, hostile files (writing outside their folder,
printing megabytes, forking many processes), symbolic links that point outside, a single file at the top,
a zip, an empty folder; and names with spaces, unicode, dots and leading dashes.
"""
from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from course_lib.instructor.release import solution_view  # noqa: E402

AR, TP = "05_allreduce/allreduce.py", "06_tensor_parallel/tp.py"

# prepended to a starter file: the code runs when a checker imports the file
HANG = '''import time as _time
while True:                                  # waits forever at import, as a stray input() does
    _time.sleep(1)
'''

HOSTILE = '''from pathlib import Path as _Path
_here = _Path(__file__).resolve().parent
for _target in (_here / "graded.txt", _here.parent / "graded.txt", _here.parent.parent / "graded.txt"):
    try:
        _target.write_text("all pass")      # next to itself, in its parent and grand-parent folders
    except OSError:
        pass
for _ in range(20_000):
    print("spam " * 40)                      # 4 MB each time the file is imported
'''

FORKY = '''import os as _os
import time as _time
_kids = 0
for _ in range(150):
    try:
        _pid = _os.fork()
    except OSError as _e:
        print(f"fork failed after {_kids} processes: {_e}")
        break
    if _pid == 0:                            # each child lets go of the output pipe and sleeps
        for _fd in (0, 1, 2):
            _os.close(_fd)
        _time.sleep(600)
        _os._exit(0)
    _kids += 1
'''


def solution(rel: str) -> str:
    return solution_view((ROOT / "solutions" / rel).read_text(encoding="utf-8"))


def starter(rel: str) -> str:
    return (ROOT / "exercises" / rel).read_text(encoding="utf-8")


def write(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))


def make_class(subs: Path, outside: Path) -> Path:
    """Write the class into ``subs``; ``outside`` is a folder outside it that symbolic links point at."""
    subs.mkdir(parents=True, exist_ok=True)
    write(outside / "secret.py", "print('a file outside the submissions')\n")
    # complete work, laid out as exercises/
    write(subs / "alice" / AR, solution(AR))
    write(subs / "alice" / TP, solution(TP))
    # partial work: one file in a flat folder, an extra file; spaces and brackets in the name
    write(subs / "bob (late)" / "tp.py", starter(TP))
    write(subs / "bob (late)" / "notes.txt", "I did not get to allreduce\n")
    # the untouched starter inside a nested exercises/ folder; unicode and a dot in the name
    write(subs / "Zoë.Durand" / "exercises" / AR, starter(AR))
    # broken: a syntax error and a file that is not Python; a leading dash in the name
    write(subs / "-rf" / AR, solution(AR).replace("def ring_allreduce(", "def ring_allreduce(:", 1))
    write(subs / "-rf" / TP, bytes(range(256)) * 4)
    # hanging
    write(subs / "henry" / AR, HANG + starter(AR))
    # hostile: writes outside its folder and prints megabytes; its tp.py is a symlink to a file outside
    write(subs / "mallory" / AR, HOSTILE + starter(AR))
    (subs / "mallory" / TP).parent.mkdir(parents=True)
    os.symlink(outside / "secret.py", subs / "mallory" / TP)
    # many processes
    write(subs / "forky" / AR, FORKY + starter(AR))
    # a single file at the top level
    write(subs / "frank_allreduce.py", starter(AR))
    # a zip holding a notebook instead of the .py file, and a member that tries to leave the folder
    with zipfile.ZipFile(subs / "grace.zip", "w") as z:
        z.writestr("grace/05_allreduce/allreduce.ipynb", '{"cells": [], "metadata": {}, "nbformat": 4}')
        z.writestr("../escape.py", "print('a zip member that tries to leave the folder')\n")
    # an empty folder, and a symlink to a folder outside
    (subs / "empty").mkdir()
    os.symlink(outside, subs / "eve")
    return subs


if __name__ == "__main__":
    target = Path(sys.argv[1])
    make_class(target / "submissions", target / "outside")
    print(f"wrote {target / 'submissions'}")
