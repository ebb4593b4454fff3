"""Check a learner's snapshot code: ``course check ckpt PATH`` (exercises/08_checkpoint/snapshot.py).

Two real runs, each with a deadline and nothing left running afterwards:

1. ``course_lib.ckpt.worker`` on 2 gloo ranks (srun-style): save_snapshot after a few training steps, then
   load_snapshot into a fresh model, optimizer and scheduler with scrambled random generators. One verdict per
   piece of the snapshot (model, optimizer, scheduler, position, RNG states, compared on every rank); which
   ranks wrote files ("rank 0 writes"); and "atomic write": torch.save dies halfway through the next snapshot,
   and the previous one must still be there, whole.
2. "resume": notebook 08's experiment. The course's training loop with the learner's functions under the real
   ``torchrun --max-restarts 1``; rank 1 kills itself mid-epoch; the loss curve must equal an uninterrupted
   run's, step for step (course_lib.ckpt.curves.TOLERANCE).
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.ckpt.curves import RANK_ENV
from course_lib.core.report import Report

ITEMS = ("model", "optimizer", "scheduler", "position", "RNG states", "rank 0 writes", "atomic write", "resume")
RESTORED = ITEMS[:5]
WORLD = 2
RESUME = {"epochs": 3, "every": 3, "kill_at": 14}     # 8 steps per epoch: killed in epoch 2, snapshot after step 11
_REFERENCE: dict = {}


@dataclass
class Run:
    """The worker's markers, per rank."""
    events: dict = field(default_factory=dict)         # rank -> {event: fields} (the last of each kind)
    other: dict = field(default_factory=dict)          # rank -> the last lines that were not markers
    result: object = None

    def on_line(self, rank: int, line: str) -> None:
        from course_lib.core.rankkit import parse
        ev = parse(line)
        if ev is None:
            self.other.setdefault(rank, []).append(line)
            del self.other[rank][:-6]
        else:
            self.events.setdefault(rank, {})[ev["ev"]] = ev

    def get(self, rank: int, event: str) -> dict | None:
        return self.events.get(rank, {}).get(event)

    def first(self, event: str) -> tuple[int, dict] | tuple[None, None]:
        for rank in range(WORLD):
            if self.get(rank, event):
                return rank, self.get(rank, event)
        return None, None


def run_worker(path: str, folder: Path, timeout: float, call_timeout: float) -> tuple[Run, str]:
    from course_lib.core.launch import launch
    run, snapshot = Run(), str(folder / "snapshot.pt")
    run.result = launch(["-m", "course_lib.ckpt.worker", os.path.abspath(path), snapshot,
                         "--seconds", str(call_timeout)], nprocs=WORLD,
                        timeout=timeout, cwd=folder, on_line=run.on_line, grace=5.0, env=RANK_ENV)
    return run, snapshot


def _failure(run: Run, phase: str) -> str | None:
    """The message for an error or a hang in ``phase`` (save, load, crash-save) on some rank, if any."""
    for kind in ("error", "stuck"):
        rank, ev = run.first(kind)
        if ev is not None and ev["phase"] == phase:
            where = f" at {ev['where']}" if ev.get("where") else ""
            if kind == "error":
                return f"{phase}_snapshot raised on rank {rank}{where}: {ev['error']}"
            return (f"{phase}_snapshot did not return on rank {rank} within {ev['seconds']:.0f} s{where}: "
                    "a collective that not every rank calls waits forever")
    return None


def restored_verdicts(report: Report, run: Run) -> None:
    """model ... RNG states: every rank's verdict; the first failing rank's message."""
    problem = _failure(run, "save") or _failure(run, "load")
    for item in RESTORED:
        per_rank = {r: run.get(r, "restored")[item] for r in range(WORLD) if run.get(r, "restored")}
        if problem or len(per_rank) < WORLD:
            report.add(item, False, problem or f"not every rank got this far:\n{_tail(run)}")
            continue
        bad = [(r, v[1]) for r, v in per_rank.items() if not v[0]]
        if bad:
            r, msg = bad[0]
            ranks = "" if len(bad) == 1 else f" (also rank {', '.join(str(b[0]) for b in bad[1:])})"
            report.add(item, False, f"rank {r}{ranks}: {msg}")
        else:
            report.add(item, True, f"on {WORLD} ranks: {per_rank[0][1]}")


def writes_verdict(report: Report, run: Run, snapshot: str) -> None:
    saved = {r: run.get(r, "saved") for r in range(WORLD)}
    others = {r: v["writes"] for r, v in saved.items() if r != 0 and v and v["writes"]}
    name = os.path.basename(snapshot)
    if others:
        r, writes = next(iter(others.items()))
        how = ", ".join(f"{kind} {os.path.basename(target)}" for kind, target in writes[:3])
        report.add("rank 0 writes", False, f"rank {r} wrote too ({how}): every rank holds the same state, one "
                   "writer is enough; W ranks writing one file at once collide. Let rank 0 write, after "
                   "gathering what only the other ranks have (their random generators)")
        return
    if any(v is None for v in saved.values()) or _failure(run, "save"):
        report.add("rank 0 writes", False, _failure(run, "save") or f"save_snapshot did not finish:\n{_tail(run)}")
        return
    file_ev = run.get(0, "file")
    if not saved[0]["writes"] or not file_ev or not file_ev.get("sha"):
        report.add("rank 0 writes", False, f"after save_snapshot there is no file at the path it was given "
                   f"({name}): rank 0 must write the snapshot there")
        return
    report.add("rank 0 writes", True, f"rank 0 wrote {name}; rank 1 wrote nothing")


