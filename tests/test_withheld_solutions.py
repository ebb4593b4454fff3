"""A graded workshop's install keeps solutions/ from learners (scripts/hub/withhold-solutions.sh): what a notebook
shows from a solution says so instead of crashing. Tests run as root, who reads every file, so the refusal is
raised here as the kernel of a learner would meet it (PermissionError on the solution's read)."""
from pathlib import Path

import pytest

from course_lib.core.report import Report, Verdict
from course_lib.ddp import stepdiff
from course_lib.lessons import use


@pytest.fixture
def withheld(monkeypatch):
    read_text, read_bytes = Path.read_text, Path.read_bytes

    def refuse(reader):
        def read(self, *args, **kwargs):
            if "solutions" in self.parts and "01_serial" not in self.parts:
                raise PermissionError(13, "Permission denied", str(self))
            return reader(self, *args, **kwargs)
        return read
    monkeypatch.setattr(Path, "read_text", refuse(read_text))
    monkeypatch.setattr(Path, "read_bytes", refuse(read_bytes))


def test_a_step_diff_says_the_solution_is_withheld(withheld):
    diff = stepdiff.show(3)
    assert "withheld in this install" in str(diff) and "withheld in this install" in diff._repr_html_()


def test_a_lesson_uses_the_learners_own_file_when_the_solution_is_withheld(withheld, tmp_path, capsys):
    mine = tmp_path / "step.py"
    mine.write_text("VALUE = 'mine'\n")
    failed = Report("step", str(mine), [Verdict("timing", "fail", "not yet")], 0.1)
    module, path = use.learner_or_reference(mine, failed, "01_tuning/step.py")
    assert path == mine and module.VALUE == "mine"
    assert "withheld in this install" in capsys.readouterr().out
