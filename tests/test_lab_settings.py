"""What make lab installs and what its lab shows a learner, without a browser: the install line and what it brings,
the file browser's root as the lab's server lists it, the notebooks signed by the lab's notary. The browser test in
tests/test_lab.py sees the same in chromium."""
import subprocess

from conftest import ROOT

from course_lib.instructor import hub

TEST_ONLY = {"pytest", "playwright", "nbgrader", "ruff", "py-spy", "nbval", "pytest-xdist", "pytest-timeout"}


def _closure(requirement: str) -> set[str]:
    """The distributions that installing ``requirement`` brings, read from the installed metadata (each one's
    Requires-Dist with its markers, the extras asked for included): what pip installs for it, without a second venv."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen, todo = set(), [Requirement(requirement)]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        for extra in req.extras or [""]:
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            try:
                requires = metadata.distribution(name).requires or []
            except metadata.PackageNotFoundError:
                continue
            todo += [r for r in map(Requirement, requires)
                     if r.marker is None or r.marker.evaluate({"extra": extra})]
    return {name for name, _ in seen}


def test_make_lab_installs_a_learners_extras_only(tmp_path):
    """make lab's install line (make -n, into a venv that is not there) asks for the lab extra only, and what that
    brings holds no test or instructor package (before: .[lab,test], playwright, nbgrader, ruff, py-spy)."""
    r = subprocess.run(["make", "-n", "lab", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    install = [line for line in r.stdout.splitlines() if "venv-install.sh" in line]
    assert len(install) == 1 and install[0].endswith('-e ".[lab]"'), r.stdout + r.stderr
    brought = _closure("multigpu-course[lab]")
    assert {"jupyterlab", "ipykernel", "torch"} <= brought
    assert not brought & TEST_ONLY, f"make lab would install {sorted(brought & TEST_ONLY)}"
    assert _closure("multigpu-course[test]") & TEST_ONLY == TEST_ONLY     # the same walk finds them where they are


def test_the_lab_lists_what_a_learner_needs(tmp_path):
    """The file browser's root, as make lab's server lists it (its ContentsManager with the lab's hide_globs):
    notebooks/ exercises/ solutions/ docs/, not the package, its tests and scripts or the egg-info."""
    from jupyter_server.services.contents.filemanager import FileContentsManager

    config = hub.server_config(tmp_path)
    manager = FileContentsManager(root_dir=str(ROOT), hide_globs=config["ContentsManager"]["hide_globs"])
    listed = {item["name"] for item in manager.get("", content=True)["content"]}
    assert {"notebooks", "exercises", "solutions", "README.md"} <= listed
    assert not listed & {"course_lib", "tests", "scripts", "Makefile", "pyproject.toml"}, listed
    assert not [n for n in listed if n.endswith(".egg-info")], listed
    assert manager.get("tests/test_lab.py", content=False)["name"] == "test_lab.py"    # hidden, not locked away
    css = hub.CUSTOM_CSS
    assert 'title^="Name: notebooks\\A"] { order: -2; }' in css and '"Name: solutions\\A"' in css


def test_the_notebooks_open_trusted(tmp_path):
    """Signed by the lab's own notary (make lab: course write lab-settings --trust notebooks), each notebook's signature
    checks with the notary the lab's server uses; an unsigned one does not (JupyterLab: "0 of N cells trusted")."""
    import nbformat
    from nbformat.sign import NotebookNotary

    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    notary = NotebookNotary(data_dir=hub.server_config(tmp_path)["NotebookNotary"]["data_dir"])
    assert not notary.check_signature(nbformat.read(notebooks[0], as_version=4))
    assert hub.trust(tmp_path, ROOT / "notebooks") == notebooks
    assert all(notary.check_signature(nbformat.read(p, as_version=4)) for p in notebooks)
