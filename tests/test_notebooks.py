"""Every notebooks/*.ipynb follows the notebook protocol and runs headless (papermill, nbval).

- metadata: kernelspec, a ``parameters`` cell with the protocol's defaults, no stale outputs (only cells
  whose first line is ``# NBVAL_CHECK_OUTPUT`` keep theirs), no execution leftovers;
- papermill against solutions/ with ``TREE="solutions", QUICK=True, STRICT=True``: all checks green (not for a
  notebook whose code never reads TREE (none at present): its exercises run below is the same run, and shows no
  FAIL; nor for
  03 and 04 where the local Slurm runs: tests/test_jobs_notebooks.py runs them against solutions/ there, asserting
  the same;
  nor for 05: tests/test_workspace.py runs it on the solution's file in a learner workspace, asserting the same;
  nor for 02, 06 and 09 where the real hub runs: tests/test_hub.py runs them from a learner's workspace with the
  site's checks and runs on Slurm, asserting the same and more);
- nbval ``--nbval-lax`` against exercises/ with ``COURSE_QUICK=1`` (the default parameters a learner gets,
  so the quizzes are widgets nobody clicks): every cell runs, the checked cells print what is committed, and
  the outputs (saved by tests/nbval_outputs.py) show the red checks. One run does both: a second execution of
  the same notebook, as papermill, only repeated it (the auto-answered quiz texts are tested in test_quiz.py).
Both runs use the local engine; tests/test_jobs_notebooks.py runs 03 and 04 on the real Slurm.

New notebooks are picked up by the glob.
"""
import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import hub_support
import pytest
from conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
CHECKED = "# NBVAL_CHECK_OUTPUT"
DEADLINE = 600      # seconds for one notebook run (QUICK runs take 15-140 s on a quiet 2-core CI machine)

notebooks = pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.stem)


