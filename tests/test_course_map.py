"""One course map: 00's tables and the README's "Course map" come from course_lib.lessons.course_map, whose minutes
are the notebooks' own headers; every numbered notebook is on it."""
import json

from conftest import ROOT

from course_lib.lessons import course_map


def test_every_notebook_states_its_minutes_and_is_on_the_map():
    nbs = course_map.notebooks(ROOT / "notebooks")
    assert not [n for n, (_, minutes) in nbs.items() if minutes is None], "a header without '**Time:** about N minutes'"
    rows = course_map.route_rows(ROOT / "notebooks")
    self_study = rows[-1][1]
    assert all(f"{n} (" in self_study for n in nbs), self_study
    assert "09 after 05" in self_study and "10 (60)" in self_study


def test_the_readme_shows_the_course_map():
    """Its rows are course_map.markdown(): a notebook's new minutes, or a new notebook, show here (it failed when
    the README said 01 (40) and 00 said 01 (30 min), and 00 stopped at 06)."""
    readme = (ROOT / "README.md").read_text()
    wanted = course_map.markdown(ROOT / "notebooks")
    assert wanted in readme, "README.md's Course map differs from course_map.markdown(); paste these rows:\n" + wanted


def test_00_renders_the_map_and_writes_no_minutes_of_its_own():
    cells = json.loads((ROOT / "notebooks" / "00_welcome.ipynb").read_text())["cells"]
    text = "\n".join("".join(c["source"]) for c in cells)
    assert "course_map.markdown()" in text and "course_map.path_table()" in text
    assert "(30 min)" not in text and "about 3.5 hours" not in text
