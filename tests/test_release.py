"""exercises/ is generated from solutions/ (course_lib.instructor.release): the committed tree is what it writes."""
import subprocess
import sys

import nbformat
import pytest
from conftest import ROOT

from course_lib import registry
from course_lib.instructor import release
from course_lib.instructor.release import MarkerError, exercise_view, notebook_exercise_view, solution_view

SOURCES = sorted(p for p in (ROOT / "solutions").rglob("*.py")
                 if p.relative_to(ROOT / "solutions").parts[0] not in registry.SOLUTIONS_ONLY)

MARKED = '''def f(x):
    y = x + 1
    ### BEGIN SOLUTION
    # STUB: z = None  # TODO: double y
    # STUB:
    # STUB:     # keep this comment's indentation
    z = 2 * y
    ### END SOLUTION
    return z


def g():
    ### BEGIN SOLUTION
    return 42
    ### END SOLUTION
'''


def test_committed_exercises_are_what_release_writes():
    """`course release --check` (part of make test): exercises/ matches solutions/."""
    p = subprocess.run([sys.executable, "-m", "course_lib.cli", "release", "--check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "up to date" in p.stdout


def test_stub_lines_replace_the_region_and_keep_their_indentation():
    out = exercise_view(MARKED)
    assert "    z = None  # TODO: double y\n\n        # keep this comment's indentation\n    return z" in out
    assert "2 * y" not in out and "### " not in out and "STUB" not in out


def test_a_region_without_stub_lines_gets_nbgrader_stub_at_the_marker_indentation():
    out = exercise_view(MARKED)
    assert "def g():\n    # YOUR CODE HERE\n    raise NotImplementedError()\n" in out
    assert "return 42" not in out


def test_solution_view_drops_markers_and_stub_lines_only():
    out = solution_view(MARKED)
    assert out == MARKED.replace("    ### BEGIN SOLUTION\n", "").replace("    ### END SOLUTION\n", "").replace(
        "    # STUB: z = None  # TODO: double y\n    # STUB:\n    # STUB:     # keep this comment's indentation\n", "")
    ns = {}
    exec(compile(out, "solution", "exec"), ns)
    assert ns["f"](1) == 4 and ns["g"]() == 42


@pytest.mark.parametrize("text, says", [
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n", "inside another region"),
    ("### BEGIN SOLUTION\nx = 1\n", "never closed"),
    ("x = 1\n### END SOLUTION\n", "without"),
    ('"""Regions go between ### BEGIN SOLUTION and the end."""\n', "nbgrader reads this line as a marker"),
    ("x = 1  ### END SOLUTION\n", "nbgrader reads this line as a marker"),
])
def test_malformed_markers_are_refused_with_the_line(text, says):
    with pytest.raises(MarkerError, match=says) as e:
        exercise_view(text, "f.py")
    assert str(e.value).startswith("f.py")


# A file that marks nothing is copied as it is (07's rendezvous.py stands in for a second node; its bug is in
# rendezvous.sbatch), but a folder that marks nothing in any file gives the learner nothing to write.
FOLDERS = sorted({p.parent for p in SOURCES})


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: str(p.relative_to(ROOT / "solutions")))
def test_every_exercise_folder_marks_something_to_write(folder):
    marked = [p.name for p in folder.iterdir() if p.is_file() and release.BEGIN in p.read_text(encoding="utf-8")]
    assert marked, f"{folder} marks nothing for the learner to write"


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: str(p.relative_to(ROOT / "solutions")))
def test_every_solution_gives_valid_python_both_ways(src):
    text = src.read_text(encoding="utf-8")
    compile(exercise_view(text, str(src)), f"exercise {src}", "exec")
    compile(solution_view(text, str(src)), f"solution {src}", "exec")


def _cli(*args):
    from course_lib.cli import main
    return main(["release", *map(str, args)])


