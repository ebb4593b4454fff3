"""The DDP solution of notebook 02: the diff is the lesson, the exercise is generated and runs, the
solution shuts down cleanly every time, and W ranks with batch b train exactly like serial with batch W*b."""
import ast
import os
import re
import signal
import subprocess
import sys

import pytest
from conftest import ROOT

from course_lib.ddp import stepdiff
from course_lib.instructor import release
from course_lib.runtime import warm
from course_lib.runtime.launch import launch

SERIAL = ROOT / "solutions" / "01_serial" / "mnist_classify.py"
SOLUTION = ROOT / "solutions" / "02_ddp" / "mnist_classify_ddp.py"
EXERCISE = ROOT / "exercises" / "02_ddp" / "mnist_classify_ddp.py"
DRIVER = ROOT / "tests" / "ddp_equivalence_driver.py"


def test_every_hunk_of_the_diff_names_its_step():
    hunks = stepdiff.hunks()
    code = [h for h in hunks if not h.in_docstring]
    assert len(code) >= 6, "the diff serial -> DDP should have a hunk per step at least"
    unmarked = [h.text() for h in code if not h.steps]
    assert not unmarked, "hunks without a '# Step N' marker:\n\n" + "\n\n".join(unmarked)
    assert set().union(*(h.steps for h in code)) == {1, 2, 3, 4, 5, 6}


def test_the_marker_test_can_fail():
    serial = SERIAL.read_text()
    changed = serial.replace('"shuffle": True}', '"shuffle": False}')
    assert any(not h.steps and not h.in_docstring for h in stepdiff.hunks(serial, changed))


def test_exercise_is_generated_from_the_solution():
    assert EXERCISE.read_text() == release.exercise_view(SOLUTION.read_text(), str(SOLUTION)), \
        "exercises/02_ddp is out of date: run `course release`"


def _code_only(text: str) -> str:
    """The program without its module docstring and comments (what runs)."""
    tree = ast.parse(text)
    if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant):
        tree.body = tree.body[1:]
    return ast.dump(tree)


def test_exercise_is_the_serial_script_plus_todos():
    # it runs as it is: the same program as the serial one, with a TODO comment where each step goes
    exercise = EXERCISE.read_text()
    assert _code_only(exercise) == _code_only(SERIAL.read_text())
    todos = {int(n) for n in re.findall(r"# TODO Step (\d)", exercise)}
    assert todos == {1, 2, 3, 4, 5, 6}


def test_solution_view_has_no_markers():
    clean = release.solution_view(SOLUTION.read_text())
    assert "BEGIN SOLUTION" not in clean and "# STUB" not in clean and "TODO" not in clean
    compile(clean, str(SOLUTION), "exec")


# runs a script as if course_lib were not installed (-I: no PYTHONPATH, no user site; this finder answers before
# the editable install's), and torchvision neither unless a stand-in is put first on the path (argv[1], or "")
WITHOUT_COURSE_LIB = """
import runpy, sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        hidden = ("course_lib",) if sys.argv[1] else ("course_lib", "torchvision")
        if name.split(".")[0] in hidden:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hide())
sys.path.insert(0, sys.argv[1])
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
# a stand-in for torchvision: MNIST is 96 random images (what matters is the script around it)
FAKE_TORCHVISION = {
    "__init__.py": "",
    "transforms.py": "Compose = ToTensor = Normalize = lambda *a, **k: None\n",
    "datasets.py": "import torch\n"
                   "from torch.utils.data import TensorDataset\n\n\n"
                   "def MNIST(root, train, download, transform):\n"
                   "    g = torch.Generator().manual_seed(int(train))\n"
                   "    return TensorDataset(torch.randn(96, 1, 28, 28, generator=g),\n"
                   "                         torch.randint(0, 10, (96,), generator=g))\n",
}


def _without_course_lib(script, tmp_path, args, torchvision=""):
    copy = tmp_path / script.name
    copy.write_text(release.solution_view(script.read_text()))
    return subprocess.run([sys.executable, "-I", "-c", WITHOUT_COURSE_LIB, torchvision, str(copy), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


@pytest.mark.slow   # a multi-process run: make test, not test-fast
def test_scripts_say_what_to_install_without_course_lib_or_torchvision(tmp_path):
    # copied to a cluster without the course and without torchvision: one line saying what to do
    for script in (SERIAL, SOLUTION):
        out = _without_course_lib(script, tmp_path, ["--dataset", "mnist"])
        assert out.returncode == 1, out.stdout + out.stderr
        assert out.stderr.strip().splitlines() == [
            "no course_lib and no torchvision here: install the course (pip install -e COURSE_FOLDER) "
            "or torchvision (pip install torchvision) to load MNIST"], out.stderr


@pytest.mark.slow   # a run of the training script in its own process: make test, not test-fast
def test_serial_script_trains_on_torchvision_without_course_lib(tmp_path):
    import torch

    from course_lib.metrics import parse_epoch_lines
    from course_lib.model import Net
    fake = tmp_path / "fake" / "torchvision"
    fake.mkdir(parents=True)
    for name, text in FAKE_TORCHVISION.items():
        (fake / name).write_text(text)
    out = _without_course_lib(SERIAL, tmp_path, ["--epochs", "1", "--save-model"], torchvision=str(fake.parent))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "dataset=mnist train=96 test=96" in out.stdout, out.stdout
    assert [r["epoch"] for r in parse_epoch_lines(out.stdout)] == [1], out.stdout
    Net().load_state_dict(torch.load(tmp_path / "mnist_cnn.pt", weights_only=True), strict=True)


def _run(script, nprocs, args, cwd, env=None, timeout=180):
    lines = []
    with warm.session(env, warm.DDP_IMPORTS):   # ranks forked after one import of torch: a cold start costs seconds
        res = launch([str(script), *args], nprocs=nprocs, timeout=timeout, cwd=cwd, env=env,
                     on_line=lambda r, line: lines.append(f"[rank {r}] {line}"))
    return res, "\n".join(lines)


@pytest.mark.slow
def test_solution_trains_and_prints_epoch_lines(tmp_path):
    import torch

    from course_lib.metrics import parse_epoch_lines
    from course_lib.model import Net
    res, out = _run(SOLUTION, 2, ["--dataset", "digits", "--epochs", "1", "--save-model"], tmp_path)
    assert res.ok, res.summary()
    recs = parse_epoch_lines(out, rank=None)
    assert sorted(r["rank"] for r in recs) == [0, 1], out
    for r in recs:
        # per rank: its half of the 1438 images; total: the whole set, in the same epoch time
        assert r["images_per_s"] == pytest.approx(1438 / r["epoch_s"], rel=0.01)
        assert r["images_per_s_rank"] == pytest.approx(719 / r["epoch_s"], rel=0.01)
    Net().load_state_dict(torch.load(tmp_path / "mnist_cnn.pt", weights_only=True), strict=True)


@pytest.mark.slow
def test_solution_shuts_down_cleanly_20_times(tmp_path):
    # the Gloo + DDP exit abort ("terminate called without an active exception") shows in a few percent
    # of runs when the DDP model outlives destroy_process_group(); the solution drops it first.
    # 20 real 2-rank runs, judged one by one. Their ranks are forked from a server that imported torch once (a cold
    # start costs 2.5x the CPU of the whole run) and leave the way `python script.py` does, where the abort happens.
    args = ["--dataset", "digits", "--epochs", "1", "--dry-run", "--test-batch-size", "400"]
    failures = []
    with warm.session({}, warm.DDP_IMPORTS) as server:
        assert server is not None and server.ready(), "no warm server: the runs would not be the ones meant here"
        for run in range(20):
            res, out = _run(SOLUTION, 2, args, tmp_path, timeout=120)
            if not res.ok or "terminate called" in out:
                failures.append(f"run {run}: {res.summary()}\n{out[-1500:]}")
    assert not failures, "\n".join(failures)


TEARDOWN_ABORT = """import os, time
print(f"rank {os.getpid()} forked by {os.getppid()}", flush=True)
class Last:
    def __del__(self):   # runs in the interpreter's teardown, which os._exit skips
        os.write(2, b"terminate called at teardown\\n")
        os.abort()
