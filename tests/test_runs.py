"""Where runs go (course_lib.runs): the engine's order of precedence, GPU choices from the run's node, and a
check's overall deadline bounding the launches inside it."""
import re
import time

import pytest
from conftest import ROOT

from course_lib import runs
from course_lib.core.report import FAIL
from course_lib.core.site import SiteError, load_site
from course_lib.runtime import launch as launching
from course_lib.runtime import scope


def profile(tmp_path, name="runs", **values):
    """The local test cluster's profile with ``values`` set, as a file COURSE_SITE can name."""
    text = (ROOT / "course_lib" / "jobs" / "sites" / "local.toml").read_text().split("\n[env]")[0]
    for key, value in values.items():
        line = f"{key} = {value!r}".replace("'", '"')
        text, n = re.subn(rf"(?m)^{key} = .*$", line, text)
        text += "" if n else f"\n{line}\n"
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


@pytest.fixture
def clean(monkeypatch):
    for key in ("COURSE_RUNS", "COURSE_IN_JOB", "SLURM_JOB_ID"):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_the_engine_is_the_call_then_the_check_then_the_environment_then_the_profile(tmp_path, clean):
    clean.setenv("COURSE_SITE", "local")
    assert runs.engine_for() == "local" and load_site("example-gpu-cluster").runs == "slurm"
    clean.setenv("COURSE_SITE", str(profile(tmp_path, runs="slurm")))
    assert runs.engine_for() == "slurm" and runs.engine_for("local") == "local"
    with scope.scope(engine="local"):            # a check that runs here keeps its runs here
        assert runs.engine_for() == "local" and runs.engine_for("slurm") == "slurm"
    clean.setenv("COURSE_RUNS", "local")
    assert runs.engine_for() == "local" and runs.engine_for("slurm") == "slurm"
    clean.setenv("COURSE_RUNS", "slrum")
    with pytest.raises(ValueError, match="not 'slrum'"):
        runs.engine_for()
    with pytest.raises(SiteError, match="runs must be one of"):
        load_site(str(profile(tmp_path, name="typo", runs="cluster")))
    clean.setenv("SLURM_JOB_ID", "12")           # inside a job: never a job of its own
    assert runs.engine_for("slurm") == "local"


def test_gpu_choices_follow_the_runs_node_not_the_kernel(tmp_path, clean):
    import torch
    assert not torch.cuda.is_available()          # this kernel has no GPU ...
    clean.setenv("COURSE_SITE", str(profile(tmp_path, runs="slurm", gpus_per_node=4)))
    assert runs.node_has_gpus() and runs.node_gpus() == 4   # ... the run's node has 4: the GPU branch is taken
    assert "4 GPU(s) per node" in runs.where()
    assert not runs.node_has_gpus("local") and runs.where("local") == "this machine"
    from course_lib.jobs import script
    job = runs.job_spec({"script_args": ["-m", "course_lib.tp.train"], "nprocs": 2, "timeout": 300}, load_site())
    assert (job.name, job.gpus_per_node, job.time) == ("run-train", 2, "7"), job    # a GPU per rank, 300 + 120 s
    assert "#SBATCH --gpus-per-node=2" in script(job, load_site(), engine_name="slurm")
    clean.setenv("COURSE_SITE", str(profile(tmp_path, name="jobs", gpus_per_node=2)))   # runs local, jobs on Slurm
    assert runs.node_gpus("slurm") == 2 and not runs.node_has_gpus()   # notebook 01 asks with its jobs' engine
    clean.setenv("COURSE_SITE", str(profile(tmp_path, name="cpu", runs="slurm")))
    assert not runs.node_has_gpus()


@pytest.mark.slow
def test_a_scope_deadline_bounds_every_launch_inside_it(tmp_path, clean):
    clean.setenv("COURSE_SITE", "local")
    sleeper = tmp_path / "sleep.py"
    sleeper.write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    start = time.monotonic()
    with scope.scope(4) as s:
        first = launching.launch([str(sleeper)], nprocs=1, timeout=60, on_line=None, warm=False)
        second = launching.launch([str(sleeper)], nprocs=1, timeout=60, on_line=None, warm=False)
    took = time.monotonic() - start
    assert first.timed_out and second.timed_out and s.cut, (first.summary(), second.summary())
    assert second.elapsed < 1 and not second.ranks[0].lines      # nothing left of the deadline: nothing started
    assert took < 15, took
    assert not scope._scopes


@pytest.mark.slow
def test_a_check_past_its_overall_deadline_ends_with_a_clear_verdict(tmp_path, clean, monkeypatch):
    """A check whose launches would take 3 x 120 s ends by its overall deadline with a "check run" FAIL."""
    from course_lib import check as checking
    clean.setenv("COURSE_SITE", "local")
    monkeypatch.setattr(checking.check_local, "overall_deadline", lambda exercise, options: 5.0)
    learner = tmp_path / "mnist_classify_ddp.py"
    learner.write_text("import time\ntime.sleep(600)\n")   # hangs in every run
    said = []
    start = time.monotonic()
    report = checking.check("ddp", learner, engine="local", say=said.append)
    took = time.monotonic() - start
    assert len(said) == 1 and said[0].startswith("checking: up to 5 s (the whole check's deadline"), said
    assert not report.passed
    row = report.rows()[0]
    assert row["item"] == "check run" and row["result"] == FAIL and "deadline of 5 s" in row["message"], report.text()
    assert took < 60, took



def _imports(root):
    """module -> the course_lib modules it imports (at the top or inside a function)."""
    import ast
    mods = {".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): p
            for p in root.rglob("*.py")}
    graph = {}
    for name, path in mods.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                          for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[name] = found & mods.keys()
    return graph


def test_the_process_runtime_has_no_import_cycle():
    """Nothing that core, jobs, runs or check import leads back to them (function-level imports count too)."""
    graph = _imports(ROOT / "course_lib")
    runtime = [m for m in graph if m.startswith(("course_lib.core", "course_lib.jobs", "course_lib.runs",
                                                 "course_lib.check"))]
    for start in runtime:
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            assert m != start, f"{start} imports itself through {sorted(seen)}"
            if m not in seen:
                seen.add(m)
                todo.extend(graph[m])


def test_a_ckpt_check_without_resume_announces_one_launchs_deadline():
    """notebook 08's quick check (resume=False) said "up to 780 s", the deadline of the cases and both resume runs."""
    from course_lib import check_local
    assert check_local.overall_deadline("ckpt", {"resume": False}) == 240 + check_local.MARGIN
    assert check_local.overall_deadline("ckpt", {}) == 3 * 240 + check_local.MARGIN
