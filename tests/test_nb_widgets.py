"""The notebooks' interactive figures (``course_lib.nb.figure_widget``) and why they avoid ``ipywidgets.interact``.

interact prints into an Output widget; nbclient (papermill, CI) then sends on the kernel's shell channel while it
waits on that channel for the cell's reply, and the run can hang for good (jupyter/nbclient#312). It hung CI in
notebook 06; here 4 of 4 headless runs of ten interact cells hung, and none of eight runs of 45 figure_widget cells.
"""
from __future__ import annotations

import re

import pytest
from conftest import ROOT

from course_lib.nb import _render, figure_panel


def _draw(n, label="x"):
    import matplotlib.pyplot as plt
    _, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot(range(n))
    print(f"{label}: {n} points")


def test_render_gives_png_and_printout_and_closes_the_figure():
    import matplotlib.pyplot as plt
    before = len(plt.get_fignums())
    png, printed = _render(_draw, {"n": 3})
    assert png.startswith(b"\x89PNG")
    assert printed == "x: 3 points\n"
    assert len(plt.get_fignums()) == before


def test_a_control_change_redraws():
    pytest.importorskip("ipywidgets", reason="figure_widget's controls need ipywidgets")
    panel = figure_panel(_draw, n=(range(1, 10), 2), label=(["x", "y"], "x"))
    controls, image, text = panel.children
    slider, dropdown = controls.children
    first = image.value
    assert "x: 2 points" in text.value
    slider.value = 7
    dropdown.value = "y"
    assert image.value != first and "y: 7 points" in text.value


@pytest.mark.slow   # a multi-process run: make test, not test-fast
def test_headless_runs_of_widget_cells_finish(tmp_path):
    """Ten widget cells through nbclient, as papermill runs them; a per-cell deadline turns a hang into a failure."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    cells = [nbformat.v4.new_code_cell("from course_lib.nb import figure_widget\n"
                                       "from course_lib.allreduce.plots import ring_widget\n"
                                       "import matplotlib.pyplot as plt")]
    draw = ("def draw(n):\n    plt.subplots(figsize=(2, 1.5))[1].plot(range(n))\n    print(n)\n"
            "figure_widget(draw, n=([1, 2, 3], 2))")   # nothing returned: shown once
    for _ in range(5):
        cells += [nbformat.v4.new_code_cell(draw), nbformat.v4.new_code_cell("ring_widget(4);")]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=60,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    view = "application/vnd.jupyter.widget-view+json"
    panels = [o for c in nb.cells[1:] for o in c.outputs if view in o.get("data", {})]
    assert len(panels) == 10


def test_no_notebook_or_library_code_uses_interact():
    """``interact``/``interactive``/``interactive_output`` all print through an Output widget (see the module doc)."""
    pattern = re.compile(r"\binteract(ive|ive_output)?\(")
    found = [f"{p.relative_to(ROOT)}" for p in [*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("course_lib/**/*.py")]
             if pattern.search(p.read_text())]
    assert not found, f"use course_lib.nb.figure_widget instead of ipywidgets.interact in {found}"