last = Last()
if os.environ["SLURM_PROCID"] == "1":
    time.sleep(600)
"""


@pytest.mark.slow
def test_a_warm_rank_leaves_through_the_interpreters_teardown(tmp_path):
    # what the 20 runs rely on: a forked rank's __main__ is torn down as python's own is, with no setting, so an
    # abort there shows (and the rank that hangs is stopped)
    script = tmp_path / "ends_badly.py"
    script.write_text(TEARDOWN_ABORT)
    started = []
    res = launch([str(script)], nprocs=2, timeout=30, cwd=tmp_path, on_line=None, warm=True, on_start=started.append)
    # each rank says its parent itself: rank 0 ends at once, and a look from here after its start could find it gone
    said = [re.search(r"rank (\d+) forked by (\d+)", res.output(r)) for r in range(2)]
    assert all(said), res.summary()
    assert started == [int(m[1]) for m in said], f"on_start was told {started}: {res.summary()}"
    assert os.getpid() not in {int(m[2]) for m in said}, "the ranks were not forked by a server"
    assert [r.returncode for r in res.ranks] == [-signal.SIGABRT, None], res.summary()
    assert "terminate called at teardown" in res.output(0), res.summary()


def _params(path):
    import torch
    return torch.load(path, weights_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_ddp_equals_serial_with_the_global_batch(tmp_path, world):
    """W ranks x batch b, step for step, against the serial script with batch W*b: the same parameters.

    Dropout off and the serial script fed the sample order DistributedSampler uses (a permutation
    seeded with seed + epoch): then DDP's averaged gradient is the serial gradient of the global batch.
    """
    b, steps, epochs = 8, 3, 2
    env = {"EQUIV_TRAIN": str(world * b * steps), "EQUIV_SEED": "1"}
    args = ["--dataset", "digits", "--epochs", str(epochs), "--seed", "1", "--log-interval", "1000"]
    ddp_dir, serial_dir = tmp_path / "ddp", tmp_path / "serial"
    ddp_dir.mkdir(), serial_dir.mkdir()
    res, out = _run(DRIVER, world, [str(ddp_dir), str(SOLUTION), *args, "--batch-size", str(b)], tmp_path, env=env)
    assert res.ok, res.summary()
    serial = subprocess.run([sys.executable, str(DRIVER), str(serial_dir), str(SERIAL), *args,
                             "--batch-size", str(world * b)], env={**os.environ, **env, "EQUIV_SERIAL": "1"},
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert serial.returncode == 0, serial.stdout + serial.stderr
    reference = _params(serial_dir / "params-0.pt")
    assert len(reference) == steps * epochs
    for rank in range(world):
        trained = _params(ddp_dir / f"params-{rank}.pt")
        assert len(trained) == len(reference)
        for step, (mine, theirs) in enumerate(zip(trained, reference), 1):
            diff = float((mine - theirs).abs().max())
            assert diff < 1e-5, f"rank {rank}, step {step}: parameters differ from serial by {diff:.2e}"
    # and the comparison is not vacuous: the parameters moved
    assert float((reference[-1] - reference[0]).abs().max()) > 1e-3
