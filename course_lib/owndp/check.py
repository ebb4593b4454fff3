"""Checker of the write-DDP-yourself exercise: ``course check ownddp PATH``.

On W = 2 and 3 real gloo processes (``course_lib.owndp.worker``, launched srun-style), each of the learner's four
variants, NaiveDDP, FlatDDP, OverlappedDDP and BucketedDDP (cases.py says what is asked): the parameters after
each of several SGD steps equal a single-process run on the same global batch, on a plain model and on one with
tied weights, a frozen and an unused parameter; the all-reduces one step issues (naive: one per gradient; flat:
one; overlapped: one per gradient; bucketed: one per bucket, for bucket sizes that make 1, 2 and 3 buckets); the
overlapped variants start communicating during backward and do not wait there.

A case that does not finish within ``case_timeout`` stops its ranks; the report says it hung, with the learner's
line each rank waited on, and the checker launches again after it. ``check_many`` checks several files in one
launch per world size (the tests' faulty submissions).
"""
from __future__ import annotations

import sys
import time
from collections import defaultdict

from course_lib.core import rankkit
from course_lib.core.report import MISSING, Report, Verdict
from course_lib.owndp.worker import ITEMS

HANG_HINT = ("every rank must issue the same collectives in the same order: a collective that one rank skips (an "
             "`if` on the rank, a gradient only one rank has) leaves the others waiting in theirs")


def _run_worker(paths, nprocs, timeout, case_timeout, skip):
    """Launch the worker; returns (verdicts, {rank: (case, where)} of ranks left inside a case, result, lines)."""
    from course_lib.core.launch import launch
    lines: dict[int, list[str]] = defaultdict(list)
    args = ["-m", "course_lib.owndp.worker", *paths, "--case-timeout", str(case_timeout)]
    if skip:
        args += ["--skip", ",".join(sorted(skip))]
    result = launch(args, nprocs=nprocs, timeout=timeout, on_line=lambda r, line: lines[r].append(line), grace=3.0)
    verdicts, inside = [], {}
    for rank in range(nprocs):
        for event in filter(None, map(rankkit.parse, lines[rank])):
            ev = event.pop("ev")
            if ev in ("start", "stuck"):
                inside[rank] = (event["case"], event.get("where", ""))
            elif ev == "end":
                inside.pop(rank, None)
            elif ev == "verdict":
                verdicts.append(event)
    return verdicts, inside, result, lines


def _stuck_verdict(inside, case_timeout):
    case = max((c for c, _ in inside.values()), key=[c for c, _ in inside.values()].count)
    ranks = sorted(r for r, (c, _) in inside.items() if c == case)
    where = [f"rank {r} was waiting at {w}" for r, (c, w) in sorted(inside.items()) if c == case and w]
    return {"case": case, "item": case.split("@")[0], "rank": ranks[0], "ok": False, "stuck": True,
            "message": "\n".join([f"W={case.split('@')[1]}: hung: did not finish (ranks {ranks} still inside it "
                                  f"after {case_timeout:.0f} s)", *where, "hint: " + HANG_HINT])}


def _on_world(path, nprocs, timeout, case_timeout):
    """All verdicts on ``nprocs`` ranks, launching again after a case that hung."""
    verdicts, skip, deadline = [], set(), time.monotonic() + timeout
    for _ in range(len(ITEMS) + 1):
        left = deadline - time.monotonic()
        if left < 5:
            verdicts.append({"case": "deadline", "item": None, "rank": 0, "ok": False,
                             "message": f"the overall deadline of {timeout:.0f} s was reached on {nprocs} ranks"})
            break
        got, inside, result, lines = _run_worker([path], nprocs, left, case_timeout, skip)
        if inside:   # a rank whose peer was stopped fails the cases after the hung one: they run again
            stuck = _stuck_verdict(inside, case_timeout)
            last = ITEMS.index(stuck["item"])
            got = [v for v in got if v["item"] is None or ITEMS.index(v["item"]) <= last] + [stuck]
        verdicts += got
        skip |= {v["case"] for v in got}
        if result.ok and not inside:
            break
        if not inside:
            verdicts.append(rankkit.worker_failed(nprocs, result, lines))
            break
    return verdicts


def check(path: str, timeout: float = 180, case_timeout: float = 30, world_sizes=(2, 3)) -> Report:
    """Check ``path`` (the learner's own_ddp.py); ``timeout`` bounds the runs on each world size."""
    from course_lib.core import warm
    start, verdicts = time.monotonic(), []
    with warm.session():   # one fork server that imported torch once, for every launch
        for nprocs in world_sizes:
            verdicts += _on_world(str(path), nprocs, timeout, case_timeout)
            if not any(v["ok"] for v in verdicts):   # nothing works (a starter, a file that does not load): the
                break                                # next world size would only repeat it
    return _report(path, verdicts, start)


def check_many(paths, timeout: float = 180, case_timeout: float = 30, world_sizes=(2, 3)) -> list[Report]:
    """``check`` of each of ``paths`` in one launch per world size; if a launch hangs or fails, each file is
    checked again alone, so that one file's hang cannot cost another its verdicts."""
    from course_lib.core import warm
    start, by_file = time.monotonic(), defaultdict(list)
    with warm.session():
        for nprocs in world_sizes:
            got, inside, result, _ = _run_worker([str(p) for p in paths], nprocs, timeout, case_timeout, ())
            if inside or not result.ok:
                return [check(p, timeout, case_timeout, world_sizes) for p in paths]
            for v in got:
                by_file[v.pop("file", 0)].append(v)
    return [_report(p, by_file[k], start) for k, p in enumerate(paths)]


def _report(path, verdicts, start) -> Report:
    report = Report("ownddp", str(path))
    fatal = [v for v in verdicts if v["case"] == "import"]
    if fatal:
        report.add("own_ddp.py", False, fatal[0]["message"])
    else:
        summarise(report, verdicts)
    report.seconds = time.monotonic() - start
    return report


def summarise(report: Report, verdicts: list[dict]) -> None:
    """One verdict per variant: pass only if every case on every rank passed; else the most telling failure
    (a hang, then a rank's own message, then 'another rank failed')."""
    by_item = defaultdict(list)
    for v in verdicts:
        by_item[v["item"]].append(v)
    for item in ITEMS:
        vs = by_item.get(item)
        if not vs:
            continue
        bad = sorted((v for v in vs if not v["ok"]), key=lambda v: (not v.get("stuck"), bool(v.get("other"))))
        if bad and bad[0].get("missing"):
            report.verdicts.append(Verdict(item, MISSING, bad[0]["message"]))
        elif bad:
            report.add(item, False, bad[0]["message"])
        else:
            worlds = ", ".join(sorted({v["case"].split("@")[1] for v in vs}, key=int))
            report.add(item, True, f"W={worlds}: {vs[0]['message']}")
    for v in by_item.get(None, []):
        report.add("check run", False, v["message"])


if __name__ == "__main__":   # python -m course_lib.owndp.check PATH
    r = check(sys.argv[1])
    print(r.text())
    sys.exit(0 if r.passed else 1)
