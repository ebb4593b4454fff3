"""``python tools/bench_checks.py``: how long each checker takes on the reference solution, next to the time it takes
to start Python and import torch on this machine (measured in the same run), and where the time goes.

A check is dominated by starting rank processes: every rank of every launch starts an interpreter and imports
torch. So the figure that travels between machines is the ratio: a check's wall time over one fresh
``python -c "import torch"``. Where the time goes, per checker:

- launches: how many multi-process runs, and their ranks in all;
- start-up (estimated, ``startup_estimate``): one torch import per process, sharing the machine's cores;
- in ranks: the rest of the time while a launch runs (training, test cases, waiting for peers, shutting down);
- checker: the time outside launches (preparing data, judging the records).

``--start`` picks how ranks start: warm (forked from one server per check that imported torch once,
``course_lib.runtime.warm``; the start-up estimate is then that one import), cold (``COURSE_WARM=0``: a fresh
interpreter per rank), or both, one row each, to compare in the same run.

``--deadlock`` times each checker on a deadlocked submission instead (``DEADLOCKS``: the faulty cases of the
repository's tests/<exercise>_faulty/ that deadlock, on the world sizes that show it, with the checker's own
deadlines): the check's wall time, the seconds from the hung case's start to its report, each over the torch import,
and how many ranks the verdict places at a line of the learner's file.
"""
from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from course_lib.core.paths import course_root
from course_lib.registry import EXERCISES, reference
from course_lib.runtime import launch as launch_module

CHECKERS = ("ddp", "allreduce", "tp")    # the default; any exercise with a checker on the command line
# checker -> the faulty case (tests/<checker>_faulty/cases.py) that deadlocks: every rank waits on a partner (the
# registry's ``deadlock``)
DEADLOCKS = {e.name: e.deadlock for e in EXERCISES.values() if e.deadlock}
# the DDP checker has its own probe: its verdict says how long each rank waited ("deadlock: rank 0 waited 3 s")
DDP_WAITED = re.compile(r"deadlock: rank \d+ waited (\d+(?:\.\d+)?) s")
KEPT_OPTIONS = ("world_sizes", "resume")   # a faulty case's options that choose what runs, not its deadlines


def torch_import_seconds(repeats: int = 3) -> float:
    """The median wall time of a fresh ``python -c "import torch"`` here and now."""
    times = []
    for _ in range(repeats):
        start = time.monotonic()
        subprocess.run([sys.executable, "-c", "import torch"], check=True, timeout=300)
        times.append(time.monotonic() - start)
    return statistics.median(times)


class LaunchLog:
    """While active, every ``course_lib.runtime.launch.launch`` is timed: (style, nprocs, seconds) per launch,
    and the stretches of time in which some launch ran (``covered``: launches side by side count once)."""

    def __init__(self):
        self.launches: list[tuple[str, int, float]] = []
        self.spans: list[tuple[float, float]] = []
        self._original = launch_module.launch

    def covered(self) -> float:
        total, end = 0.0, float("-inf")
        for a, b in sorted(self.spans):
            total += max(0.0, b - max(a, end))
            end = max(end, b)
        return total

    def __enter__(self) -> LaunchLog:
        def timed(*args, **kwargs):
            start = time.monotonic()
            result = self._original(*args, **kwargs)
            self.spans.append((start, time.monotonic()))
            self.launches.append((result.style, result.nprocs, result.elapsed))
            return result
        launch_module.launch = timed
        return self

    def __exit__(self, *exc) -> bool:
        launch_module.launch = self._original
        return False


