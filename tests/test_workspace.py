"""Learner workspaces (``course init/update``), path resolution, lab settings, jobs.list/attach, and
notebook 05 run headless from two workspaces of one install, which stays untouched."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

from course_lib.core import paths
from course_lib.instructor import hub, workspace

PYTHON = sys.executable
ENV = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def tree_digest(root: Path, trees=("notebooks", "exercises", "solutions")) -> str:
    """sha256 over every shipped file (paths and contents); bytecode caches are the interpreter's, not ours."""
    h = hashlib.sha256()
    for tree in trees:
        for p in sorted((root / tree).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A cwd outside any workspace, no COURSE_WORKSPACE/COURSE_RUNS_DIR from the caller."""
    for var in ("COURSE_WORKSPACE", "COURSE_RUNS_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def fake_install(tmp_path, monkeypatch):
    """A copy of the course's sources as an install ($COURSE_HOME), so that a test may publish a newer course."""
    inst = tmp_path / "install"
    for tree in paths.SOURCE_DIRS:
        shutil.copytree(ROOT / tree, inst / tree, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    monkeypatch.setenv("COURSE_HOME", str(inst))
    paths.course_root.cache_clear()
    yield inst
    monkeypatch.delenv("COURSE_HOME")
    paths.course_root.cache_clear()


def test_init_copies_learner_trees_and_paths_resolve_inside(home):
    ws = workspace.init(home / "ws")
    assert (ws / "notebooks" / "02_ddp_six_steps.ipynb").is_file()
    assert (ws / "exercises" / "05_allreduce" / "allreduce.py").is_file()
    assert not (ws / "solutions").exists()
    assert (ws / "jobs" / "ddp_srun.sbatch").is_file() and (ws / "jobs" / "runs").is_dir()
    assert ws.stat().st_mode & 0o077 == 0, "a workspace is its owner's alone"
    marker = json.loads((ws / paths.MARKER).read_text())
    assert marker["files"]["exercises/05_allreduce/allreduce.py"] == hashlib.sha256(
        (ROOT / "exercises/05_allreduce/allreduce.py").read_bytes()).hexdigest()
    # outside: the clone is its own workspace; inside (any depth): the workspace
    assert paths.workspace() == paths.course_root()
    os.chdir(ws / "notebooks")
    assert paths.workspace() == ws
    assert paths.tree_dir("exercises") == ws / "exercises"
    assert paths.tree_dir("solutions") == paths.course_root() / "solutions"   # read from the install
    assert paths.runs_dir() == ws / "jobs" / "runs" and paths.out_dir() == ws / "out"
    from course_lib import jobs, nb

    assert nb.exercise_path("exercises", "05_allreduce/allreduce.py") == ws / "exercises/05_allreduce/allreduce.py"
    assert jobs.runs_dir() == ws / "jobs" / "runs"


def test_course_workspace_env_and_its_errors(home, monkeypatch):
    ws = workspace.init(home / "ws", with_solutions=True)
    monkeypatch.setenv("COURSE_WORKSPACE", str(ws))
    assert paths.workspace() == ws and paths.tree_dir("solutions") == ws / "solutions"
    monkeypatch.setenv("COURSE_WORKSPACE", str(home))
    with pytest.raises(paths.LayoutError, match="course init"):
        paths.workspace()
    monkeypatch.delenv("COURSE_WORKSPACE")
    (home / "full").mkdir(); (home / "full" / "mine.txt").write_text("keep me")
    with pytest.raises(workspace.WorkspaceError, match="not empty"):
        workspace.init(home / "full")
    assert (home / "full" / "mine.txt").read_text() == "keep me"
    with pytest.raises(workspace.WorkspaceError, match="already a workspace"):
        workspace.init(ws)
    assert workspace.init(ws, exist_ok=True) == ws
    with pytest.raises(workspace.WorkspaceError, match="inside the course install"):
        workspace.init(paths.course_root() / "out" / "ws-inside")


def test_update_keeps_learner_edits_and_brings_new_files(home, fake_install):
    ws = workspace.init(home / "ws")
    mine = ws / "exercises/05_allreduce/allreduce.py"
    mine.write_text(mine.read_text() + "\n# my ring, half done\n")
    (ws / "exercises/06_tensor_parallel/tp.py").unlink()
    # the instructor publishes a newer course: one changed file the learner did not touch, one they did, a new one
    (fake_install / "notebooks/00_welcome.ipynb").write_text('{"cells": [], "newer": true}')
    (fake_install / "exercises/05_allreduce/allreduce.py").write_text("# newer starter\n")
    (fake_install / "exercises/05_allreduce/extra.py").write_text("# new file\n")
    result = workspace.update(ws)
    assert result["refreshed"] == ["notebooks/00_welcome.ipynb"]
    assert result["kept"] == ["exercises/05_allreduce/allreduce.py"]
    assert result["added"] == ["exercises/05_allreduce/extra.py"]
    assert result["deleted_kept"] == ["exercises/06_tensor_parallel/tp.py"]
    assert mine.read_text().endswith("# my ring, half done\n")
    assert '"newer": true' in (ws / "notebooks/00_welcome.ipynb").read_text()
    assert not (ws / "exercises/06_tensor_parallel/tp.py").exists()
    # both sides changed allreduce.py: the course's version is beside the learner's, which is untouched
    assert result["beside"] == ["exercises/05_allreduce/allreduce.py.course-new"]
    assert (ws / "exercises/05_allreduce/allreduce.py.course-new").read_text() == "# newer starter\n"
    # a second update changes nothing and still keeps the edit
    again = workspace.update(ws)
    assert again["kept"] == ["exercises/05_allreduce/allreduce.py"] and not again["refreshed"] and not again["added"]


def test_a_workspace_job_script_exercise_carries_the_sites_lines(home, monkeypatch):
    monkeypatch.setenv("COURSE_SITE", "example-gpu-cluster")
    ws = workspace.init(home / "ws")
    text = (ws / "exercises/03_jobs/ddp.sbatch").read_text()
    assert "#SBATCH --partition=gpu" in text and "#SBATCH --account=my-project" in text
    assert "--partition" not in (paths.course_root() / "exercises/03_jobs/ddp.sbatch").read_text()
    # the site's lines are the course's version: an update refreshes or keeps nothing, a restore matches it
    assert not any(workspace.update(ws).values())
    assert workspace.restore(ws / "exercises/03_jobs/ddp.sbatch") == (ws / "exercises/03_jobs/ddp.sbatch", None)


def test_restore_brings_back_the_course_version_and_keeps_the_learners(home, fake_install):
    ws = workspace.init(home / "ws")
    mine, gone = ws / "exercises/05_allreduce/allreduce.py", ws / "exercises/06_tensor_parallel/tp.py"
    mine.write_text("# my ring\n")
    gone.unlink()
    target, kept = workspace.restore(gone)
    assert kept is None and target.read_text() == (fake_install / "exercises/06_tensor_parallel/tp.py").read_text()
    target, kept = workspace.restore(mine)
    assert kept == ws / "exercises/05_allreduce/allreduce.py.mine" and kept.read_text() == "# my ring\n"
    assert mine.read_text() == (fake_install / "exercises/05_allreduce/allreduce.py").read_text()
    # restored files count as the course's again: a newer course refreshes them
    (fake_install / "exercises/05_allreduce/allreduce.py").write_text("# newer starter\n")
    assert workspace.update(ws)["refreshed"] == ["exercises/05_allreduce/allreduce.py"]
    # a second restore would overwrite the kept copy: it refuses and changes nothing
    mine.write_text("# my second try\n")
    with pytest.raises(workspace.WorkspaceError, match="already there"):
        workspace.restore(mine)
    assert mine.read_text() == "# my second try\n"
    with pytest.raises(workspace.WorkspaceError, match="not a course file"):
        workspace.restore(ws / "out" / "notes.txt")


def test_cli_workspace_and_lab_settings(home):
    run = lambda *a: subprocess.run([PYTHON, "-m", "course_lib", *a], capture_output=True, text=True, env=ENV,
                                    cwd=home, timeout=120)
    r = run("workspace", "init", str(home / "ws"))
    assert r.returncode == 0 and "is ready" in r.stdout, r.stderr
    r = run("workspace", "init", str(home / "ws"))
    assert r.returncode == 2 and "course update" in r.stderr
    (home / "ws/exercises/02_ddp/mnist_classify_ddp.py").write_text("# mine\n")
    r = run("workspace", "update", str(home / "ws"))
    assert r.returncode == 0 and "kept (you changed it)" in r.stdout and "02_ddp/mnist_classify_ddp.py" in r.stdout
    r = run("workspace", "update", str(home))
    assert r.returncode == 2 and "not a course workspace" in r.stderr
    r = run("workspace", "restore", str(home / "ws/exercises/02_ddp/mnist_classify_ddp.py"))
    assert r.returncode == 0 and "mnist_classify_ddp.py.mine" in r.stdout, r.stderr
    assert (home / "ws/exercises/02_ddp/mnist_classify_ddp.py.mine").read_text() == "# mine\n"
    prefix = home / "env"
    (prefix / "etc/jupyter/labconfig").mkdir(parents=True)
    (prefix / "etc/jupyter/labconfig/page_config.json").write_text('{"disabledExtensions": {"other": true}}')
    r = run("lab-settings", "--prefix", str(prefix))
    assert r.returncode == 0, r.stderr
    page = json.loads((prefix / "etc/jupyter/labconfig/page_config.json").read_text())
    assert page["disabledExtensions"] == {"other": True, **hub.DISABLED}
    overrides = json.loads((prefix / "share/jupyter/lab/settings/overrides.json").read_text())
    assert overrides["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"


def _submit_then_attach(ws: Path, env: dict) -> tuple[str, str]:
    """One process (a kernel) submits a job; another (the kernel after a restart) lists it and follows it. The job
    ticks until that process has attached (it writes ``attached``; 240 s at most): a job of fixed length could end
    before a slow start of the second process (CI under load: COMPLETED already when it attached)."""
    script = ws / "slow.py"
    attached = ws / "attached"
    script.write_text(f"import os, time\nfor i in range(1200):\n    print('tick', i, flush=True)\n"
                      f"    if i >= 5 and os.path.exists({str(attached)!r}): break\n    time.sleep(0.2)\n")
    kernel = lambda code: subprocess.run([PYTHON, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                                         cwd=ws / "notebooks", env=dict(ENV, **env), timeout=300)
    r = kernel(f"""
        from course_lib import jobs
        job = jobs.submit(jobs.JobSpec("tick", {str(script)!r}, launcher="python"))
        print(job.id)""")
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.split()[-1]
    r = kernel(f"""
        from course_lib import jobs
        listed = jobs.list()
        print([j.id for j in listed if not isinstance(j, tuple)])
        job = jobs.attach({job_id!r})
        print("attached while", job.state, type(job).__name__)
        open({str(attached)!r}, "w").close()
        job.wait(timeout=240, progress=False)
        print(job.state, job.run_dir)
        print(job.log())""")
    assert r.returncode == 0, r.stderr
    assert f"'{job_id}'" in r.stdout.splitlines()[0]
    assert f"COMPLETED {ws / 'jobs' / 'runs'}" in r.stdout and "tick 5" in r.stdout, r.stdout
    return job_id, r.stdout


@pytest.mark.slow
def test_jobs_list_and_attach_after_a_restart_local(home, monkeypatch):
    ws = workspace.init(home / "ws")
    _, out = _submit_then_attach(ws, {"COURSE_ENGINE": "local", "COURSE_SITE": "local"})
    assert "attached while RUNNING LocalJob" in out or "attached while PENDING LocalJob" in out, out
    with pytest.raises(LookupError, match="no run folder for job nope"):
        from course_lib import jobs

        os.chdir(ws)
        jobs.attach("nope")


@pytest.mark.slow
@pytest.mark.slurm
def test_jobs_list_and_attach_after_a_restart_slurm(home, slurm):
    ws = workspace.init(home / "ws")
    _, out = _submit_then_attach(ws, {**slurm.env, "SLURM_CONF": str(slurm.conf)})
    assert "SlurmJob" in out and "attached while" in out, out


@pytest.mark.slow
def test_notebook_05_from_two_workspaces_of_one_install(home, monkeypatch):
    """The one holding a correct allreduce.py passes STRICT and shows what test_papermill asks of 05 against the
    solutions (it is that run: test_notebooks.IN_A_WORKSPACE); the one with the starter fails; install untouched."""
    import papermill as pm
    from test_notebooks import IN_A_WORKSPACE, assert_solutions_run, text_of

    from course_lib.instructor.papermill_guard import ENGINE

    before = tree_digest(paths.course_root())
    monkeypatch.setenv("COURSE_QUICK", "1"); monkeypatch.setenv("COURSE_ENGINE", "local")
    good, starter = workspace.init(home / "good"), workspace.init(home / "starter")
    shutil.copyfile(ROOT / "solutions/05_allreduce/allreduce.py", good / "exercises/05_allreduce/allreduce.py")
    runs = {}
    for ws in (good, starter):
        out = ws / "out" / "05.ipynb"
        try:
            pm.execute_notebook(str(ws / "notebooks/05_allreduce_algorithms.ipynb"), str(out),
                                parameters={"TREE": "exercises", "STRICT": True,
                                            "ANSWERS": "key" if ws == good else None},   # quiz.AUTO
                                cwd=str(ws / "notebooks"), kernel_name="python3", execution_timeout=600,
                                progress_bar=False, engine_name=ENGINE)
            runs[ws.name] = "passed"
        except pm.PapermillExecutionError as e:
            runs[ws.name] = f"failed: {e.evalue[:300]}"
        assert "your file: exercises/05_allreduce/allreduce.py" in out.read_text()
    assert runs["good"] == "passed", runs
    # test_notebooks leaves exactly this notebook's solutions run to this test
    assert IN_A_WORKSPACE == ("05_allreduce_algorithms",), IN_A_WORKSPACE
    assert_solutions_run("05_allreduce_algorithms", text_of(good / "out" / "05.ipynb"), "solution's file, workspace")
    assert runs["starter"].startswith("failed: check failed (STRICT=True)"), runs
    assert tree_digest(paths.course_root()) == before, "the install's notebooks/exercises/solutions changed"


def test_course_out_dir_names_where_outputs_go(tmp_path, monkeypatch):
    monkeypatch.delenv("COURSE_OUT_DIR", raising=False)
    assert paths.out_dir() == paths.workspace() / "out"
    monkeypatch.setenv("COURSE_OUT_DIR", str(tmp_path / "mine"))
    assert paths.out_dir() == tmp_path / "mine"


@pytest.mark.slow
def test_update_from_anywhere_as_a_learner_never_points_at_the_install():
    """As a learner account (the install, this checkout, is root's and read-only to them): `course
    update` works from inside the workspace's sub-folders and from the home folder a hub terminal could open in,
    and where there is no workspace it says to give one, never to make one in the install (issue 55)."""
    import hub_support as hs

    env = hs.course_as_others()
    if isinstance(env, str):
        pytest.skip(env)
    learner, other = hs.account("hubwslearner1"), hs.account("hubwslearner2")
    home = Path(learner.pw_dir)
    shutil.rmtree(home / "course", ignore_errors=True)
    shutil.rmtree(Path(other.pw_dir) / "course", ignore_errors=True)
    course = [hs.SYSTEM_PYTHON, "-m", "course_lib.cli", "workspace"]
    made = hs.run_as(learner.pw_name, [*course, "init", home / "course"], env)
    assert made.returncode == 0, made.stderr
    try:
        for cwd in (home / "course" / "exercises" / "05_allreduce", home / "course", home):
            p = hs.run_as(learner.pw_name, [*course, "update"], env, cwd=str(cwd))
            assert p.returncode == 0, (cwd, p.stdout, p.stderr)
            assert f"updating {home / 'course'} from {ROOT}" in p.stdout, (cwd, p.stdout)
        for argv, cwd in (([*course, "update"], "/tmp"), ([*course, "update", ROOT], "/tmp"),
                          ([*course, "update"], str(ROOT / "exercises"))):
            p = hs.run_as(other.pw_name, argv, env, cwd=cwd)
            assert p.returncode == 2 and "course update ~/course" in p.stderr, (argv, cwd, p.stderr)
            assert "init" not in p.stderr, (argv, cwd, p.stderr)
    finally:
        shutil.rmtree(home / "course", ignore_errors=True)


def test_a_notebook_the_learner_only_ran_is_updated(home, fake_install):
    """Outputs and execution counts are no edit: such a notebook takes the course's new version; one whose cells
    the learner changed is kept, and the course's version beside it opens as a notebook (NAME.course-new.ipynb)."""
    ws = workspace.init(home / "ws")
    ran, edited = ws / "notebooks/00_welcome.ipynb", ws / "notebooks/01_serial_mnist.ipynb"
    for path, edit in ((ran, False), (edited, True)):
        nb = json.loads(path.read_text())
        code = next(c for c in nb["cells"] if c["cell_type"] == "code")
        code["execution_count"], code["outputs"] = 1, [{"output_type": "stream", "name": "stdout", "text": ["ran\n"]}]
        nb["metadata"]["widgets"] = {"state": {}}
        if edit:
            code["source"] = "x = 1  # mine\n"
        path.write_text(json.dumps(nb))
    for name in ("00_welcome", "01_serial_mnist"):   # the course changes both notebooks
        path = fake_install / "notebooks" / f"{name}.ipynb"
        nb = json.loads(path.read_text())
        nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": "newer"})
        path.write_text(json.dumps(nb))
    result = workspace.update(ws)
    assert result["ran"] == ["notebooks/00_welcome.ipynb"], result
    assert json.loads(ran.read_text())["cells"][-1]["source"] == "newer"
    assert result["kept"] == ["notebooks/01_serial_mnist.ipynb"]
    assert result["beside"] == ["notebooks/01_serial_mnist.course-new.ipynb"]
    assert "x = 1  # mine" in edited.read_text()
    assert json.loads((ws / result["beside"][0]).read_text())["cells"][-1]["source"] == "newer"
    # run again after the update: still no edit, and the next course's version comes in as well
    nb = json.loads(ran.read_text())
    nb["cells"][0]["outputs"] = []
    nb["cells"][0]["execution_count"] = 7
    ran.write_text(json.dumps(nb))
    path = fake_install / "notebooks/00_welcome.ipynb"
    newest = json.loads(path.read_text())
    newest["cells"].append({"cell_type": "markdown", "metadata": {}, "source": "newest"})
    path.write_text(json.dumps(newest))
    assert workspace.update(ws)["ran"] == ["notebooks/00_welcome.ipynb"]