def test_every_exercise_notebook_is_there():
    """A moved or renamed notebook fails here (the parametrized tests would only lose a case)."""
    from course_lib.registry import EXERCISES

    missing = {e.notebook for e in EXERCISES.values()} - {p.stem for p in NOTEBOOKS}
    assert NOTEBOOKS and not missing, f"not in notebooks/: {sorted(missing)}"


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def source(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def same_in_both_trees(path: Path) -> bool:
    """No code cell but the parameters cell reads TREE: the run against exercises/ executes exactly the
    solutions' code (only the quiz answers differ), so a second run against solutions/ would repeat it."""
    cells = [c for c in load(path)["cells"] if c["cell_type"] == "code"
             and "parameters" not in c.get("metadata", {}).get("tags", [])]
    return not any("TREE" in source(c) for c in cells)


# Run against solutions/ on the real Slurm by tests/test_jobs_notebooks.py, which asserts what test_papermill
# asserts of them (EXPECT, no FAIL): where that Slurm can start (root, Debian's slurmctld), a local run would repeat
# it; elsewhere test_papermill runs them. What 03 shows only on the local engine is asserted of its exercises run.
ON_SLURM = ("03_launching_jobs", "04_scaling_study")
# Run against the solution's code by tests/test_workspace.py, from a learner workspace that holds the solution's file
# (STRICT, the quizzes answered with their key), which asserts what test_papermill asserts of it: a second run of the
# same code here would only repeat it.
IN_A_WORKSPACE = ("05_allreduce_algorithms",)
# Run against the solutions' files by tests/test_hub.py's test_notebook_runs_go_to_slurm_as_the_learners_jobs, from a
# learner's workspace on the real hub with the site's checks and runs on Slurm (hub_support.ON_SLURM_NOTEBOOKS),
# which asserts what test_papermill asserts of them and more: where that hub runs, a local run would repeat it. The
# local engine's path through them is run against the exercises (test_nbval_lax_against_exercises).
ON_THE_HUB = tuple(s for s in hub_support.ON_SLURM_NOTEBOOKS if s not in ON_SLURM + IN_A_WORKSPACE)


def slurm_runs_here() -> bool:
    import shutil
    return os.geteuid() == 0 and all(shutil.which(t) for t in ("slurmctld", "slurmd", "munged", "sbatch"))


against_solutions = pytest.mark.parametrize(
    "nb_path", [p for p in NOTEBOOKS if not same_in_both_trees(p) and p.stem not in IN_A_WORKSPACE
                and not (p.stem in ON_SLURM and slurm_runs_here())
                and not (p.stem in ON_THE_HUB and hub_support.why_not() is None)],
    ids=lambda p: p.stem)


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
def test_core_is_reached_through_nb_only(nb_path):
    """A notebook (and a script it writes) takes what it needs of course_lib.core from course_lib.nb, so that the
    core can change under the notebooks without editing them."""
    reached = sorted({m for c in load(nb_path)["cells"] if c["cell_type"] == "code"
                      for m in re.findall(r"(?:from|import)\s+(course_lib\.core[\w.]*)", source(c))})
    assert not reached, f"{nb_path.name} imports {reached}: take the name from course_lib.nb"


@notebooks
def test_no_stale_outputs(nb_path):
    nb = load(nb_path)
    assert "papermill" not in nb["metadata"], f"{nb_path.name}: committed from a papermill run; clear it"
    assert "widgets" not in nb["metadata"], f"{nb_path.name}: widget state is committed; clear it"
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        first = source(cell).strip().splitlines()[0][:60] if source(cell).strip() else "empty"
        where = f"{nb_path.name} cell {i} ({first})"
        assert "papermill" not in cell.get("metadata", {}), f"{where}: papermill metadata committed"
        if source(cell).startswith(CHECKED):
            assert cell.get("outputs"), f"{where}: an nbval-checked cell needs its committed output"
            assert not any(o.get("output_type") == "error" for o in cell["outputs"]), f"{where}: an error is committed"
        else:
            assert not cell.get("outputs"), \
                f"{where}: committed with outputs; clear them (only {CHECKED} cells keep theirs)"
            assert cell.get("execution_count") is None, f"{where}: execution count committed; clear outputs"


# What each run must show besides running to the end (substrings of the outputs' text).
# a check's table row (course_lib.core.report's html) from its result to its item
PASS_AT, FAIL_AT = (f"{r}</b></td><td style='white-space:nowrap'>" for r in ("PASS", "FAIL"))
EXPECT = {
    ("00_welcome", "solutions"): ["PASS    2 ranks (gloo)", "you predicted 'NCCL'; what happened: ",
                                  "right. exercises/ holds"],
    ("00_welcome", "exercises"): ["VBox(", "you made no prediction for this one (Run All does not wait"],
    ("01_serial_mnist", "exercises"): ["VBox(", "(serial-baseline, local): COMPLETED", "images/s   first epoch",
                                       "you made no prediction for this one (Run All does not wait", "rank 0: step "],
    ("02_ddp_six_steps", "solutions"): ["what happened: \"the same as epoch 1's\" (right)",
                                        "you predicted 0x; measured",
                                        "right. DDP all-reduces"],
    # a check's table (html): a red FAIL, then the item; nbval compared a printed brief of it, committed in a cell a
    # learner then saw before running anything (issue 53)
    ("02_ddp_six_steps", "exercises"): [*(f"{FAIL_AT}Step {n}<" for n in range(1, 7)),
                                        "you made no prediction for this one (Run All does not wait"],
    # 03's solutions run is on Slurm where it runs (ON_SLURM): what the local engine shows is asserted of the
    # exercises run, whose jobs are the same (the notebook submits them; the learner's files are only checked)
    ("03_launching_jobs", "solutions"): ["VBox(", "MASTER_ADDR", "PASS    MASTER_ADDR/PORT",
                                         "export NCCL_IB_HCA=mlx5",
                                         "what happened: \"no, each is its own shard's\" (right)",
                                         "right. seff summarises", "no GPU log: this job ran on CPU",
                                         "%CPU, peak", "you predicted 0%; measured"],
    ("03_launching_jobs", "exercises"): ["FAIL", "FAIL    MASTER_ADDR/PORT", "VBox(", "(ddp-srun, local): COMPLETED",
                                         "no Slurm here (", "no GPU log: this job ran on CPU", "%CPU, peak"],
    ("04_scaling_study", "solutions"): ["<th>speedup</th>", "<th>weak efficiency</th>", "1 -> 2 ranks",
                                        "predicted all-reduce share of a 2-rank step", "(linear) + warm-up",
                                        "right. Twice the ranks", "during backward compute",
                                        "what happened: \"after backward's last gradient\""],
    ("04_scaling_study", "exercises"): ["FAIL", "you made no prediction for this one (Run All does not wait",
                                        "is not converted to DDP yet"],
    ("05_allreduce_algorithms", "solutions"): [f"{PASS_AT}ring_allreduce<", "ring/gloo busbw at >= 16 MiB",
                                               "what happened: '[6, 60, 600]' (right)", "right. nccl-tests"],
    ("05_allreduce_algorithms", "exercises"): [*(f"{FAIL_AT}{a}_allreduce<" for a in ("naive", "ring", "tree")),
                                               "skipped ring: raised NotImplementedError",
                                               "your ring did not run"],
    ("06_tensor_parallelism", "solutions"): ["what happened: '[0, 4]' (right)", "measured 0.5", "right. A tp group"],
    ("06_tensor_parallelism", "exercises"): ["FAIL", "you made no prediction for this one (Run All does not wait"],
    ("11_context_parallelism", "solutions"): [f"{PASS_AT}ring_attention<", "largest difference from serial: ",
                                              "what happened: 'about 7x' (right)", "right. Linear layers, the MLP"],
    ("11_context_parallelism", "exercises"): [*(f"{FAIL_AT}{f}<" for f in ("split_positions", "cp_attention",
                                                                                   "ring_attention")),
                                              "the dp x cp run failed (fix cp.py",
                                              "  4   256      248.0        248.0   0.0%",   # saved bytes = formula
                                              "you made no prediction for this one (Run All does not wait"],
    ("08_checkpoint_restart", "solutions"): ["EQUAL: ", "predicted 'step 12'; what happened: 'step 12' (right)"],
    ("08_checkpoint_restart", "exercises"): [*(f"{FAIL_AT}{i}<" for i in ("optimizer", "atomic write")),
                                             "you made no prediction for this one (Run All does not wait"],
    ("09_sharded_data_parallel", "solutions"): ["every micro-batch", "W=4 ZeRO-2: largest |loss - DDP's loss|",
                                                "optimizer state KiB", f"{PASS_AT}ZeRO-2<"],
    ("09_sharded_data_parallel", "exercises"): ["ZeRO-1 did not run", f"{FAIL_AT}shard_range<"],
    ("07_bug_hunt", "solutions"): ["rank 1: step done", "rank 0 epoch 1:", "PASS    ranks and GPUs",
                                   "quiz 07: 9/9 right"],
    ("07_bug_hunt", "exercises"): ["Timed out", "Detected mismatch between collectives", "1/2 clients joined",
                                   "192.0.2.1", "can't allocate memory",
                                   # the starter's 02 script picks no GPU by local rank: the checker cannot tell
                                   "NOT RUN ranks and GPUs", "every rank that failed only waited for another",
                                   "rank 1 failed on its own"],
    ("10_write_ddp_yourself", "solutions"): [f"{PASS_AT}bucketed<", "comm share",
                                             "alpha-beta fit to this run's all-reduces",
                                             "right. Backward runs from the loss", "rank 0, bucketed: all-reduce"],
    ("10_write_ddp_yourself", "exercises"): [*(f"{FAIL_AT}{w}<" for w in ("naive", "flat", "overlapped",
                                                                                 "bucketed")),
                                             "naive did not run: not written yet",
                                             "you made no prediction for this one"],
    ("12_pipeline_parallelism", "solutions"): [f"{PASS_AT}one_f_one_b<", "bubble vs formula: ", "(expected m)",
                                               "one_f_one_b, p=4, m=8: step", "  stage 3: busy ",
                                               "m=8: [4, 3, 2, 1]   (expected min(p - stage, m))",
                                               "what happened: '[0, 1]' (right)", "dp x pp vs serial: largest",
                                               "right. 1F1B reorders"],
    ("12_pipeline_parallelism", "exercises"): [*(f"{FAIL_AT}{f}<" for f in ("communicate", "afab",
                                                                                     "one_f_one_b")),
                                               "the measurement did not run",
                                               "the dp x pp run failed",
                                               "you made no prediction for this one (Run All does not wait"],
}


def text_of(path: Path) -> str:
    """Everything the executed notebook shows: streams, HTML or plain text of displays and results."""
    return text_of_cells(load(path)["cells"])


def text_of_cells(cells) -> str:
    parts = []
    for cell in cells:
        for o in cell.get("outputs", []):
            if o["output_type"] == "stream":
                parts.append(source({"source": o["text"]}))
            elif o["output_type"] in ("display_data", "execute_result"):
                data = o.get("data", {})
                parts.append(source({"source": data.get("text/html") or data.get("text/plain", "")}))
    return "\n".join(parts)


# The first day's notebooks, run cell by cell by a new learner: nothing in them writes to stderr or raises (Jupyter
# shows both in red), neither the course's own messages nor a library's warnings
NO_RED_TEXT = ("00", "01", "02", "03", "04")


def red_text(cells) -> list[str]:
    """Each cell's stderr text or error, shortened: what Jupyter shows in red."""
    red = []
    for cell in cells:
        for o in cell.get("outputs", []):
            if o["output_type"] == "stream" and o.get("name") == "stderr":
                red.append(f"{cell['cell']}: {source({'source': o['text']}).strip()[:200]!r}")
            elif o["output_type"] == "error":
                red.append(f"{cell['cell']}: {o.get('ename')}: {o.get('evalue', '')[:200]}")
    return red


# A reveal's verdict lines (course_lib.quiz.reveal_text); a figure there with five or more decimals is unrounded
REVEAL_LINE = re.compile(r"^(?:you predicted .*|you made no prediction .*|What happened: .*)$", re.M)
UNROUNDED = re.compile(r"\d\.\d{5,}")


def unreadable_reveals(cells) -> list[str]:
    """What a learner should not see in the outputs: a reveal's text shown a second time as a cell's value (a
    quoted string with literal \\n), and unrounded figures in a reveal's verdict."""
    found = []
    for cell in cells:
        for o in cell.get("outputs", []):
            if o["output_type"] == "execute_result":
                plain = source({"source": o.get("data", {}).get("text/plain", "")})
                if plain[:1] in ("'", '"') and any(s in plain for s in ("\\n", "predicted", "happened")):
                    found.append(f"a string echoed as the cell's value: {plain[:160]}")
            elif o["output_type"] == "stream":
                found += [f"an unrounded figure: {line[:160]}"
                          for line in REVEAL_LINE.findall(source({"source": o["text"]})) if UNROUNDED.search(line)]
    return found


def missing_from(text: str, wanted: list[str]) -> str:
    """"" if ``text`` shows every string in ``wanted``; else which it lacks, each with the lines of ``text`` that
    share its first words, so that a failure says what the notebook showed instead."""
    report = []
    for s in wanted:
        if s not in text:
            lead = s[:12]
            near = [line for line in text.splitlines() if lead in line][:5]
            report.append(f"{s!r} (lines with {lead!r}: {near or 'none'})")
    return "does not show " + "; ".join(report) if report else ""


def assert_solutions_run(stem: str, text: str, where: str) -> None:
    """What test_papermill asserts of a run against the solutions' code, for the tests it leaves one to (ON_SLURM,
    IN_A_WORKSPACE): every string of EXPECT[(stem, "solutions")], and no red check."""
    missing = missing_from(text, EXPECT[(stem, "solutions")])
    assert not missing, f"{stem} ({where}) ran but {missing}"
    assert "FAIL" not in text, f"{stem} ({where}): a check failed against the solutions' code"


@pytest.mark.slow
@against_solutions
@pytest.mark.parametrize("tree", ["solutions"])
def test_papermill(nb_path, tree, tmp_path, monkeypatch):
    """Against solutions/ every check passes (STRICT=True turns a red check into an error) and every quiz is
    answered with its key."""
    import papermill as pm

    from course_lib.instructor.papermill_guard import ENGINE

    monkeypatch.setenv("COURSE_QUICK", "1")    # the kernel inherits it, as in CI
    monkeypatch.setenv("COURSE_ENGINE", "local")   # the Slurm runs are in test_jobs_notebooks.py
    monkeypatch.setenv("COURSE_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("COURSE_OUT_DIR", str(tmp_path / "out"))   # its own answers: runs of one notebook overlap
    out = tmp_path / nb_path.name
    pm.execute_notebook(str(nb_path), str(out),
                        parameters={"TREE": tree, "QUICK": True, "STRICT": tree == "solutions",
                                    "ANSWERS": "key" if tree == "solutions" else "first"},   # quiz.AUTO
                        cwd=str(nb_path.parent), kernel_name="python3", execution_timeout=DEADLINE,
                        progress_bar=False, engine_name=ENGINE)
    text = text_of(out)
    missing = missing_from(text, EXPECT.get((nb_path.stem, tree), []))
    assert not missing, f"{nb_path.name} ({tree}) ran but {missing}"
    unreadable = unreadable_reveals(load(out)["cells"])
    assert not unreadable, f"{nb_path.name} ({tree}) shows " + "; ".join(unreadable)
    if tree == "solutions":
        assert "FAIL" not in text, f"{nb_path.name}: a check failed against the solutions"


@pytest.mark.slow
@notebooks
def test_nbval_lax_against_exercises(nb_path, tmp_path):
    """Default parameters with COURSE_QUICK=1: the quick run against the starter exercises, checked by nbval;
    it runs to the end and shows the red checks, and the predictions nobody made are said to be missing."""
    outputs = tmp_path / "outputs.jsonl"
    env = dict(os.environ, COURSE_QUICK="1", COURSE_OUT_DIR=str(tmp_path / "out"), COURSE_ENGINE="local",
               COURSE_RUNS_DIR=str(tmp_path / "runs"), NBVAL_OUTPUTS=str(outputs),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")])))
    p = subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "-q", "-p", "no:cacheprovider",
                        "-p", "nbval_outputs", "--nbval-cell-timeout", str(DEADLINE), "-o", "addopts=",
                        str(nb_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE + 120)
    assert p.returncode == 0, f"nbval failed on {nb_path.name}:\n{p.stdout[-6000:]}\n{p.stderr[-2000:]}"
    cells = [json.loads(line) for line in outputs.read_text(encoding="utf-8").splitlines()]
    assert cells, f"no outputs saved by tests/nbval_outputs.py:\n{p.stdout[-2000:]}"
    text = text_of_cells(cells)
    missing = missing_from(text, EXPECT.get((nb_path.stem, "exercises"), []))
    assert not missing, f"{nb_path.name} (exercises) ran but {missing}"
    unreadable = unreadable_reveals(cells)
    assert not unreadable, f"{nb_path.name} (exercises) shows " + "; ".join(unreadable)
    if nb_path.stem[:2] in NO_RED_TEXT:
        red = red_text(cells)
        assert not red, f"{nb_path.name} (exercises) shows red text a learner would take for an error: {red}"
    if same_in_both_trees(nb_path):   # it ran the solutions' code: what test_papermill asks of those
        assert "FAIL" not in text, f"{nb_path.name}: a check failed against the solutions' code"


def test_a_notebook_that_reads_tree_is_run_against_solutions_too(tmp_path):
    nb = {"cells": [{"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": ["TREE = 'exercises'"]},
                    {"cell_type": "code", "metadata": {}, "source": ["print(1)"]}]}
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps(nb))
    assert same_in_both_trees(path)
    nb["cells"][1]["source"] = ["SCRIPT = exercise_path(TREE, 'a.py')"]
    path.write_text(json.dumps(nb))
    assert not same_in_both_trees(path)
    assert [p.stem for p in NOTEBOOKS if same_in_both_trees(p)] == []   # 01 reads TREE since its step.py exercise


def test_the_reveal_scan_finds_an_echoed_reveal_and_an_unrounded_figure():
    echoed = {"output_type": "execute_result", "data": {"text/plain": "'you predicted 3; measured 2\\nwhy'"}}
    raw = {"output_type": "stream", "name": "stdout",
           "text": "you made no prediction for this one\nWhat happened: 2.212373791999653\n"}
    fine = {"output_type": "stream", "name": "stdout", "text": ["you predicted 3 s; measured 2.21 s (36% off)\n",
                                                                "epoch 1: {0: 0.2981234}\n"]}
    found = unreadable_reveals([{"outputs": [echoed, raw, fine]}])
    assert len(found) == 2 and "echoed" in found[0] and "2.212373791999653" in found[1], found
    value = {"output_type": "execute_result", "data": {"text/plain": "42"}}
    assert unreadable_reveals([{"outputs": [fine, value]}]) == []
