"""The course's layers, read from the source with ``ast`` (imports inside functions too): the runtime at the bottom
(on the plain helpers of course_lib.core), the checking harness on it, the topics on the harness, instructor and
grading on top. A module that imports upward fails here, naming the module, the line and what it imports."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "course_lib"
# the runtime stands on the plain helpers (core) and one leaf module that imports nothing of the course
BELOW_RUNTIME = ("course_lib.runtime", "course_lib.core", "course_lib.metrics")
TOPICS = ("ddp", "owndp", "allreduce", "tp", "cp", "pp", "zero", "ckpt", "sbatch", "trace", "lessons", "selftest")
ON_TOP = ("course_lib.instructor", "course_lib.grading")
# (module file, what it imports) that break a rule today, each to go: this list only shrinks
KNOWN: set[tuple[str, str]] = set()


def modules(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py"))


def name_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path):
    """(line, the course module imported, whether at the module's top) for each import of ``path``; ``from a import
    b`` names ``a.b`` (b may be a module)."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(node) for node in tree.body}
    here = name_of(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:   # relative: from the package of this module, up level - 1
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name == "course_lib" or name.startswith("course_lib."):
                yield node.lineno, name, id(node) in top


def breaks(folder: str, allowed=None, forbidden=()) -> list[str]:
    """Imports in ``folder`` outside ``allowed`` (prefixes), or inside ``forbidden``; KNOWN ones left out."""
    found = []
    for path in modules(folder):
        rel = str(path.relative_to(PACKAGE.parent))
        for line, name, _ in imports(path):
            outside = allowed is not None and not name.startswith(allowed)
            if (outside or name.startswith(forbidden)) and (rel, name) not in KNOWN:
                found.append(f"{rel}:{line} imports {name}")
    return found


def test_the_runtime_imports_nothing_above_it():
    assert breaks("runtime", allowed=BELOW_RUNTIME) == []


def test_the_checking_harness_imports_no_topic_and_nothing_of_instructor_or_grading():
    assert breaks("checking", forbidden=tuple(f"course_lib.{t}" for t in TOPICS) + ON_TOP) == []


@pytest.mark.parametrize("topic", TOPICS)
def test_a_topic_imports_nothing_of_instructor_or_grading(topic):
    assert breaks(topic, forbidden=ON_TOP) == []


def test_imports_in_the_runtime_and_the_harness_sit_at_the_top_unless_a_comment_defers_them():
    """An import inside a function hides an arrow between layers: one that must be there (torch, a notebook's
    widgets: heavy or optional) says so with "deferred" in a comment on its line or on the import lines just above it.
    Every import counts here, the standard library's and torch's too."""
    hidden = []
    for folder in ("runtime", "checking"):
        for path in modules(folder):
            lines = path.read_text().splitlines()
            tree = ast.parse("\n".join(lines))
            top = {id(node) for node in tree.body}
            for node in ast.walk(tree):
                if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in top:
                    continue
                i = node.lineno - 1
                block = [lines[i]]
                while i > 0 and lines[i - 1].strip().startswith(("import ", "from ", "#")):
                    i -= 1
                    block.append(lines[i])
                if not any("#" in text and "deferred" in text.split("#", 1)[1] for text in block):
                    hidden.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert hidden == []


def test_the_rules_can_fail(tmp_path, monkeypatch):
    """An upward import, in a function, is found (so an empty list above means something)."""
    (tmp_path / "course_lib" / "runtime").mkdir(parents=True)
    (tmp_path / "course_lib" / "runtime" / "bad.py").write_text("def f():\n    from course_lib.grading import x\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "course_lib")
    assert breaks("runtime", allowed=BELOW_RUNTIME) == ["course_lib/runtime/bad.py:2 imports course_lib.grading.x"]
