"""Checker for the ZeRO exercise: ``course check zero PATH``.

On W = 2 and 4 real gloo processes (``course_lib.zero.worker``, launched srun-style through
``course_lib.core.launch``), in this order, each later piece built on the earlier ones:

- ``shard_range``: every element of a flat vector owned by exactly one rank, in rank order, no shard longer
  than ceil(n/W) (also for n < W and n not divisible by W);
- ``reduce_scatter`` / ``all_gather``: this rank's shard of the sum / every shard in its place, on point-to-point
  operations only (any collective the learner's code calls is counted and named);
- ``ZeRO-1`` / ``ZeRO-2``: the learner's ZeroOptimizer against torch's DistributedDataParallel, step by step
  (zerocase.py): equal parameters, optimizer state per rank about 1/W of DDP's, and for stage 2 no
  full-size gradients kept and no all-reduce. It runs on the learner's own collectives once those passed,
  else on the library's (the verdict says which), so a broken ring does not hide a correct optimizer.

A case that does not finish within ``case_timeout`` stops its ranks; the checker reports it stuck (with the
learner's line each rank waited on) and launches again after it. ``check_many`` checks several files in one
launch per world size (the tests' faulty submissions: torch and DDP start once, not once per file).
"""
from __future__ import annotations

import sys
import time
from collections import defaultdict

from course_lib.core import rankkit
from course_lib.core.report import MISSING, Report, Verdict

ITEMS = ("shard_range", "reduce_scatter", "all_gather", "ZeRO-1", "ZeRO-2")
BUILT_ON = {"reduce_scatter": ("shard_range",), "all_gather": ("shard_range",), "ZeRO-1": ("shard_range",),
            "ZeRO-2": ("shard_range",)}
HANG_HINT = ("with gloo a send waits for its matching receive: if every rank sends first, nobody receives. Post "
             "both at once (sendrecv, batch_isend_irecv) and check that every send has a receive on the rank it names")


def _run_worker(paths, nprocs, timeout, case_timeout, skip, passed):
    """Launch the worker on ``paths``; returns (verdict dicts, {rank: (case, where)} still running, LaunchResult,
    lines)."""
    from course_lib.core.launch import launch
    lines: dict[int, list[str]] = defaultdict(list)
    args = ["-m", "course_lib.zero.worker", *paths, "--case-timeout", str(case_timeout)]
    if skip:
        args += ["--skip", ",".join(sorted(skip))]
    if passed:
        args += ["--passed", ",".join(sorted(passed))]
    result = launch(args, nprocs=nprocs, timeout=timeout, on_line=lambda r, line: lines[r].append(line), grace=3.0)
    verdicts, current, stuck = [], {}, {}
    for rank in range(nprocs):
        for line in lines[rank]:
            event = rankkit.parse(line)
            ev = event.pop("ev") if event else None
            if ev == "start":
                current[rank] = (event["case"], "")
            elif ev == "end":
                current.pop(rank, None)
            elif ev == "stuck":
                stuck[rank] = (event["case"], event.get("where", ""))
            elif ev == "verdict":
                verdicts.append(event)
    return verdicts, {**current, **stuck}, result, lines


def _stuck_verdict(current, case_timeout):
    cases = [c for c, _ in current.values()]
    case = max(cases, key=cases.count)
    ranks = sorted(r for r, (c, _) in current.items() if c == case)
    where = [f"rank {r} was waiting at {w}" for r, (c, w) in sorted(current.items()) if c == case and w]
    return {"case": case, "item": case.split("@")[0], "rank": ranks[0], "ok": False, "stuck": True,
            "message": "\n".join([f"W={case.split('@')[1]}: did not finish (ranks {ranks} still inside it after "
                                  f"{case_timeout:.0f} s)", *where, "hint: " + HANG_HINT])}


def _passed_items(verdicts):
    by_item = defaultdict(list)
    for v in verdicts:
        by_item[v["item"]].append(v["ok"])
    return {item for item, oks in by_item.items() if item and all(oks)}


def _on_world(path, nprocs, timeout, case_timeout):
    """All verdicts on ``nprocs`` ranks, launching again after a stuck case."""
    verdicts, skip, deadline = [], set(), time.monotonic() + timeout
    for _ in range(len(ITEMS) + 1):   # at most one relaunch per case
        left = deadline - time.monotonic()
        if left < 5:
            verdicts.append({"case": "deadline", "item": None, "rank": 0, "ok": False,
                             "message": f"the overall deadline of {timeout:.0f} s was reached on {nprocs} ranks"})
            break
        got, current, result, lines = _run_worker([path], nprocs, left, case_timeout, skip, _passed_items(verdicts))
        verdicts += got
        skip |= {v["case"] for v in got}
        if result.ok and not current:
            break
        if current:   # some ranks were inside a case: report it stuck and go on after it
            stuck = _stuck_verdict(current, case_timeout)
            verdicts.append(stuck)
            skip.add(stuck["case"])
            continue
        verdicts.append(rankkit.worker_failed(nprocs, result, lines))
        break
    return verdicts


