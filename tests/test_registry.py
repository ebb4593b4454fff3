"""The registry is the one place an exercise is described (issue 57, item 1).

Every exercise file a notebook hands the learner is a registry entry's (so ``course check`` and ``course grade``
know it), and no module outside the registry and the cases modules keeps a table keyed by exercise name (ranks on
Slurm, rounds, deadlock cases lived in check_slurm.py, check_local.py and bench_checks.py) or tells one exercise
from the others by its name (check.py's sbatch and ddp, sandbox_worker.py's ddp: now the registry's runs_here and
strict_launchers).
"""
import ast
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

from course_lib.registry import EXERCISES, UNCHECKED

# files the notebooks hand the learner that nothing checks: notebook 07's scripts, bugs the learner runs and
# diagnoses in the notebook (the serial script is under solutions/ only)
NOT_CHECKED = {UNCHECKED["bughunt"]}


def test_every_exercise_file_of_the_notebooks_is_in_the_registry():
    known = {e.file for e in EXERCISES.values()}
    folders = {e.folder for e in EXERCISES.values()}
    files = [p.relative_to(ROOT / "exercises").as_posix() for p in sorted((ROOT / "exercises").rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts]
    assert files
    missing = [f for f in files if f.split("/")[0] not in NOT_CHECKED and f not in known
               and f.rsplit("/", 1)[0] not in folders]
    assert missing == [], f"exercise files no registry entry names: {missing}"
    # and an entry's own file is where it says, taught by a notebook that exists
    for e in EXERCISES.values():
        assert (ROOT / "exercises" / e.file).is_file(), e
        assert (ROOT / "notebooks" / f"{e.notebook}.ipynb").is_file(), e
        assert e.title, e
    # 01's and 04's lessons are entries
    assert EXERCISES["step"].file == "01_tuning/step.py" and EXERCISES["schedule"].file == "04_scaling/schedule.py"


def tables(path: Path) -> list[str]:
    """Dict literals in ``path`` whose keys (two or more) are all exercise names: a per-exercise table."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Dict) and len(node.keys) >= 2 and all(
                isinstance(k, ast.Constant) and k.value in EXERCISES for k in node.keys):
            found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno}")
    return found


def _outside_the_registry() -> list[Path]:
    files = sorted((ROOT / "course_lib").rglob("*.py")) + sorted((ROOT / "tools").glob("*.py"))
    return [p for p in files if p.name != "registry.py" and not p.name.startswith("cases")]


def test_no_table_keyed_by_exercise_outside_the_registry():
    found = [t for p in _outside_the_registry() for t in tables(p)]
    assert found == [], f"tables keyed by exercise name outside course_lib/registry.py: {found}"


def test_the_scan_finds_a_table(tmp_path):
    """The scan sees what check_slurm.py held before (a test that can fail)."""
    old = tmp_path / "old_check_slurm.py"
    old.write_text('RANKS = {"ddp": 3, "allreduce": 5, "tp": 4, "ckpt": 2, "zero": 4, "ownddp": 3}\n'
                   'SIZES = {"tp": 2, "dp": 4}\n')
    assert tables(old) == [f"{old}:1"]


def test_course_check_knows_the_lessons(tmp_path):
    """``course check step|schedule PATH``: a solution passes, an untouched starter fails."""
    for name in ("step", "schedule"):
        ex = EXERCISES[name]
        for tree, rc in (("solutions", 0), ("exercises", 1)):
            p = subprocess.run([sys.executable, "-m", "course_lib.cli", "check", name, str(ROOT / tree / ex.file),
                                "--engine", "local"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
            assert p.returncode == rc, (name, tree, p.stdout, p.stderr)
            assert f"course check {name}" in p.stdout


# what holds an exercise's name in a comparison: ``exercise``, ``args.exercise``, ``name``, ``ex.name``, ``e``
HOLDERS = ("exercise", "name", "e", "ex")


def special_cases(path: Path) -> list[str]:
    """Comparisons in ``path`` of an exercise's name with a literal one (``exercise == "ddp"``,
    ``name in ("sbatch", "tp")``): a case the registry should describe instead."""
    def literal_names(node) -> set:
        if isinstance(node, ast.Constant):
            return {node.value} & set(EXERCISES) if isinstance(node.value, str) else set()
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return set().union(set(), *(literal_names(e) for e in node.elts))
        return set()

    def holds_a_name(node) -> bool:
        last = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
        return last in HOLDERS or "exercise" in last

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            names = set().union(*(literal_names(o) for o in operands))
            if names and any(holds_a_name(o) for o in operands):
                found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno} "
                             f"{sorted(names)}")
    return found


def test_no_exercise_is_special_cased_by_name():
    files = [p for p in sorted((ROOT / "course_lib").rglob("*.py"))
             if p.name != "registry.py" and not p.name.startswith("cases")]
    found = [c for p in files for c in special_cases(p)]
    assert found == [], f"exercises told apart by name outside the registry (give the registry a field): {found}"


def test_the_scan_finds_a_special_case(tmp_path):
    """What check.py and sandbox_worker.py held before (a test that can fail); a word that is an exercise's name
    compared with something else (a profiler event "allreduce") is no case."""
    old = tmp_path / "old_check.py"
    old.write_text('if exercise != "sbatch":\n    pass\nif args.exercise == "ddp" or e.name in ("tp", "cp"):\n'
                   '    pass\nif "allreduce" in low or ev["ev"] == "allreduce":\n    pass\n')
    assert special_cases(old) == [f"{old}:1 ['sbatch']", f"{old}:3 ['ddp']", f"{old}:3 ['cp', 'tp']"]
