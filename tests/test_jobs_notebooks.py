"""Notebooks 03 (launching jobs) and 04 (scaling study) executed headless on the real Slurm of this test
session (tests/conftest.py), against solutions/ with the quiz key: test_notebooks.py leaves their solutions runs
(ON_SLURM) to this module. They skip, with the reason, where Slurm cannot start; 04 (and 06 with the site's runs
on Slurm) also where the real hub runs, whose test runs them on Slurm from a learner's workspace and asserts more.
The local-engine runs of every notebook are in test_notebooks.py."""
import re

import nbformat
import papermill
import pytest
from conftest import ROOT
from test_notebooks import ON_SLURM, assert_solutions_run

from course_lib.instructor.papermill_guard import ENGINE
from course_lib.jobs import monitor

pytestmark = pytest.mark.slow
NB03 = ROOT / "notebooks" / "03_launching_jobs.ipynb"
NB04 = ROOT / "notebooks" / "04_scaling_study.ipynb"


def execute(path, out, **parameters):
    papermill.execute_notebook(str(path), str(out), parameters={"QUICK": True, **parameters},
                               cwd=str(path.parent), kernel_name="python3", progress_bar=False, engine_name=ENGINE)
    return nbformat.read(out, as_version=4)


def text_of(nb):
    parts = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.output_type == "stream":
                parts.append(o.text)
            elif o.output_type in ("display_data", "execute_result"):
                parts.append(o.data.get("text/html", "") or o.data.get("text/plain", ""))
    return "\n".join(parts)


def has_widget(nb):
    return any("application/vnd.jupyter.widget-view+json" in o.get("data", {})
               for c in nb.cells for o in c.get("outputs", []))


@pytest.fixture
def slurm_engine(slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("COURSE_OUT_DIR", str(tmp_path / "out"))   # its own answers: a local run may overlap
    return tmp_path


def _ddp_job_report(nb, engine):
    """The notebook's own line for the srun DDP job: state and seconds from submission to the end."""
    m = re.search(rf"job (\S+) \(ddp-srun, {engine}\): (\w+) after ([\d.]+) s", text_of(nb))
    assert m, f"no summary line of the ddp-srun job on the {engine} engine"
    return m.group(1), m.group(2), float(m.group(3))


@pytest.mark.slurm
def test_03_solutions_on_slurm(slurm_engine):
    nb = execute(NB03, slurm_engine / "03.ipynb", TREE="solutions", STRICT=True, ANSWERS="key")
    job_id, state, seconds = _ddp_job_report(nb, "slurm")
    assert state == "COMPLETED" and job_id.isdigit() and has_widget(nb)
    text = text_of(nb)
    assert_solutions_run("03_launching_jobs", text, "solutions, Slurm")   # test_papermill leaves 03 to this test
    assert f"$ squeue -t all -j {job_id}" in text and "COMPLETED" in text
    log = (slurm_engine / "runs" / f"ddp-srun-{job_id}" / "output.log").read_text()
    assert re.search(r"^0: epoch=1 .*test_acc=", log, re.M) and re.search(r"^1: epoch=1 ", log, re.M)
    # the job script's own top -b, read back and plotted; seff, or sacct's answer where seff is missing
    top_log = slurm_engine / "runs" / f"ddp-srun-{job_id}" / f"ddp-srun-{job_id}.top.log"
    assert monitor.parse_top(top_log.read_text()), f"no top frames in {top_log}"
    assert "%CPU, peak" in text and ("$ seff" in text or "seff is not installed" in text)
    print("\n[03 slurm] " + next(x for x in text.splitlines() if "%CPU, peak" in x))
    print(f"\n[03 slurm] DDP solution, 2 ranks (sbatch + srun): submit -> COMPLETED in {seconds:.1f} s")


@pytest.mark.slurm
def test_04_solutions_on_slurm(slurm_engine):
    """Where the real hub runs, test_hub.py's test_notebook_runs_go_to_slurm_as_the_learners_jobs runs 04 on Slurm
    against the solutions' files with the quiz key, and asserts all of this (with the site's runs on Slurm too)."""
    _repeated_by_the_hub("04")
    nb = execute(NB04, slurm_engine / "04.ipynb", TREE="solutions", STRICT=True, ANSWERS="key")
    text = text_of(nb)
    assert "(strong-2, slurm): COMPLETED" in text and "(weak-2, slurm): COMPLETED" in text and "1 -> 2 ranks" in text
    assert "(lr-linear-warmup-2, slurm): COMPLETED" in text      # the warm-up wrapper runs as a Slurm job too
    assert_solutions_run("04_scaling_study", text, "solutions, Slurm")   # test_papermill leaves 04 to this test


def test_notebooks_left_to_slurm_are_run_and_judged_here():
    """test_notebooks leaves the solutions run of ON_SLURM to this module where Slurm runs: each has its Slurm
    test here, which asserts test_papermill's expectations (EXPECT and no FAIL) with the quiz key."""
    import inspect
    assert ON_SLURM
    for stem in ON_SLURM:
        test = globals().get(f"test_{stem[:2]}_solutions_on_slurm")
        assert test is not None, f"{stem}: test_notebooks leaves it to a Slurm test that does not exist"
        body = inspect.getsource(test)
        assert 'assert_solutions_run("' + stem + '"' in body, stem
        assert 'ANSWERS="key"' in body and 'TREE="solutions"' in body, stem


@pytest.mark.slurm
def test_06_runs_go_to_slurm_with_the_sites_runs(slurm_engine, monkeypatch):
    """COURSE_RUNS=slurm: notebook 06's dp x tp run is a Slurm job (the job-completion log has it) and the notebook
    shows what a local run shows; its checks stay where the site's checks run (here). Where the real hub runs,
    test_hub.py's test_notebook_runs_go_to_slurm_as_the_learners_jobs asserts all of this of the same notebook (with
    its checks on Slurm too), so this run would only repeat it."""
    import subprocess

    _repeated_by_the_hub("06")
    monkeypatch.setenv("COURSE_RUNS", "slurm")
    nb = execute(ROOT / "notebooks" / "06_tensor_parallelism.ipynb", slurm_engine / "06.ipynb", TREE="solutions",
                 STRICT=True, ANSWERS="key")
    assert_solutions_run("06_tensor_parallelism", text_of(nb), "runs on Slurm")
    folders = [f.name for f in (slurm_engine / "runs").iterdir() if f.name.startswith("run-train-")]
    assert len(folders) == 1, folders
    job_id = folders[0].rsplit("-", 1)[1]
    done = subprocess.run(["sacct", "-c", "-n", "-P", "-o", "JobID,JobName,State", "-j", job_id],
                          capture_output=True, text=True, timeout=60).stdout
    assert f"{job_id}|run-train|COMPLETED" in done, done


def _repeated_by_the_hub(number: str) -> None:
    """Skip, saying why, where the real hub can run: its test runs notebook ``number`` on Slurm and asserts more."""
    import hub_support
    if not hub_support.why_not():
        pytest.skip(f"repeated by test_hub.py::test_notebook_runs_go_to_slurm_as_the_learners_jobs, which runs "
                    f"notebook {number} with the site's runs on Slurm and asserts what this test does")