def check(path: str, timeout: float = 180, case_timeout: float = 30, world_sizes=(2, 4)) -> Report:
    """Check ``path`` (the learner's zero.py); ``timeout`` bounds the runs on each world size."""
    from course_lib.core import warm
    with warm.session():   # one fork server for every launch (inside check_many's, that one serves)
        return _check(path, timeout, case_timeout, world_sizes)


def _check(path: str, timeout: float, case_timeout: float, world_sizes) -> Report:
    start = time.monotonic()
    verdicts = []
    for nprocs in world_sizes:
        verdicts += _on_world(path, nprocs, timeout, case_timeout)
        if any(v["case"] == "import" for v in verdicts):
            break
    return _report(path, verdicts, start)


def check_many(paths, timeout: float = 180, case_timeout: float = 30, world_sizes=(2, 4)) -> list[Report]:
    """``check`` for each of ``paths``, all in one launch per world size; if a launch hangs or fails, each file is
    checked again alone (``check``), so one file's hang cannot cost another its verdicts."""
    from course_lib.core import warm
    with warm.session():
        return _check_many([str(p) for p in paths], timeout, case_timeout, world_sizes)


def _check_many(paths: list, timeout: float, case_timeout: float, world_sizes) -> list[Report]:
    start = time.monotonic()
    by_file: dict[int, list[dict]] = defaultdict(list)
    for nprocs in world_sizes:
        got, current, result, _ = _run_worker(paths, nprocs, timeout, case_timeout, (), ())
        if current or not result.ok:
            return [check(p, timeout, case_timeout, world_sizes) for p in paths]
        for v in got:
            by_file[v.pop("file", 0)].append(v)
    return [_report(p, by_file[k], start) for k, p in enumerate(paths)]


def _report(path, verdicts, start) -> Report:
    report = Report("zero", path)
    fatal = [v for v in verdicts if v["case"] == "import"]
    if fatal:
        report.add("zero.py", False, fatal[0]["message"])
    else:
        summarise(report, verdicts)
    report.seconds = time.monotonic() - start
    return report


def _first_failure(bad):
    """The most telling failure: a hang, then a rank's own message, then 'another rank failed'."""
    return sorted(bad, key=lambda v: (not v.get("stuck"), bool(v.get("other"))))[0]


def summarise(report: Report, verdicts: list[dict]) -> None:
    """One verdict per item: pass only if every case on every rank passed; else the first failure's message."""
    by_item: dict[str, list[dict]] = defaultdict(list)
    general = []
    for v in verdicts:
        (by_item[v["item"]] if v["item"] else general).append(v)
    for item in ITEMS:
        vs = by_item.get(item)
        if not vs:
            continue
        if any(v.get("missing") for v in vs):
            report.verdicts.append(Verdict(item, MISSING, next(v for v in vs if v.get("missing"))["message"]))
            continue
        bad = [v for v in vs if not v["ok"]]
        if not bad:
            report.add(item, True, _pass_text(item, vs))
            continue
        msg = _first_failure(bad)["message"]
        earlier = [v.item for v in report.verdicts if v.result != "pass" and v.item in BUILT_ON.get(item, ())]
        if earlier:
            msg += f"\n({item} is built on {', '.join(earlier)}: fix that first)"
        report.add(item, False, msg)
    for v in general:
        report.add("check run", False, v["message"])


def _pass_text(item, vs):
    rank0 = sorted((v for v in vs if v["rank"] == 0), key=lambda v: int(v["case"].split("@")[1]))
    worlds = ", ".join(v["case"].split("@")[1] for v in rank0)
    if not item.startswith("ZeRO"):
        return f"W={worlds}: {rank0[0]['message']}"
    ratios = "; ".join(f"W={v['case'].split('@')[1]}: {v['figures']['ratio']:.2f}" for v in rank0)
    return f"{rank0[-1]['message'].split(';')[0]}; AdamW state on rank 0 / DDP's: {ratios}"


if __name__ == "__main__":   # python -m course_lib.zero.check PATH
    r = check(sys.argv[1])
    print(r.text())
    sys.exit(0 if r.passed else 1)