def startup_estimate(log: LaunchLog, import_s: float, cores: int) -> float:
    """Seconds of starting ranks: one torch import per process (torchrun's agent imports it too). A launch's
    processes share the cores (ceil(processes / cores) imports one after the other); launches side by side
    share that time, but can never import faster than all their processes on all the cores."""
    procs = [n + (style == "torchrun") for style, n, _ in log.launches]
    overlap = log.covered() / (sum(s for _, _, s in log.launches) or 1.0)   # 1: one launch after the other
    return max(overlap * sum(import_s * -(-p // cores) for p in procs), import_s * sum(procs) / cores)


def bench_one(name: str, import_s: float, start_mode: str = "warm") -> dict:
    """Run checker ``name`` on its reference solution, ranks started ``start_mode`` ("warm" or "cold");
    its figures (see the module docstring)."""
    from course_lib.check import check
    from course_lib.runtime import warm
    warm.close_idle()   # a first check: it starts its own server (a kept one would hide that import)
    cores = os.cpu_count() or 1
    saved = os.environ.get("COURSE_WARM")
    os.environ["COURSE_WARM"] = "1" if start_mode == "warm" else "0"
    try:
        with LaunchLog() as log:
            start = time.monotonic()
            extra = {"cache": False} if name == "ddp" else {}   # ddp keeps verdicts of an unchanged file
            report = check(name, reference(name), **extra)
            wall = time.monotonic() - start
    finally:
        os.environ.pop("COURSE_WARM") if saved is None else os.environ.update(COURSE_WARM=saved)
    in_launches = log.covered()
    estimate = import_s if start_mode == "warm" else startup_estimate(log, import_s, cores)
    startup = min(in_launches, estimate)
    return {"checker": name, "start": start_mode, "passed": report.passed, "wall_s": wall, "ratio": wall / import_s,
            "launches": len(log.launches), "ranks": sum(n for _, n, _ in log.launches),
            "startup_s": startup, "in_ranks_s": max(0.0, in_launches - startup),
            "checker_s": max(0.0, wall - in_launches)}


def header(import_s: float) -> str:
    return (f"torch import in a fresh interpreter: {import_s:.2f} s ({os.cpu_count()} cores)\n"
            f"{'checker':<10} {'start':<5} {'wall s':>7} {'ratio':>6} {'launches':>8} {'ranks':>5} "
            f"{'start-up s (est.)':>17} {'in ranks s':>10} {'checker s':>9}  verdict")


def row(r: dict) -> str:
    return (f"{r['checker']:<10} {r.get('start', ''):<5} {r['wall_s']:7.1f} {r['ratio']:6.1f} {r['launches']:8d} "
            f"{r['ranks']:5d} "
            f"{r['startup_s']:17.1f} {r['in_ranks_s']:10.1f} {r['checker_s']:9.1f}  "
            f"{'all passed' if r['passed'] else 'FAILED (the solution should pass)'}")


def add_arguments(p):
    from course_lib.registry import EXERCISES
    p.add_argument("--checkers", nargs="+", choices=[e for e in EXERCISES if e != "sbatch"], default=None,
                   help=f"which checkers (default {' '.join(CHECKERS)}; sbatch submits a job, it is not timed here)")
    p.add_argument("--start", choices=("warm", "cold", "both"), default="warm",
                   help="ranks forked from a server that imported torch (warm, the default), fresh interpreters "
                        "(cold, as with COURSE_WARM=0), or both, row by row")
    p.add_argument("--deadlock", action="store_true",
                   help=f"time each checker on a deadlocked submission (default {' '.join(DEADLOCKS)}): how soon "
                        "the hang is reported")


def run(args) -> int:
    return run_deadlocks(args) if getattr(args, "deadlock", False) else run_checks(args)


def run_checks(args) -> int:
    """``tools/bench_checks.py [--checkers ddp allreduce tp] [--start warm|cold|both]``: prints the table;
    exit 1 if a solution failed."""
    names = getattr(args, "checkers", None) or CHECKERS
    start = getattr(args, "start", None) or "warm"
    modes = ("cold", "warm") if start == "both" else (start,)
    import_s = torch_import_seconds()
    print(header(import_s), flush=True)
    rows = []
    for name in names:
        for mode in modes:
            rows.append(bench_one(name, import_s, mode))
            print(row(rows[-1]), flush=True)
    return 0 if all(r["passed"] for r in rows) else 1


class HangLog:
    """While active, each case that hung in a launch of ``course_lib.checking.runner`` is noted: the seconds from
    its first rank's start to the last rank's report of where it waits."""

    def __init__(self):
        from course_lib.checking import runner
        self.runner, self.waits = runner, []
        self._original = runner.Launch.close

    def __enter__(self) -> HangLog:
        original, waits = self._original, self.waits

        def close(launch, result):
            original(launch, result)
            waits.extend(rec.fired - rec.began for rec in launch.records.values()
                         if rec.ended == "hung" and rec.fired and rec.began)
        self.runner.Launch.close = close
        return self

    def __exit__(self, *exc) -> bool:
        self.runner.Launch.close = self._original
        return False


def deadlock_submission(name: str, dest) -> tuple:
    """(path, options) of checker ``name``'s deadlocked submission, written under ``dest`` from the repository's
    tests/<name>_faulty/cases.py (the solution with the faulty case's edits)."""
    tests = course_root() / "tests"
    if not (tests / f"{name}_faulty" / "cases.py").exists():
        raise SystemExit(f"no {tests}/{name}_faulty/cases.py: --deadlock needs the course's repository, tests included")
    if str(tests) not in sys.path:
        sys.path.insert(0, str(tests))
    import importlib
    cases = importlib.import_module(f"{name}_faulty.cases").CASES
    case = next(c for c in cases if c.name == DEADLOCKS[name])
    solution = reference(name)
    path = case.write(solution, tests / f"{name}_faulty", dest)
    return path, {k: v for k, v in case.options.items() if k in KEPT_OPTIONS}


def bench_deadlock(name: str, import_s: float) -> dict:
    """Check ``name``'s deadlocked submission: wall time, the hung case's start to its report, and the verdict."""
    import tempfile

    from course_lib.check import check
    from course_lib.runtime import warm
    warm.close_idle()
    with tempfile.TemporaryDirectory(prefix="bench-deadlock-") as tmp:
        path, options = deadlock_submission(name, Path(tmp))
        with HangLog() as hangs:
            start = time.monotonic()
            report = check(name, path, say=None, **options, **({"cache": False} if name == "ddp" else {}))
            wall = time.monotonic() - start
    failed = [v for v in report.verdicts if v.result != "pass"]
    waits = hangs.waits or [float(s) for v in failed for s in DDP_WAITED.findall(v.message)]
    # the ranks the verdict places at a line of the learner's file ("rank 0 was waiting at zero.py:94", "on rank 0
    # at snapshot.py:51"); a rank that had returned and waited in the checker has no line to give
    lines = len({r for v in failed for r in re.findall(r"rank (\d+)[^\n;(]*? at (?:\S+\.py:|line )\d+", v.message)})
    return {"checker": name, "case": DEADLOCKS[name], "wall_s": wall, "ratio": wall / import_s,
            "hang_s": max(waits, default=float("nan")), "reported": bool(waits), "rank_lines": lines,
            "message": failed[0].message if failed else "(no failure: the deadlock was not caught)"}


def deadlock_header(import_s: float) -> str:
    return (f"torch import in a fresh interpreter: {import_s:.2f} s ({os.cpu_count()} cores)\n"
            f"{'checker':<10} {'deadlocked submission':<26} {'wall s':>7} {'ratio':>6} {'hang s':>7} {'ratio':>6}"
            f" {'ranks at a line':>15}  verdict")


def deadlock_row(r: dict, import_s: float) -> str:
    return (f"{r['checker']:<10} {r['case']:<26} {r['wall_s']:7.1f} {r['ratio']:6.1f} {r['hang_s']:7.1f} "
            f"{r['hang_s'] / import_s:6.1f} {r['rank_lines']:15d}  "
            f"{'hang reported' if r['reported'] else 'NOT reported as a hang'}")


def run_deadlocks(args) -> int:
    """``tools/bench_checks.py --deadlock [--checkers ...]``: the table, then each verdict's first lines; exit 1 if
    a deadlock was not reported as one."""
    names = [n for n in getattr(args, "checkers", None) or DEADLOCKS if n in DEADLOCKS]
    import_s = torch_import_seconds()
    print(deadlock_header(import_s), flush=True)
    rows = []
    for name in names:
        rows.append(bench_deadlock(name, import_s))
        print(deadlock_row(rows[-1], import_s), flush=True)
    for r in rows:
        print(f"\n{r['checker']}: " + "\n  ".join(r["message"].splitlines()[:6]))
    return 0 if all(r["reported"] for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="tools/bench_checks.py", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
