"""Every notebooks/*.ipynb follows the notebook protocol and runs headless (papermill, nbval).

- metadata: kernelspec, a ``parameters`` cell with the protocol's defaults, no stale outputs (only cells
  whose first line is ``# NBVAL_CHECK_OUTPUT`` keep theirs), no execution leftovers;
- papermill against solutions/ with ``TREE="solutions", QUICK=True, STRICT=True``: all checks green;
- nbval ``--nbval-lax`` with ``COURSE_QUICK=1``: the default parameters, i.e. ``TREE="exercises"`` and
  ``QUICK=True``, so this is also the quick run against the starter exercises (every cell must run; the
  checked cells must print what is committed). A separate papermill run with ``-p TREE exercises -p QUICK
  True`` would execute exactly the same code a second time, so it is not repeated.

New notebooks are picked up by the glob.
"""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
CHECKED = "# NBVAL_CHECK_OUTPUT"
DEADLINE = 600      # seconds for one notebook run (a QUICK run should take well under 60 s)

notebooks = pytest.mark.parametrize(
    "nb_path", NOTEBOOKS or [pytest.param(None, marks=pytest.mark.skip(reason="no notebooks/*.ipynb yet"))],
    ids=lambda p: p.stem if p else "none")


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def source(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def parameters_cell(nb: dict):
    tagged = [i for i, c in enumerate(nb["cells"]) if "parameters" in c.get("metadata", {}).get("tags", [])]
    return tagged


@notebooks
def test_kernelspec_and_parameters_cell(nb_path):
    nb = load(nb_path)
    assert nb["metadata"].get("kernelspec") == KERNELSPEC, f"{nb_path.name}: kernelspec must be {KERNELSPEC}"
    tagged = parameters_cell(nb)
    assert len(tagged) == 1, f"{nb_path.name}: exactly one cell tagged 'parameters' (found {len(tagged)})"
    i = tagged[0]
    cell = nb["cells"][i]
    assert cell["cell_type"] == "code"
    code_before = sum(c["cell_type"] == "code" for c in nb["cells"][:i])
    assert code_before <= 2, f"{nb_path.name}: the parameters cell should be near the top (code cell {code_before + 1})"
    assigned = {}
    for node in ast.parse(source(cell)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            assigned[node.targets[0].id] = ast.unparse(node.value)
    assert assigned.get("TREE") == "'exercises'", f"{nb_path.name}: TREE = \"exercises\" by default"
    assert assigned.get("QUICK") == "os.environ.get('COURSE_QUICK') == '1'", f"{nb_path.name}: QUICK default"
    assert assigned.get("STRICT") == "False", f"{nb_path.name}: STRICT = False by default"


@notebooks
def test_no_stale_outputs(nb_path):
    nb = load(nb_path)
    assert "papermill" not in nb["metadata"], f"{nb_path.name}: committed from a papermill run; clear it"
    assert "widgets" not in nb["metadata"], f"{nb_path.name}: widget state is committed; clear it"
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        where = f"{nb_path.name} cell {i} ({source(cell).strip().splitlines()[0][:60] if source(cell).strip() else 'empty'})"
        assert "papermill" not in cell.get("metadata", {}), f"{where}: papermill metadata committed"
        if source(cell).startswith(CHECKED):
            assert cell.get("outputs"), f"{where}: an nbval-checked cell needs its committed output"
            assert not any(o.get("output_type") == "error" for o in cell["outputs"]), f"{where}: an error is committed"
        else:
            assert not cell.get("outputs"), f"{where}: committed with outputs; clear them (only {CHECKED} cells keep theirs)"
            assert cell.get("execution_count") is None, f"{where}: execution count committed; clear outputs"


@pytest.mark.slow
@notebooks
def test_papermill_against_solutions(nb_path, tmp_path, monkeypatch):
    """The reference files make every check in the notebook pass (STRICT=True turns a red check into an error)."""
    import papermill as pm

    monkeypatch.setenv("COURSE_QUICK", "1")    # the kernel inherits it, as in CI
    pm.execute_notebook(str(nb_path), str(tmp_path / nb_path.name),
                        parameters={"TREE": "solutions", "QUICK": True, "STRICT": True},
                        cwd=str(nb_path.parent), kernel_name="python3", execution_timeout=DEADLINE,
                        progress_bar=False)


@pytest.mark.slow
@notebooks
def test_nbval_lax_against_exercises(nb_path):
    """Default parameters with COURSE_QUICK=1: the quick run against the starter exercises, checked by nbval."""
    env = dict(os.environ, COURSE_QUICK="1")
    p = subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "-q", "-p", "no:cacheprovider",
                        "--nbval-cell-timeout", str(DEADLINE), "-o", "addopts=", str(nb_path)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE + 120)
    assert p.returncode == 0, f"nbval failed on {nb_path.name}:\n{p.stdout[-6000:]}\n{p.stderr[-2000:]}"
