"""Execute every notebook headless: ``course run notebooks`` (how an instructor checks a cluster before a workshop).

Each ``notebooks/NN_*.ipynb`` runs through papermill into ``out/notebooks/`` (ignored by git) and one line is
printed per notebook: name, seconds, ok/failed (with the error). By default the notebooks run against
solutions/ with STRICT=True, so a check that fails on this machine fails the run.
"""
import sys
import time
from pathlib import Path

from course_lib.cli import comma_items
from course_lib.core.paths import course_root, out_dir


def execute(path: Path, out_dir: Path, tree: str, quick: bool, cell_timeout: int) -> tuple[bool, float, str]:
    """Run one notebook, each cell within ``cell_timeout`` seconds; (ok, seconds, the error's first line or '')."""
    import logging

    import papermill

    from course_lib.instructor.papermill_guard import ENGINE

    # papermill warns that it cannot parse `QUICK = os.environ...` as a literal; it injects QUICK anyway
    logging.getLogger("papermill").setLevel(logging.ERROR)
    out_dir.mkdir(parents=True, exist_ok=True)
    params = {"TREE": tree, "QUICK": quick, "STRICT": tree == "solutions"}
    start = time.monotonic()
    try:
        papermill.execute_notebook(str(path), str(out_dir / f"{path.stem}.{tree}.ipynb"), parameters=params,
                                   cwd=str(path.parent), kernel_name="python3", progress_bar=False,
                                   execution_timeout=cell_timeout, engine_name=ENGINE)
        return True, time.monotonic() - start, ""
    except Exception as e:   # papermill raises PapermillExecutionError with the cell's error
        first = str(getattr(e, "evalue", "") or e).strip().splitlines() or [type(e).__name__]
        return False, time.monotonic() - start, f"{getattr(e, 'ename', type(e).__name__)}: {first[0][:200]}"


def add_arguments(p):
    p.add_argument("--tree", choices=["solutions", "exercises"], default="solutions",
                   help="the files the notebooks run against (default: solutions, with STRICT=True)")
    p.add_argument("--quick", action="store_true", help="the small settings CI uses")
    p.add_argument("--only", action=comma_items(), default=None, metavar="NAME[,NAME...]",
                   help="the notebooks whose names start so, shell patterns allowed: 01,02 or '0[12]' (default: all)")
    p.add_argument("--out", type=Path, default=out_dir() / "notebooks", metavar="DIR",
                   help="where the executed notebooks go (default: out/notebooks)")
    # not --timeout: that name means the deadline of a multi-process run in every course command
    p.add_argument("--cell-timeout", type=int, default=900, help="deadline in seconds of each cell (papermill's)")


def run(args) -> int:
    folder = course_root() / "notebooks"
    paths = sorted({p for start in args.only or ["*"] for p in folder.glob(start.rstrip("*") + "*.ipynb")
                    if p.name[:2].isdigit()})
    if not paths:
        print(f"course run notebooks: no notebooks match {args.only!r} in {folder}", file=sys.stderr)
        return 2
    failed = 0
    for path in paths:
        ok, seconds, error = execute(path, args.out, args.tree, args.quick, args.cell_timeout)
        failed += not ok
        print(f"{path.stem:<28} {seconds:7.1f} s  {'ok' if ok else 'failed'}  {error}".rstrip(), flush=True)
    print(f"{len(paths) - failed}/{len(paths)} notebooks ok; outputs in {args.out}")
    return 1 if failed else 0
