"""Write exercises/ from solutions/: ``course release exercises`` (``--check``: fail if exercises/ would change;
``course release nbgrader DIR``: an nbgrader course's ``source/``, learner files only; ``course release gradescope
DIR``: a Gradescope autograder bundle, course_lib.grading.autograder). README, "For instructors".

solutions/ is the one source, its regions marked with nbgrader's delimiters (course_lib.markers shows the format).
In the exercise each region becomes its ``# STUB: `` lines without that prefix (at the marker's indentation), or,
with none, nbgrader's own stub ``raise NotImplementedError()``; everything else is copied as it is. nbgrader reads
any line that *contains* "BEGIN SOLUTION" as a marker, so such a line is an error here unless it is exactly the
marker. A notebook is released cell by cell: code cells as above, text cells with nbgrader's conventions (a marked
region, or a cell whose nbgrader metadata says ``solution``, becomes "YOUR ANSWER HERE"), outputs cleared.
nbgrader clears solution regions in notebook cells only, so it is never given solutions/: ``--nbgrader DIR`` writes
the learner's files and a guide notebook per exercise folder (docs/grading.md, "nbgrader, end to end").
"""
import re
import sys
from pathlib import Path

from course_lib.cli import comma_items
from course_lib.core.atomic import write_text
from course_lib.core.paths import course_root
from course_lib.instructor.workspace import SKIP, site_text
from course_lib.markers import BEGIN, END, STUB, MarkerError, solution_view  # noqa: F401 (the release's API)
from course_lib.markers import regions as _regions
from course_lib.registry import EXERCISES, SOLUTIONS_ONLY

CODE_STUB, TEXT_STUB = "# YOUR CODE HERE\nraise NotImplementedError()", "YOUR ANSWER HERE"   # nbgrader's
RAISE_STUB = re.compile(r"^\s*raise NotImplementedError\(")


def exercise_view(text: str, name: str = "<source>", stub: str = CODE_STUB, hints: bool = True) -> str:
    """The learner's version: each marked region replaced by its STUB lines, else by ``stub``. ``hints=False``: the
    harder starter, where a stub that only raises NotImplementedError (whose message spells out the algorithm, as
    in the all-reduce and ZeRO exercises) raises without the recipe; stubs that keep a file running stay."""
    out = []
    for item in _regions(text, name):
        if item[0] == "text":
            out.append(item[1])
            continue
        _, indent, lines = item
        stubs = [m for m in (STUB.match(line.rstrip("\n")) for line in lines) if m]
        if stubs and not hints and RAISE_STUB.match(stubs[0].group(2) or ""):
            what = re.match(r'raise NotImplementedError\("([\w.]+)', stubs[0].group(2))
            out.append(f'{stubs[0].group(1)}raise NotImplementedError("{what.group(1) + ": " if what else ""}'
                       'your code here")\n')
        elif stubs:
            out.extend(f"{m.group(1)}{m.group(2) or ''}".rstrip() + "\n" for m in stubs)
        else:
            out.extend(f"{indent}{line}\n" for line in stub.split("\n"))
    return "".join(out)


def notebook_exercise_view(text: str, name: str = "<notebook>") -> str:
    """A solution notebook as the learner gets it: solution cells stubbed (nbgrader's rules), no outputs."""
    import nbformat

    nb = nbformat.reads(text, as_version=4)
    for i, cell in enumerate(nb.cells):
        is_solution = bool(cell.get("metadata", {}).get("nbgrader", {}).get("solution"))
        stub = CODE_STUB if cell.cell_type == "code" else TEXT_STUB
        source = exercise_view(cell.source, f"{name} cell {i}", stub)
        if is_solution and source == cell.source:
            source = stub       # a solution cell without markers is replaced whole, as nbgrader does
        cell.source = source.rstrip("\n") if not cell.source.endswith("\n") else source
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nbformat.writes(nb) + "\n"


def plan(solutions: Path, exercises: Path, hints: bool = True) -> dict[Path, str]:
    """{exercise path: content} for every file under solutions/ that is an exercise (``hints``: exercise_view)."""
    files = {}
    for src in sorted(solutions.rglob("*")):
        rel = src.relative_to(solutions)
        if not src.is_file() or rel.parts[0] in SOLUTIONS_ONLY or SKIP & set(rel.parts):
            continue
        text = src.read_text(encoding="utf-8")
        if src.suffix in (".py", ".sbatch"):     # job scripts: bash comments, the same markers
            text = exercise_view(text, str(src), hints=hints)
        elif src.suffix == ".ipynb":
            text = notebook_exercise_view(text, str(src))
        files[exercises / rel] = text
    return files


