"""Notebooks speak to the course through course_lib.nb (issue 57, item 3): no code cell imports course_lib beyond
nb and the modules a learner's own file imports (data, model, metrics), and none writes an exercise path: it names
the exercise, ``nb.exercise("zero", TREE)``, and the registry knows its file; a lesson's helpers come from
``nb.topic("tp")``, so course_lib's modules can move under the notebooks.
"""
import ast
import json
import re
from pathlib import Path

import pytest
from conftest import ROOT

ALLOWED = {"course_lib.nb", "course_lib.data", "course_lib.model", "course_lib.metrics"}
# an exercise or solution path: exercises/X, solutions/X, or 09_zero/zero.py (not the folder's bare name, which a
# quiz may offer as an answer)
PATH = re.compile(r"(?<![\w/])(?:(?:exercises|solutions)/)?\d\d_[a-z_]+/[\w./-]*\.(?:py|sbatch)\b"
                  r"|(?<![\w/])(?:exercises|solutions)/\w[\w./-]*")
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
FOLDERS = {p.name for p in (ROOT / "exercises").iterdir() if p.is_dir()}


def offences(path: Path) -> set:
    """What the code cells of ``path`` reach past nb for: course_lib modules, and exercise path literals."""
    out = set()
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code":
            continue
        lines = "".join(cell["source"]).splitlines()
        src = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in lines)   # IPython magics
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "course_lib":
                if node.module == "course_lib":
                    out |= {f"course_lib.{a.name}" for a in node.names} - ALLOWED
                elif node.module not in ALLOWED:
                    out.add(node.module)
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name.split(".")[0] == "course_lib"} - ALLOWED
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                out |= {f"path {m.group(0)}" for m in PATH.finditer(node.value)}
                if node.value.strip("/") in FOLDERS:         # an exercise folder: "07_bughunt"
                    out.add(f"path {node.value}")
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_reaches_the_course_through_nb(path):
    found = offences(path)
    assert found == set(), f"{path.name}: use course_lib.nb instead ({sorted(found)})"


def test_the_scan_finds_an_import_past_nb_and_a_path(tmp_path):
    """The scan catches a path literal and an import past nb (a test that can fail)."""
    assert len(NOTEBOOKS) >= 13
    nb = {"cells": [{"cell_type": "code", "source": [
        "from course_lib.nb import exercise\n", "from course_lib import nb, quiz\n", "import course_lib.zero.lab\n",
        "%matplotlib inline\n", "F = nb.exercise_path(TREE, '09_zero/zero.py')\n",
        "G = 'solutions/09_zero/zero.py', 'exercises/'\n"]}]}
    (tmp_path / "x.ipynb").write_text(json.dumps(nb))
    assert offences(tmp_path / "x.ipynb") == {"course_lib.quiz", "course_lib.zero.lab", "path 09_zero/zero.py",
                                              "path solutions/09_zero/zero.py"}


def test_nb_names_the_exercise_not_its_path():
    from course_lib import nb
    assert nb.exercise("zero", "solutions") == ROOT / "solutions" / "09_zero" / "zero.py"
    assert nb.exercise("step") == ROOT / "exercises" / "01_tuning" / "step.py"
    assert nb.exercise("serial", "solutions") == ROOT / "solutions" / "01_serial" / "mnist_classify.py"
    with pytest.raises(ValueError):
        nb.exercise("zero", "elsewhere")


def test_a_topic_gives_its_modules_as_they_are_named():
    """nb.topic: one call per topic, its modules imported when first used; an exercise names its checker's package."""
    from course_lib import nb
    assert nb.topic("ownddp").lab.__name__ == "course_lib.owndp.lab"
    tp = nb.topic("tp")
    assert tp.grid.__name__ == "course_lib.tp.grid"
    assert nb.topic("lessons").noise.__name__ == "course_lib.lessons.noise"
    assert not hasattr(tp, "_repr_html_") and not hasattr(tp, "no_such_module")   # IPython probes it
    with pytest.raises(ValueError, match="no topic 'core'"):
        nb.topic("core")


def test_every_topic_a_notebook_names_is_one():
    """Each ``nb.topic("X").module`` a code cell writes resolves (a typo would fail only when that cell runs)."""
    from course_lib import nb
    named = set()
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                named |= set(re.findall(r"""nb\.topic\(["'](\w+)["']\)(?:\.(\w+))?""", "".join(cell["source"])))
    assert {"tp", "jobs", "lessons"} <= {name for name, _ in named}
    for name, module in sorted(named):
        topic = nb.topic(name)
        assert not module or getattr(topic, module) is not None, (name, module)
