"""nbgrader and our sources: the real nbgrader accepts the markers and clears the same regions as `course release`
in notebook cells; any other file it copies as it is, so `course release --nbgrader` gives it learner files only
(the real `nbgrader generate_assignment` releases no line of a solution region)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_lib import registry
from course_lib.instructor import release
from course_lib.instructor.release import STUB, exercise_view, notebook_exercise_view

pytest.importorskip("nbgrader", reason="nbgrader is a test dependency (pip install -e '.[test]')")
from conftest import ROOT
from nbgrader.preprocessors import ClearSolutions  # noqa: E402

# the files with regions (one without, such as 07's rendezvous.py, is copied as it is: no solution cell)
SOURCES = sorted(p for p in (ROOT / "solutions").rglob("*.py")
                 if p.relative_to(ROOT / "solutions").parts[0] not in registry.SOLUTIONS_ONLY
                 and release.BEGIN in p.read_text(encoding="utf-8"))
KERNEL = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def as_notebook(text: str, grade_id: str):
    """One nbgrader solution cell holding the whole file."""
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": KERNEL})
    cell = nbformat.v4.new_code_cell(text)
    cell.metadata["nbgrader"] = {"solution": True, "grade": False, "locked": False, "grade_id": grade_id,
                                 "schema_version": 3}
    nb.cells.append(cell)
    return nb


def nbgrader_would_write(text: str) -> str:
    """What nbgrader makes of our file: every region becomes its stub (it ignores our STUB lines)."""
    without_stubs = "".join(line for line in text.splitlines(keepends=True) if not STUB.match(line.rstrip("\n")))
    return exercise_view(without_stubs)


def split_regions(text: str) -> tuple[set[str], set[str]]:
    """(the stripped lines inside the regions, not STUB lines; those outside them)."""
    inside, outside, depth = set(), set(), False
    for line in text.splitlines():
        s = line.strip()
        if s in (release.BEGIN, release.END):
            depth = s == release.BEGIN
        elif depth and s and not STUB.match(line):
            inside.add(s)
        elif not depth:
            outside.add(s)
            outside.add(s.split("  #")[0].rstrip())   # its code without a trailing comment: the same statement
    return inside, outside


def solution_lines(text: str) -> set[str]:
    """The code inside the regions (not STUB lines) that appears nowhere outside them."""
    inside, outside = split_regions(text)
    return inside - outside


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: str(p.relative_to(ROOT / "solutions")))
def test_clear_solutions_accepts_our_markers_and_drops_the_solution(src):
    text = src.read_text(encoding="utf-8")
    nb, _ = ClearSolutions().preprocess(as_notebook(text, src.stem), {})
    out = nb.cells[0].source
    assert out == nbgrader_would_write(text)
    leaked = [line for line in solution_lines(text) if line in out]
    assert not leaked, f"solution lines left by nbgrader: {leaked[:3]}"
    assert out.count("raise NotImplementedError()") == text.count(release.BEGIN)


@pytest.mark.parametrize("text", ["### BEGIN SOLUTION\nx = 1\n",
                                  "### BEGIN SOLUTION\n### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n"])
def test_nbgrader_refuses_what_release_refuses(text):
    with pytest.raises(RuntimeError):
        ClearSolutions().preprocess(as_notebook(text, "bad"), {})
    with pytest.raises(release.MarkerError):
        exercise_view(text)


@pytest.mark.slow
def test_nbgrader_generate_assignment_releases_our_sources(tmp_path):
    """The whole nbgrader tool, as an instructor runs it, on every solution file and a solution notebook."""
    source = tmp_path / "source" / "course"
    source.mkdir(parents=True)
    expected = {}
    for src in SOURCES:
        text = src.read_text(encoding="utf-8")
        name = re.sub(r"\W", "_", str(src.relative_to(ROOT / "solutions").with_suffix("")))
        nbformat.write(as_notebook(text, name), source / f"{name}.ipynb")
        expected[name] = nbgrader_would_write(text)
    demo = nbformat.v4.new_notebook(metadata={"kernelspec": KERNEL})
    demo.cells = [nbformat.v4.new_markdown_cell("Why is ring all-reduce bandwidth-optimal?"),
                  nbformat.v4.new_code_cell("y = 1\n### BEGIN SOLUTION\n# STUB: z = None\nz = y + 1\n"
                                            "### END SOLUTION\n")]
    for cell, gid in zip(demo.cells, ("why", "z")):
        cell.metadata["nbgrader"] = {"solution": True, "grade": False, "locked": False, "grade_id": gid,
                                     "schema_version": 3}
    # nbgrader's convention for a written answer: a solution cell that is also graded by hand
    demo.cells[0].metadata["nbgrader"].update(grade=True, points=1)
    nbformat.write(demo, source / "demo.ipynb")

    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter"), HOME=str(tmp_path))
    p = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", "course", "--force",
                        f"--CourseDirectory.root={tmp_path}"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    released = tmp_path / "release" / "course"
    for name, text in expected.items():
        nb = nbformat.read(released / f"{name}.ipynb", as_version=4)
        assert nb.cells[0].source == text, name
    demo_out = nbformat.read(released / "demo.ipynb", as_version=4)
    ours = nbformat.reads(notebook_exercise_view(nbformat.writes(demo)), as_version=4)
    assert demo_out.cells[0].source == ours.cells[0].source == "YOUR ANSWER HERE"
    assert demo_out.cells[1].source == "y = 1\n# YOUR CODE HERE\nraise NotImplementedError()\n"
    assert ours.cells[1].source == "y = 1\nz = None\n"    # ours keeps the STUB line, nbgrader its own stub


def released_lines(path: Path) -> set[str]:
    """The stripped lines of a released file (of each cell's source, for a notebook)."""
    if path.suffix == ".ipynb":
        text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
    else:
        text = path.read_text(encoding="utf-8")
    return {line.strip() for line in text.splitlines()}


def solution_only_lines() -> dict[str, set[str]]:
    """solution file with regions -> its region lines that no starter file holds (STUB lines are starter)."""
    released = [p for p in (ROOT / "solutions").rglob("*") if p.suffix in (".py", ".sbatch")
                and p.relative_to(ROOT / "solutions").parts[0] not in registry.SOLUTIONS_ONLY]
    texts = {str(p.relative_to(ROOT / "solutions")): p.read_text(encoding="utf-8") for p in released}
    starter = {line.strip() for t in texts.values() for line in exercise_view(t).splitlines()}
    return {name: split_regions(text)[0] - starter for name, text in texts.items() if release.BEGIN in text}


def leaks(folder: Path, regions: dict[str, set[str]]) -> dict[str, list[str]]:
    """released file -> the solution lines it holds (any solution's)."""
    found = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        lines = released_lines(f)
        hit = sorted(line for region in regions.values() for line in region if line in lines)
        if hit:
            found[str(f.relative_to(folder))] = hit
    return found


@pytest.mark.slow
def test_release_for_nbgrader_gives_nbgrader_no_solution_line(tmp_path):
    """`course release --nbgrader`, then the real `nbgrader generate_assignment` on every assignment: no released
    file holds a line of a solution region. Beside it, the old advice (the solution file itself in source/, with a
    notebook so that nbgrader accepts the folder) is released too, and the same search finds the leak there."""
    course = tmp_path / "course"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter"), HOME=str(tmp_path))
    p = subprocess.run([sys.executable, "-m", "course_lib.cli", "release", "--nbgrader", str(course)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    ours = sorted(d.name for d in (course / "source").iterdir())
    assert "05_allreduce" in ours and "02_ddp" in ours, ours
    old = course / "source" / "old_advice"
    old.mkdir()
    (old / "allreduce.py").write_text((ROOT / "solutions/05_allreduce/allreduce.py").read_text(encoding="utf-8"))
    nbformat.write(as_notebook("print('check allreduce.py')\n", "old"), old / "old_advice.ipynb")

    p = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", "--CourseDirectory.assignment_id=*",
                        "--force"], cwd=course, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    regions = solution_only_lines()
    assert all(regions.values()), "a solution whose regions hold nothing the starter lacks: the search proves nothing"
    released = course / "release"
    old_leaks = leaks(released / "old_advice", regions)
    assert len(old_leaks.get("allreduce.py", [])) >= 10, old_leaks     # the search finds the old leak
    for name in ours:
        assert leaks(released / name, regions) == {}, name
        for f in (course / "source" / name).rglob("*"):       # what nbgrader released is our starter, byte for byte
            if f.is_file() and f.suffix != ".ipynb":
                rel = f.relative_to(course / "source")
                assert (released / rel).read_bytes() == (ROOT / "exercises" / rel).read_bytes(), rel