def test_release_writes_then_check_catches_drift_and_orphans(tmp_path, capsys):
    sol, ex = tmp_path / "solutions", tmp_path / "exercises"
    (sol / "05_x").mkdir(parents=True)
    (sol / "01_serial").mkdir()
    (sol / "05_x" / "x.py").write_text(MARKED)
    (sol / "05_x" / "data.txt").write_text("copied as it is\n")
    (sol / "01_serial" / "serial.py").write_text("print('a solution only')\n")

    assert _cli("--check", "--solutions", sol, "--exercises", ex) == 1
    assert "out of date" in capsys.readouterr().out
    assert _cli("--solutions", sol, "--exercises", ex) == 0
    assert (ex / "05_x" / "x.py").read_text() == exercise_view(MARKED)
    assert (ex / "05_x" / "data.txt").read_text() == "copied as it is\n"
    assert not (ex / "01_serial").exists()
    (ex / "05_x" / "mnist_cnn.pt").write_bytes(b"a run's output, not a source")
    assert _cli("--check", "--solutions", sol, "--exercises", ex) == 0

    (sol / "05_x" / "x.py").write_text(MARKED.replace("x + 1", "x + 2"))
    capsys.readouterr()
    assert _cli("--check", "--solutions", sol, "--exercises", ex) == 1
    assert f"out of date: {ex / '05_x' / 'x.py'}" in capsys.readouterr().out
    _cli("--solutions", sol, "--exercises", ex)

    (ex / "05_x" / "renamed_away.py").write_text("x = 1\n")
    capsys.readouterr()
    assert _cli("--check", "--solutions", sol, "--exercises", ex) == 1
    assert "no solution for" in capsys.readouterr().out
    assert _cli("--solutions", sol, "--exercises", ex) == 0
    assert (ex / "05_x" / "renamed_away.py").exists(), "release deletes nothing"


def test_marker_error_is_one_message_and_exit_2(tmp_path, capsys):
    sol = tmp_path / "solutions" / "05_x"
    sol.mkdir(parents=True)
    (sol / "x.py").write_text("### BEGIN SOLUTION\nx = 1\n")
    assert _cli("--solutions", sol.parent, "--exercises", tmp_path / "exercises") == 2
    assert "never closed" in capsys.readouterr().err
    assert not (tmp_path / "exercises").exists()


def _solution_notebook():
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    code = nbformat.v4.new_code_cell("x = 1\n### BEGIN SOLUTION\n# STUB: y = None\ny = x + 1\n### END SOLUTION\n"
                                     "print(y)")
    code.outputs = [nbformat.v4.new_output("stream", text="2\n")]
    code.execution_count = 3
    whole = nbformat.v4.new_code_cell("answer = 42")
    text = nbformat.v4.new_markdown_cell("Ring all-reduce sends 2(W-1)/W of the data.")
    for cell, gid in ((code, "code"), (whole, "whole"), (text, "text")):
        cell.metadata["nbgrader"] = {"solution": True, "grade": False, "locked": False, "grade_id": gid,
                                     "schema_version": 3}
    text.metadata["nbgrader"].update(grade=True, points=1)   # nbgrader: a written answer is graded by hand
    intro = nbformat.v4.new_markdown_cell("# Exercise\nNot a solution cell: kept.")
    nb.cells = [intro, code, whole, text]
    return nb


def test_a_solution_notebook_is_released_with_nbgrader_conventions():
    out = nbformat.reads(notebook_exercise_view(nbformat.writes(_solution_notebook())), as_version=4)
    intro, code, whole, text = out.cells
    assert intro.source == "# Exercise\nNot a solution cell: kept."
    assert code.source == "x = 1\ny = None\nprint(y)"
    assert code.outputs == [] and code.execution_count is None
    assert whole.source == "# YOUR CODE HERE\nraise NotImplementedError()"
    assert text.source == "YOUR ANSWER HERE"


