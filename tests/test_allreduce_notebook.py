"""Notebook 05 runs end to end: against the solutions (all checks green), against the starter (checks red,
no crash), and under nbval with the default parameters."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "05_allreduce_algorithms.ipynb"


def _papermill(tmp_path, tree, strict):
    import nbformat
    import papermill
    out = tmp_path / f"05-{tree}.ipynb"
    papermill.execute_notebook(str(NOTEBOOK), str(out), cwd=str(ROOT / "notebooks"), progress_bar=False,
                               parameters={"TREE": tree, "QUICK": True, "STRICT": strict})
    nb = nbformat.read(out, as_version=4)
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


@pytest.mark.slow
def test_notebook_against_solutions(tmp_path):
    text = _papermill(tmp_path, "solutions", True)
    assert "PASS    ring_allreduce" in text and "FAIL" not in text
    assert "ring/gloo busbw at >= 16 MiB" in text


@pytest.mark.slow
def test_notebook_against_starter(tmp_path):
    text = _papermill(tmp_path, "exercises", False)
    assert "FAIL    naive_allreduce" in text and "skipped ring: raised NotImplementedError" in text


@pytest.mark.slow
def test_notebook_nbval():
    env = dict(os.environ, COURSE_QUICK="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                           str(NOTEBOOK)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
