"""``python tools/bench_room.py``: the moment a room clicks "check". N learner workspaces (``course init``),
the reference solution in half of them and the starter in the other half, the same check started in all at once, each
as a process of its own (as N learners' kernels would run it: ``course_lib.check.check``, the notebooks' call).

Prints per learner: the file it holds, whether the verdict is right (the solution passes; the starter fails on its
items, not on the check's own deadline), the seconds to the verdict and what the check told the learner on the way
(each line the check says, timed from the call of the check: its deadline, or on Slurm "queued as job N" and "job N
started"); then p50 / p95 / max and what is left over: every process that carries the run's marker variable once
the learners ended, found with psutil, and on Slurm every job whose folder is in the run's workspaces (must be 0).
The peak number of marked processes seen while the checks ran is printed too: it shows that the search for what
is left sees the checks' processes at all (on Slurm: the jobs' ranks under slurmstepd, which inherit the marker).

``--engine slurm`` runs each check as a Slurm job (course_lib.check_slurm), where ``sbatch`` works.
``--accounts`` runs learner i as Unix user ``roomlearner<i>`` (made with useradd where missing: root only), in a
workspace it made and owns, as on a hub: then ``--python`` must be an install every user can run, e.g. one made by
``scripts/hub/shared-install.sh /opt/room-bench`` (``--python /opt/room-bench/venv/bin/python``).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from course_lib.runtime.proc import stop_tree

MARKER = "COURSE_ROOM_BENCH"     # set in every learner's environment: its processes are found by it
SETTLE_S = 15.0                  # a kept fork server ends at its check's exit (stdin EOF): time to see it go
SAID = re.compile(r"^\[said at ([\d.]+) s\] (.*)$")   # a line the check said to the learner (learner_main)


@dataclass
class Learner:
    index: int
    workspace: Path
    correct: bool                # holds the reference solution
    user: str | None = None      # the learner's own Unix account (--accounts), else this process's
    proc: subprocess.Popen | None = None
    started: float = 0.0
    seconds: float = 0.0
    returncode: int | None = None
    result: dict | None = None   # the learner process's JSON line
    output: str = ""

    def right(self) -> bool:
        """The solution passed; the starter failed on its items (not on the check run itself)."""
        if self.result is None:
            return False
        if self.correct:
            return self.result["passed"]
        failed = [v for v in self.result["verdicts"] if v["result"] != "pass"]
        return bool(failed) and not any(v["item"] == "check run" for v in failed)

    def said(self) -> list[tuple[float, str]]:
        """What the check told the learner before its verdict: (seconds since the learner started, the line)."""
        return [(float(m[1]), m[2]) for m in map(SAID.match, self.output.splitlines()) if m]

    def told(self) -> str:
        """The table's summary of ``said()``: on Slurm whether the check said it was queued (Slurm's reason) and
        how long until it said the job started; else the first line (the local check's deadline)."""
        said = self.said()
        queued = [(t, text) for t, text in said if text.startswith("queued as job")]
        started = [t for t, text in said if " started " in text]
        if queued:
            reason = re.search(r"reason ([^;)]+)", queued[0][1])
            wait = f", started {started[0] - queued[0][0]:.1f} s later" if started else ", never said it started"
            return f"queued ({reason[1] if reason else '?'}){wait}"
        if started:
            return f"started at {started[0]:.1f} s, not said queued"
        return said[0][1] if said else "(said nothing)"


def add_arguments(p):
    p.add_argument("--learners", type=int, default=8, metavar="N", help="learner workspaces (default 8)")
    p.add_argument("--exercise", default="allreduce", help="the check every learner runs (default allreduce)")
    p.add_argument("--world-sizes", default=None, metavar="W,...",
                   help="case-based checks only: these world sizes (default: the check's own)")
    p.add_argument("--engine", choices=("local", "slurm"), default="local",
                   help="where the checks run (default local; slurm: as Slurm jobs)")
    p.add_argument("--keep", action="store_true", help="keep the workspaces (their path is printed)")
    p.add_argument("--accounts", action="store_true",
                   help="each learner as a Unix user of its own (roomlearner<i>; root only)")
    p.add_argument("--python", default=sys.executable, metavar="PATH",
                   help="the learners' Python, i.e. the install they share (default: this one)")


def run(args) -> int:
    if args.learners < 1:
        print("tools/bench_room.py: --learners must be at least 1", file=sys.stderr)
        return 2
    worlds = tuple(int(w) for w in args.world_sizes.split(",")) if args.world_sizes else None
    if args.accounts and os.geteuid() != 0:
        print("tools/bench_room.py: --accounts starts the learners as other users: run it as root", file=sys.stderr)
        return 2
    result = room(args.learners, args.exercise, worlds, args.engine, keep=args.keep, accounts=args.accounts,
                  python=args.python)
    print(result.table())
    return 0 if result.all_right() and not result.left else 1


@dataclass
class RoomResult:
    learners: list
    left: list           # descriptions of processes (and Slurm jobs) found after the learners ended
    load: tuple          # the 1-minute load average before and after
    exercise: str
    engine: str
    peak: int = 0        # the most marked processes seen at one look while the checks ran

    def all_right(self) -> bool:
        return all(learner.right() for learner in self.learners)

    def table(self) -> str:
        rows = [f"{'learner':>7}  {'file':<9}  {'right':<5}  {'seconds':>7}  told"]
        for lr in self.learners:
            rows.append(f"{lr.index:>7}  {'solution' if lr.correct else 'starter':<9}  "
                        f"{'yes' if lr.right() else 'NO':<5}  {lr.seconds:>7.1f}  {lr.told()}")
            if not lr.right():
                rows.append("         " + (lr.output.strip().replace("\n", "\n         ")[-1500:] or "(no output)"))
        times = sorted(lr.seconds for lr in self.learners)
        rows.append(f"{self.exercise} on {self.engine}, {len(times)} learners at once, {os.cpu_count()} cores, "
                    f"load {self.load[0]:.1f} before, {self.load[1]:.1f} after")
        rows.append(f"seconds to verdict: p50 {percentile(times, 50):.1f}  p95 {percentile(times, 95):.1f}  "
                    f"max {times[-1]:.1f}")
        rows.append(f"verdicts right: {sum(lr.right() for lr in self.learners)}/{len(times)}; "
                    f"{'processes and jobs' if self.engine == 'slurm' else 'processes'} left: {len(self.left)} "
                    f"(marked processes seen at once while checking: up to {self.peak})")
        rows.extend(f"  left: {p}" for p in self.left)
        return "\n".join(rows)


def percentile(sorted_values: list, q: float) -> float:
    """The q-th percentile (linear between the nearest ranks, as numpy's default)."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    return statistics.quantiles(sorted_values, n=100, method="inclusive")[int(q) - 1] if q < 100 else sorted_values[-1]


def room(n: int, exercise: str = "allreduce", world_sizes=None, engine: str = "local", keep: bool = False,
         accounts: bool = False, python: str = sys.executable):
    """Make ``n`` workspaces, start the check in all at once, wait for every verdict: a RoomResult."""
    from course_lib.registry import get
    root = Path(tempfile.mkdtemp(prefix="room-"))    # short: fork servers put their sockets under it
    root.chmod(0o755)                                 # each account reaches its own workspace below it
    marker = f"{root}:{os.getpid()}"
    load_before = os.getloadavg()[0]
    try:
        learners = [make_workspace(root, i, i % 2 == 0, get(exercise).file, python,
                                   account(f"roomlearner{i}") if accounts else None) for i in range(n)]
        for lr in learners:
            start(lr, exercise, world_sizes, engine, marker, python)
        waiters = [threading.Thread(target=finish, args=(lr,)) for lr in learners]   # each timed as it ends
        for t in waiters:
            t.start()
        peak = watch(marker, waiters)
        left = survivors(marker) + (jobs_left(root) if engine == "slurm" else [])
    finally:
        if keep:
            print(f"workspaces kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return RoomResult(learners, left, (load_before, os.getloadavg()[0]), exercise, engine, peak)


def watch(marker: str, waiters: list, every: float = 1.0) -> int:
    """Until every waiter thread ended: the most processes carrying ``marker`` seen at one look."""
    peak = 0
    while any(t.is_alive() for t in waiters):
        peak = max(peak, len(marked(marker)))
        for t in waiters:
            t.join(every / len(waiters))
    return peak


def account(name: str) -> str:
    """A Unix user ``name``, made (with its home) where missing."""
    if subprocess.run(["id", name], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True, capture_output=True, timeout=60)
    return name


def as_user(user: str | None) -> dict:
    """Popen's arguments that start a process as ``user`` (nothing for None: as this process)."""
    return {"user": user, "group": user, "extra_groups": []} if user else {}


def make_workspace(root: Path, index: int, correct: bool, relative: str, python: str = sys.executable,
                   user: str | None = None) -> Learner:
    """``course init`` (by the learner's account); the learners with ``correct`` get the reference file over the
    starter."""
    from course_lib.core.paths import tree_dir
    ws = root / f"learner{index}"
    if user:
        ws.mkdir()
        shutil.chown(ws, user, user)
    subprocess.run([python, "-m", "course_lib", "init", str(ws)], check=True, stdout=subprocess.DEVNULL,
                   timeout=120, cwd=ws.parent, **as_user(user))
    if correct:
        shutil.copyfile(tree_dir("solutions") / relative, ws / "exercises" / relative)
    (ws / "tmp").mkdir()
    if user:
        for path in (ws / "exercises" / relative, ws / "tmp"):
            shutil.chown(path, user, user)
    return Learner(index, ws, correct, user)


def start(lr: Learner, exercise: str, world_sizes, engine: str, marker: str, python: str = sys.executable) -> None:
    from course_lib.registry import get
    env = {**os.environ, MARKER: marker, "TMPDIR": str(lr.workspace / "tmp"), "COURSE_WORKSPACE": str(lr.workspace)}
    if lr.user:
        env.update(HOME=os.path.expanduser(f"~{lr.user}"), USER=lr.user, LOGNAME=lr.user)
    path = lr.workspace / "exercises" / get(exercise).file
    args = [python, str(Path(__file__).resolve()), "--learner", exercise, str(path), engine,
            ",".join(map(str, world_sizes or ()))]
    lr.started = time.monotonic()
    lr.proc = subprocess.Popen(args, cwd=lr.workspace, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, text=True, **as_user(lr.user))


def finish(lr: Learner) -> None:
    """Wait for the learner's verdict (the check has its own overall deadline; this waits a little longer)."""
    try:
        out, _ = lr.proc.communicate(timeout=1800)
    except subprocess.TimeoutExpired:
        lr.proc.kill()
        out, _ = lr.proc.communicate()
    lr.seconds, lr.returncode, lr.output = time.monotonic() - lr.started, lr.proc.returncode, out
    last = [line for line in out.splitlines() if line.startswith("{")]
    lr.result = json.loads(last[-1]) if last else None


def survivors(marker: str, settle: float = SETTLE_S) -> list[str]:
    """Processes that carry ``marker`` in their environment once every learner ended; a kept fork server ends
    when its check exits, so they get ``settle`` seconds to go. What is still there is listed, then killed."""
    end = time.monotonic() + settle
    while (found := marked(marker)) and time.monotonic() < end:
        time.sleep(0.5)
    described = [f"pid {p.pid}: {' '.join(p.info['cmdline'] or [])[:200]}" for p in found]
    stop_tree(found)
    return described


def marked(marker: str) -> list:
    """Live processes whose environment holds ``MARKER=marker`` (psutil; a process that ends meanwhile is skipped)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and p.environ().get(MARKER) == marker:
                found.append(p)
        except psutil.Error:
            continue
    return found


def jobs_left(root: Path) -> list[str]:
    """Slurm jobs still queued or running whose folder is under ``root`` (the run's workspaces): listed, then
    cancelled. A check's job is in the learner's runs folder (course_lib.check_slurm)."""
    from course_lib.runtime.slurm import command

    r = command(["squeue", "-h", "-o", "%i|%T|%j|%Z"], timeout=60)
    if r.returncode != 0:
        return [f"squeue failed ({r.returncode}): {r.stderr.strip()[:200]}"]
    found = [line.split("|") for line in r.stdout.splitlines() if line.count("|") == 3]
    found = [(job, state, name) for job, state, name, folder in found if folder.startswith(str(root))]
    if found:
        command(["scancel", *(job for job, _, _ in found)], timeout=60)
    return [f"job {job} ({name}): {state}" for job, state, name in found]


def learner_main(argv: list[str]) -> int:
    """One learner's kernel: ``check(EXERCISE, PATH)`` as the notebooks call it; its report as one JSON line."""
    from course_lib.check import check
    exercise, path, engine, worlds = argv
    options = {"world_sizes": tuple(int(w) for w in worlds.split(","))} if worlds else {}
    t0 = time.monotonic()
    report = check(exercise, path, engine, say=lambda text: print(f"[said at {time.monotonic() - t0:.1f} s] {text}",
                                                                    flush=True), **options)
    print(report.text())
    print(json.dumps({"passed": report.passed, "verdicts": report.rows()}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The room (``--learners N ...``), or one learner's kernel (``--learner EXERCISE PATH ENGINE W,...``)."""
    import argparse
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--learner"]:
        return learner_main(argv[1:])
    parser = argparse.ArgumentParser(prog="tools/bench_room.py", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