def atomic_verdict(report: Report, run: Run, snapshot: str) -> None:
    problem = _failure(run, "save") or _failure(run, "load") or _failure(run, "crash-save")
    before = (run.get(0, "file") or {}).get("sha")
    if problem or not before:
        report.add("atomic write", False, "not tested: " + (problem or "no first snapshot was written"))
        return
    crash_rank, crash = run.first("crash")
    if crash is None:
        report.add("atomic write", False, "not tested: the second save_snapshot never called torch.save (the "
                   "check makes torch.save die halfway through its write)")
        return
    from course_lib.ckpt.compare import file_hash
    after, name = file_hash(snapshot), os.path.basename(snapshot)
    target = os.path.basename(crash["target"])
    if after == before:
        report.add("atomic write", True, f"rank {crash_rank} died halfway through writing {target}; the previous "
                   f"{name} was still there, whole")
        return
    state = ("is gone" if after is None else
             f"is now half a file ({os.path.getsize(snapshot):,} bytes) that does not load")
    report.add("atomic write", False, f"rank {crash_rank} died halfway through writing {target}, and {name} {state}: "
               "the crash destroyed the last good snapshot. Write to a temporary file in the same folder, flush "
               "and os.fsync it, then os.replace() it over the snapshot (a rename is atomic)")


def _tail(run: Run) -> str:
    lines = [f"rank {r}: {line}" for r, ls in sorted(run.other.items()) for line in ls[-3:]]
    summary = run.result.summary() if run.result is not None else ""
    return "\n".join([summary, *lines[-6:]]).strip()


def reference_curve(timeout: float):
    """The uninterrupted run's losses (no snapshots at all), computed once per process."""
    from course_lib.ckpt import curves
    key = tuple(sorted(RESUME.items()))
    if key not in _REFERENCE:
        ref = curves.run(None, nprocs=WORLD, epochs=RESUME["epochs"], every=RESUME["every"], timeout=timeout,
                         style="srun")
        if not ref.result.ok:
            raise RuntimeError("the uninterrupted reference run failed:\n" + ref.result.summary())
        _REFERENCE[key] = ref.losses
    return _REFERENCE[key]


def resume_verdict(report: Report, path: str, timeout: float) -> None:
    from course_lib.ckpt import curves
    reference = reference_curve(timeout)
    run = curves.run(path, nprocs=WORLD, epochs=RESUME["epochs"], every=RESUME["every"], kill_at=RESUME["kill_at"],
                     restarts=1, timeout=timeout)
    head = f"torchrun --max-restarts 1, rank 1 killed before step {RESUME['kill_at']}"
    if not run.result.ok:
        report.add("resume", False, f"{head}: the run did not finish\n" + run.result.summary())
        return
    if len(run.attempts) < 2:
        report.add("resume", False, f"{head}: no restart was seen:\n" + "\n".join(run.lines[-6:]))
        return
    first, second = run.attempts[0], run.attempts[1]
    last = first.snapshots[-1] if first.snapshots else None
    if second.resumed is None:
        report.add("resume", False, f"{head}: after the restart, training began again at step 1 (no snapshot "
                   "was found, so load_snapshot was not called)")
        return
    ok, msg = curves.compare(reference, run.losses)
    where = f"resumed at epoch {second.resumed[0]}, step {second.resumed[1]}"
    if last is not None and tuple(second.resumed) != tuple(last):
        where += f" (the last snapshot before the kill was at epoch {last[0]}, step {last[1]})"
    report.add("resume", ok, f"{head}; {where}: {msg}")


def check(path: str, timeout: float = 240, resume: bool = True, call_timeout: float = 60) -> Report:
    """Check the learner's file at ``path``; ``timeout`` bounds each multi-process run, ``call_timeout`` each call
    of save_snapshot or load_snapshot; ``resume=False`` leaves out the torchrun experiment (the slow part)."""
    from course_lib.core import warm
    with warm.session(RANK_ENV):   # one fork server for the worker, the reference and the torchrun runs
        return _check(path, timeout, resume, call_timeout)


def _check(path: str, timeout: float, resume: bool, call_timeout: float) -> Report:
    start, path = time.monotonic(), str(path)
    report = Report("ckpt", path)
    with tempfile.TemporaryDirectory(prefix="ckpt-check-") as tmp:
        run, snapshot = run_worker(path, Path(tmp), timeout, call_timeout)
        imp = run.get(0, "import")
        if imp is None or not imp["ok"]:
            report.add(os.path.basename(path), False, _import_message(imp, run))
            report.seconds = time.monotonic() - start
            return report
        restored_verdicts(report, run)
        writes_verdict(report, run, snapshot)
        atomic_verdict(report, run, snapshot)
    if resume and (_failure(run, "save") or _failure(run, "load")):
        report.add("resume", False, "not tried: save_snapshot and load_snapshot must run without an error first")
    elif resume:
        resume_verdict(report, path, timeout)
    report.seconds = time.monotonic() - start
    return report


def _import_message(imp, run: Run) -> str:
    if imp is None:
        return "the checker's worker did not start:\n" + _tail(run)
    if imp.get("missing"):
        return ("no function " + " and ".join(f"{n}(...)" for n in imp["missing"]) + " in the file: the loop calls "
                "save_snapshot(path, model, optimizer, scheduler, epoch, step) and "
                "load_snapshot(path, model, optimizer, scheduler) -> (epoch, step)")
    where = f" at {imp['where']}" if imp.get("where") else ""
    return f"the file does not load{where}: {imp['error']}\nfix this first, then check again"
