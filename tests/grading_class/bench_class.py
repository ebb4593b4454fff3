"""Benchmark: a made-up class of N learners graded by ``course grade`` with the local engine and as a Slurm
job array, both timed; prints the figures (a benchmark, not a test).

    python tests/grading_class/bench_class.py [--learners 30] [--jobs 2] [--throttle 4] [--real]
    python tests/grading_class/bench_class.py --made-up      # make_class.py's 11 learners, real checkers

The class cycles through four kinds of learner: a file that works, one that stops with an error, one with a
syntax error (no check runs), none handed in. Without ``--real`` the checker is run_file_check.py beside
this file (it runs the file as 2 ranks, a few seconds), so the figures measure the engines; with ``--real``
the course's all-reduce checker runs on the solution and the starter (about 90 s a check on a quiet 2-core
machine). Slurm: ``$SLURM_CONF`` if set, else a private local Slurm (scripts/local-slurm/start.sh, root
only), stopped at the end. Both engines must give the same verdicts; the script says so or fails.
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
from make_class import make_class, solution, starter  # noqa: E402

from course_lib.runtime.launch import free_port  # noqa: E402

AR = "05_allreduce/allreduce.py"


def make(subs: Path, n: int, real: bool) -> None:
    begun = "# begun\n" + starter(AR)      # an unchanged starter is not run (grading.starters): begin it
    kinds = [solution(AR) if real else "print('runs')\n", begun if real else "raise SystemExit('stops')\n",
             "def ring_allreduce(:\n", None]
    for i in range(n):
        folder = subs / f"learner{i:03d}"
        folder.mkdir(parents=True)
        text = kinds[i % len(kinds)]
        if text is not None:
            (folder / "05_allreduce").mkdir()
            (folder / AR).write_text(text)


def grade(subs: Path, out: Path, engine: str, extra: list[str], env: dict) -> float:
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "course_lib.cli", "grade", str(subs), "--out", str(out),
                        "--exercise", "allreduce", "--engine", engine, *extra], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=6 * 3600)
    took = time.monotonic() - start
    if p.returncode != 0:
        sys.exit(f"{engine}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return took


def start_slurm(env: dict) -> Path | None:
    if env.get("SLURM_CONF"):
        return None
    d = Path(tempfile.mkdtemp(prefix="cg-", dir="/tmp"))
    ports = {"SLURM_LAB_CTLD_PORT": str(free_port()), "SLURM_LAB_SLURMD_PORT": str(free_port())}
    r = subprocess.run(["bash", str(ROOT / "scripts/local-slurm/start.sh"), str(d)], env={**env, **ports},
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        sys.exit("local Slurm did not start: " + (r.stdout + r.stderr)[-2000:])
    env["SLURM_CONF"] = str(d / "etc" / "slurm.conf")
    env["COURSE_SITE"] = "local"
    return d


def verdicts(out: Path) -> list[tuple]:
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        return [(r["learner"], r["exercise"], r["item"], r["result"]) for r in csv.DictReader(f)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--learners", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=2, help="local engine: checks at the same time")
    ap.add_argument("--throttle", type=int, default=4, help="Slurm engine: tasks at the same time")
    ap.add_argument("--real", action="store_true", help="the course's all-reduce checker instead of run_file_check")
    ap.add_argument("--made-up", action="store_true",
                    help="make_class.py's class (hanging, hostile, forking...), allreduce and tp, real checkers")
    args = ap.parse_args()
    args.real |= args.made_up
    work = Path(tempfile.mkdtemp(prefix="bench-grade-"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]))
    extra = [] if args.real else ["--checker", "run_file_check", "--timeout", "120"]
    cluster = start_slurm(env)
    try:
        if args.made_up:
            make_class(work / "subs", work / "outside")
            extra = ["--exercise", "tp", "--check-timeout", "150", "--max-processes", "256"]
            args.learners = len(list((work / "subs").iterdir()))
        else:
            make(work / "subs", args.learners, args.real)
        local = grade(work / "subs", work / "local", "local", extra + ["--jobs", str(args.jobs)], env)
        slurm = grade(work / "subs", work / "slurm", "slurm", extra + ["--throttle", str(args.throttle),
                                                                       "--cpus-per-task", "1"], env)
        same = verdicts(work / "local") == verdicts(work / "slurm")
    finally:
        if cluster is not None:
            subprocess.run(["bash", str(ROOT / "scripts/local-slurm/stop.sh"), str(cluster)], capture_output=True,
                           timeout=120)
            shutil.rmtree(cluster, ignore_errors=True)
    checks = "made-up class" if args.made_up else f"{sum(1 for i in range(args.learners) if i % 4 < 2)} checks to run"
    print(f"{args.learners} learners ({checks}, {'real checkers' if args.real else 'run_file_check'}) "
          f"on {os.cpu_count()} cores:")
    print(f"  local engine, --jobs {args.jobs}:            {local:7.1f} s")
    print(f"  Slurm job array, %{args.throttle}, 1 CPU/task: {slurm:7.1f} s")
    print(f"  same verdicts: {same}   (reports in {work})")
    if not same:
        diff = set(verdicts(work / "local")) ^ set(verdicts(work / "slurm"))
        sys.exit(f"the engines differ: {sorted(diff)[:20]}")


if __name__ == "__main__":
    main()
