"""Faulty submissions, declared one way for every checker.

Each ``tests/<exercise>_faulty/cases.py`` holds ``CASES``, a list of :class:`Faulty`: the reference solution
with a few edits typed in (most mistakes are one or two lines), or a whole file beside it where the shape
differs (a Trainer class, mp.spawn, a syntax error). ``expect`` says what the checker must report, per item
(step or function): ``("fail"|"pass"|"missing", regex)``. A regex may name a line by its text instead of its
number: ``{line:dist.recv(x, 0)}`` becomes the number of the first line of the submission holding that text.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.instructor.release import solution_view

LINE = re.compile(r"\{line:(.+?)\}")


@dataclass
class Faulty:
    name: str
    expect: dict                      # item -> (result, regex); items not named are not asserted
    edits: list = field(default_factory=list)   # [(old, new)]: each old text must occur exactly once
    file: str | None = None           # a whole file in the cases folder, instead of edits
    options: dict = field(default_factory=dict)  # checker options that make this case quick
    why: str = ""                     # the mistake, in words

    def source(self, solution: Path, folder: Path) -> str:
        """The submission's text: the file, or the solution's clean view with the edits applied."""
        if self.file:
            return (folder / self.file).read_text()
        text = solution_view(solution.read_text())
        for old, new in self.edits:
            n = text.count(old)
            assert n == 1, f"{self.name}: the edit's old text occurs {n} times in {solution.name}: {old[:60]!r}"
            text = text.replace(old, new)
        return text

    def write(self, solution: Path, folder: Path, dest: Path) -> Path:
        """Write the submission under ``dest`` with the exercise's file name; returns its path."""
        path = dest / (Path(self.file).name if self.file else solution.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.source(solution, folder))
        return path

    def pattern(self, item: str, text: str) -> str:
        """The regex for ``item`` with every ``{line:TEXT}`` replaced by that line's number in ``text``."""
        def number(m):
            for i, line in enumerate(text.splitlines(), 1):
                if m.group(1) in line:
                    return str(i)
            raise AssertionError(f"{self.name}: no line holds {m.group(1)!r}")
        return LINE.sub(number, self.expect[item][1])

    def assert_reported(self, report, text: str, flags: int = 0) -> None:
        """``report`` did not pass, and has a verdict for each item ``expect`` names, with its result and a message
        its regex finds (``text``: the submission, for ``{line:...}``)."""
        assert not report.passed, f"{self.name}: passed\n{report.text()}"
        got = {v.item: v for v in report.verdicts}
        for item, (result, _) in self.expect.items():
            assert item in got, f"{self.name}: no verdict for {item}:\n{report.text()}"
            assert got[item].result == result, f"{self.name}: {item} is {got[item].result}, not {result}:\n" \
                                               f"{report.text()}"
            pattern = self.pattern(item, text)
            assert re.search(pattern, got[item].message, flags), \
                f"{self.name}: {item}: expected /{pattern}/ in the message:\n{report.text()}"

    def assert_checked(self, check, solution: Path, folder: Path, dest: Path, flags: int = 0) -> None:
        """Write this submission under ``dest``, run ``check`` (a checker's ``check(path, **options)``) on it:
        the report is as ``expect`` says (assert_reported), and no process still runs the file (every worker
        was stopped, a hang included)."""
        from conftest import live_processes  # here: tools/bench_checks.py imports the cases outside pytest
        path = self.write(solution, folder, dest)
        report = check(str(path), **self.options)
        self.assert_reported(report, path.read_text(), flags)
        left = live_processes(str(path))
        assert not left, f"processes left running: {left}"


def assert_every_case_applies(cases, solution: Path, folder: Path) -> None:
    """Each edit's old text occurs exactly once in the solution (and each whole file is there)."""
    for case in cases:
        case.source(solution, folder)


def ids(cases) -> list[str]:
    return [c.name for c in cases]