def test_release_for_nbgrader_writes_starters_and_never_overwrites(tmp_path, capsys):
    """`course release --nbgrader DIR`: one assignment per exercise folder, the starter files as exercises/
    holds them, a guide notebook; a second run writes nothing; a file that differs stops it, untouched."""
    course = tmp_path / "course"
    args = ["--solutions", str(ROOT / "solutions"), "--nbgrader", str(course), "--exercise", "allreduce"]
    parse = lambda a: _parser().parse_args(a)
    assert release.run(parse(args)) == 0
    source = course / "source" / "05_allreduce"
    assert sorted(p.name for p in source.iterdir()) == ["05_allreduce.ipynb", "allreduce.py"]
    assert (source / "allreduce.py").read_text() == (ROOT / "exercises/05_allreduce/allreduce.py").read_text()
    guide = nbformat.read(source / "05_allreduce.ipynb", as_version=4)
    assert 'check("allreduce", "allreduce.py")' in guide.cells[-1].source
    assert (course / "nbgrader_config.py").is_file()
    assert release.run(parse(args)) == 0 and "(0 files written)" in capsys.readouterr().out
    (source / "allreduce.py").write_text("# the instructor's own edit\n")
    assert release.run(parse(args)) == 2
    assert "exist and differ" in capsys.readouterr().err
    assert (source / "allreduce.py").read_text() == "# the instructor's own edit\n"


def test_release_for_nbgrader_writes_the_sites_lines_into_the_job_script(tmp_path, monkeypatch):
    """The job-script exercise released for nbgrader carries the site profile's lines, as a hub workspace's copy
    does (it said site 'generic', no partition or account: issue 55)."""
    monkeypatch.setenv("COURSE_SITE", "example-gpu-cluster")
    args = ["--solutions", str(ROOT / "solutions"), "--nbgrader", str(tmp_path / "c"), "--exercise", "sbatch"]
    assert release.run(_parser().parse_args(args)) == 0
    text = (tmp_path / "c" / "source" / "03_jobs" / "ddp.sbatch").read_text()
    assert "# >>> site 'example-gpu-cluster'" in text and "#SBATCH --partition=gpu" in text, text[:1500]
    assert "#SBATCH --account=my-project" in text


def test_release_for_gradescope_refuses_a_folder_with_files(tmp_path, capsys):
    (tmp_path / "ag").mkdir()
    (tmp_path / "ag" / "mine.txt").write_text("the instructor's\n")
    assert release.run(_parser().parse_args(["--gradescope", str(tmp_path / "ag")])) == 2
    assert "is not empty" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "ag").iterdir()] == ["mine.txt"]
    both = ["--gradescope", str(tmp_path / "g"), "--nbgrader", str(tmp_path / "n")]
    assert release.run(_parser().parse_args(both)) == 2 and not (tmp_path / "g").exists()


def _parser():
    import argparse

    p = argparse.ArgumentParser()
    release.add_arguments(p)
    return p


def test_the_harder_starters_raise_without_the_recipe_and_keep_what_runs(tmp_path, capsys):
    hard = tmp_path / "hard"
    assert release.run(_parser().parse_args(["--no-hints", "--exercises", str(hard)])) == 0
    ring = (hard / "05_allreduce/allreduce.py").read_text()
    hinted = (ROOT / "exercises/05_allreduce/allreduce.py").read_text()
    recipe = "send chunk (rank-s)%W right"   # the ring stub's recipe
    assert recipe in hinted and recipe not in ring
    assert 'raise NotImplementedError("ring_allreduce: your code here")' in ring
    assert 'raise NotImplementedError("shard_range: your code here")' in (hard / "09_zero/zero.py").read_text()
    compile(ring, "allreduce.py", "exec")
    # a stub that keeps a file running (the DDP script's steps) is the same in both
    ddp = "02_ddp/mnist_classify_ddp.py"
    assert (hard / ddp).read_text() == (ROOT / "exercises" / ddp).read_text()
    capsys.readouterr()
    assert release.run(_parser().parse_args(["--no-hints"])) == 2 and "--exercises DIR" in capsys.readouterr().err
