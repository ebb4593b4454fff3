"""What a learner sees when a notebook opens, before running anything: no committed FAIL (a check's red verdicts
belong to the learner's own run, not to the file), the settings cell's CI knobs (STRICT, ANSWERS) collapsed, and
nothing the lab changes on opening (it then shows the notebook as unsaved): JupyterLab writes the kernel's
language_info into the metadata, so the notebook carries what the course's kernel reports."""
import json

import pytest
from conftest import ROOT

# every notebook of the course
SCREENS = tuple(p.stem for p in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")))
screens = pytest.mark.parametrize("stem", SCREENS)


def load(stem):
    return json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text(encoding="utf-8"))


def output_text(cell):
    parts = []
    for o in cell.get("outputs", []):
        parts.append("".join(o.get("text", "")))
        parts += ["".join(v) if isinstance(v, list) else str(v) for v in o.get("data", {}).values()]
    return "\n".join(parts)


@screens
def test_no_committed_fail(stem):
    failing = [i for i, c in enumerate(load(stem)["cells"]) if "FAIL" in output_text(c)]
    assert not failing, f"{stem}: cells {failing} open with a committed FAIL"


@screens
def test_the_settings_cell_is_collapsed(stem):
    (cell,) = [c for c in load(stem)["cells"] if "parameters" in c["metadata"].get("tags", [])]
    assert cell["metadata"].get("jupyter", {}).get("source_hidden") is True, f"{stem}: STRICT and ANSWERS show"


@screens
def test_opening_changes_nothing(stem):
    """JupyterLab sets metadata.language_info from the kernel's reply: a notebook without it opened unsaved. The
    Python's version is left out here (a kernel of another Python still marks it unsaved, a change of one line)."""
    from ipykernel.ipkernel import IPythonKernel

    def info(d):
        return {k: v for k, v in d.items() if k != "version"}
    committed = load(stem)["metadata"].get("language_info", {})
    assert info(committed) == info(IPythonKernel.language_info) and "version" in committed, \
        f"{stem}: language_info {committed} is not what this kernel reports ({IPythonKernel.language_info})"


def test_every_lane_of_a_timeline_is_named():
    """01's serial step had a lane without a label (the empty all-reduce lane) and one label for three lanes."""
    import matplotlib
    matplotlib.use("Agg")
    from course_lib.trace.timeline import Timeline, plot

    serial = Timeline(0, {"forward": (0, 1), "backward": (1, 3), "optimizer": (3, 3.2)}, [(1, 3)], [])
    ax = plot([serial])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0 backward compute", "rank 0 phases"]
    assert ax.get_ylim()[0] > 0.5                      # no lane for all-reduces that never ran
    two = plot([Timeline(r, serial.phases, serial.compute, [(2, 4)]) for r in range(2)])
    assert len(two.get_yticklabels()) == 6 and "rank 1 all-reduce" in [t.get_text() for t in two.get_yticklabels()]