def orphans(files: dict[Path, str], exercises: Path) -> list[Path]:
    """Sources in exercises/ that no solution produces (a renamed or deleted solution leaves them behind); only .py,
    .ipynb and .sbatch files count: a run leaves other files (mnist_cnn.pt, logs) that are not sources."""
    if not exercises.is_dir():
        return []
    return [p for p in sorted(exercises.rglob("*")) if p.suffix in (".py", ".ipynb", ".sbatch") and p.is_file()
            and p not in files and not SKIP & set(p.parts)]


# ---------------------------------------------------------------- nbgrader's source/

NBGRADER_CONFIG = ("c = get_config()  # noqa: F821 (nbgrader defines it)\n"
                   "# written by `course release --nbgrader`: the course folder is where this file is; set your\n"
                   "# course id and exchange here as nbgrader's documentation says\n")


def _guide(folder: str, files: list[str]) -> str:
    """The assignment's notebook: what to edit, and a cell per exercise that checks the learner's file."""
    import nbformat

    kernel = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    exercises = [e for e in EXERCISES.values() if e.folder == folder]
    taught = ", ".join(sorted({f"`{e.notebook}`" for e in exercises})) or f"the notebook of {folder}"
    listed = "\n".join(f"- `{f}`" for f in files)
    cells = [nbformat.v4.new_markdown_cell(
        f"# {folder}\n\nEdit the file(s) of this folder where they say TODO ({taught} explains the task):\n\n"
        f"{listed}\n\nRun the cell(s) below to check your work, then submit this folder as it is.")]
    for e in exercises:
        name = e.file.split("/", 1)[1]
        cells.append(nbformat.v4.new_code_cell(f'from course_lib.check import check\n\ncheck("{e.name}", "{name}")'))
    for i, cell in enumerate(cells):
        cell.id = f"guide-{i}"      # fixed ids: a second release writes the same bytes (and so writes nothing)
    nb = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": kernel})
    return nbformat.writes(nb) + "\n"


def nbgrader_plan(solutions: Path, course: Path, exercises: list[str] | None = None) -> dict[Path, str]:
    """{path: content} of nbgrader's ``course/source/<folder>/``: one assignment per exercise folder (those of
    ``exercises`` only, when given), the starter files as exercises/ holds them (a job script's site lines written
    for ``$COURSE_SITE``, as in a hub workspace), and a guide notebook."""
    folders: dict[str, dict[str, str]] = {}
    for rel, text in plan(solutions, Path()).items():   # a job script with the site's lines, as a workspace's
        text = site_text(text) if rel.suffix == ".sbatch" else text
        folders.setdefault(rel.parts[0], {})[str(Path(*rel.parts[1:]))] = text
    wanted = {EXERCISES[e].folder for e in exercises} if exercises else set(folders)
    files = {}
    for folder in sorted(wanted & set(folders)):
        source = course / "source" / folder
        files.update({source / name: text for name, text in folders[folder].items()})
        if not any(name.endswith(".ipynb") for name in folders[folder]):
            files[source / f"{folder}.ipynb"] = _guide(folder, sorted(folders[folder]))
    if not (course / "nbgrader_config.py").exists():
        files[course / "nbgrader_config.py"] = NBGRADER_CONFIG
    return files


def release_for_nbgrader(solutions: Path, course: Path, exercises: list[str] | None) -> int:
    """``course release --nbgrader DIR``: write what is new, refuse to overwrite what differs."""
    files = nbgrader_plan(solutions, course, exercises)
    differ = [p for p, text in files.items() if p.exists() and p.read_text(encoding="utf-8") != text]
    if differ:
        return _fail("these files exist and differ from what would be written (nothing was written; move them away "
                     "or choose another folder):\n  " + "\n  ".join(map(str, differ)))
    new = [p for p in files if not p.exists()]
    _write(new, files)
    assignments = sorted({p.parent.name for p in files if p.parent.parent == course / "source"})
    print(f"nbgrader source in {course / 'source'}: {', '.join(assignments)} ({len(new)} files written); "
          f"next: cd {course} && nbgrader generate_assignment ASSIGNMENT")
    return 0


