"""The layout stays one a newcomer can read: small modules, short functions, every command listed.

Run as a script (``python tests/test_layout.py``) it prints what is over the limits.
"""
import ast
import subprocess
import sys

from conftest import ROOT

PACKAGE = ROOT / "course_lib"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def oversized():
    """(modules over the line limit, functions over theirs) in course_lib/, as 'path:line name (n lines)'."""
    modules, functions = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(ROOT)
        n = len(text.splitlines())
        if n > MAX_MODULE_LINES:
            modules.append(f"{rel} ({n} lines)")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    functions.append(f"{rel}:{node.lineno} {node.name} ({length} lines)")
    return modules, functions


def test_no_module_or_function_over_the_limits():
    modules, functions = oversized()
    assert not modules, f"modules over {MAX_MODULE_LINES} lines: {modules}"
    assert not functions, f"functions over {MAX_FUNCTION_LINES} lines: {functions}"


def test_python_m_course_lib_lists_every_command():
    from course_lib.cli import COMMANDS

    p = subprocess.run([sys.executable, "-m", "course_lib", "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    from course_lib.registry import EXERCISES

    missing = [name for name in [*COMMANDS, *EXERCISES] if name not in p.stdout]
    assert not missing, f"not in `python -m course_lib --help`: {missing}\n{p.stdout}"


def test_every_exercise_in_the_registry_has_its_files_and_checker():
    import importlib

    from course_lib.registry import EXERCISES

    for ex in EXERCISES.values():
        for tree in ("exercises", "solutions"):
            assert (ROOT / tree / ex.file).is_file(), f"{ex.name}: no {tree}/{ex.file}"
        assert (ROOT / "notebooks" / f"{ex.notebook}.ipynb").is_file(), f"{ex.name}: no notebook {ex.notebook}"
        assert callable(importlib.import_module(ex.checker).check), f"{ex.name}: {ex.checker} has no check()"


if __name__ == "__main__":
    mods, fns = oversized()
    print("\n".join(["modules:", *mods, "functions:", *fns]))