def add_arguments(p):
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if exercises/ is out of date")
    p.add_argument("--solutions", type=Path, default=course_root() / "solutions", metavar="DIR",
                   help="the complete files to release from (default: the course's solutions/)")
    p.add_argument("--exercises", type=Path, default=course_root() / "exercises", metavar="DIR",
                   help="where the starters go (default: the course's exercises/)")
    p.add_argument("--nbgrader", type=Path, default=None, metavar="DIR",
                   help="instead of exercises/: write nbgrader's DIR/source/<exercise folder>/ with the learner's "
                        "files only (nbgrader copies .py files as they are: never give it solutions/)")
    p.add_argument("--gradescope", type=Path, default=None, metavar="DIR",
                   help="instead of exercises/: write a Gradescope autograder bundle (setup.sh, run_autograder, the "
                        "course's checkers; DIR/autograder.zip to upload) into the new folder DIR")
    p.add_argument("--no-hints", action="store_true",
                   help="the harder starters, into --exercises DIR (not the course's exercises/): a function whose "
                        "stub spells out the algorithm (all-reduce, ZeRO, ...) only raises NotImplementedError")
    p.add_argument("--exercise", action=comma_items(choices=list(EXERCISES)), metavar="EX[,EX...]",
                   help=f"with nbgrader: only these exercises' folders; with gradescope: the exercises the "
                        f"autograder grades ({', '.join(EXERCISES)}); default: all")


def _fail(message: str) -> int:
    print(f"course release: {message}", file=sys.stderr)
    return 2


def run(args) -> int:
    if not args.solutions.is_dir():
        return _fail(f"no folder {args.solutions} (give --solutions, the folder of complete files)")
    if args.nbgrader is not None and args.gradescope is not None:
        return _fail("--nbgrader and --gradescope write different things: give one")
    if args.exercise and args.nbgrader is None and args.gradescope is None:
        return _fail("--exercise goes with --nbgrader DIR or --gradescope DIR")
    if args.no_hints and (args.nbgrader is not None or args.gradescope is not None or args.check
                          or args.exercises.resolve() == (course_root() / "exercises").resolve()):
        return _fail("--no-hints writes the harder starters into a folder of your own: give --exercises DIR "
                     "(the course's exercises/ keeps the hints)")
    try:
        if args.gradescope is not None:
            from course_lib.grading.autograder import write_bundle  # deferred: the grader, for this option only

            ex = args.exercise or list(EXERCISES)
            print(f"Gradescope autograder for {', '.join(ex)}: upload {write_bundle(args.gradescope, ex)} (its folder "
                  "shows what it holds)")
            return 0
        if args.nbgrader is not None:
            return release_for_nbgrader(args.solutions, args.nbgrader, args.exercise)
        files = plan(args.solutions, args.exercises, hints=not args.no_hints)
    except (MarkerError, FileExistsError) as e:
        return _fail(str(e))
    except OSError as e:
        return _fail(f"cannot write: {e}")
    stale = [p for p, text in files.items() if not p.is_file() or p.read_text(encoding="utf-8") != text]
    extra = orphans(files, args.exercises)
    for p in extra:
        print(f"no solution for {p}: delete it, or add its source to {args.solutions}")
    if args.check:
        for p in stale:
            print(f"out of date: {p} (run `course release exercises`)")
        print(f"{len(files) - len(stale)}/{len(files)} exercise files up to date")
        keys = _quiz_keys(args.solutions)
        return 1 if stale or extra or keys else 0
    try:
        _write(stale, files)
    except OSError as e:
        return _fail(f"cannot write the exercises: {e}")
    print(f"{len(files)} exercise files, {len(stale)} written")
    return 0


def _quiz_keys(solutions: Path) -> list[str]:
    """The notebooks' quiz questions against their keys in solutions/answers/ (course_lib.quiz)."""
    from course_lib import quiz
    if not (solutions / "answers").is_dir():     # a solutions folder without quiz keys (an instructor's own)
        return []
    problems = quiz.sync_problems(course_root() / "notebooks", solutions / "answers")
    for problem in problems:
        print(f"quiz key: {problem}")
    return problems


def _write(paths: list[Path], files: dict[Path, str]) -> None:
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        write_text(p, files[p])   # atomic: a notebook open in Jupyter never reads half a file
        print(f"wrote {p}")
