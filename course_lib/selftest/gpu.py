"""Run every GPU path of the course and report each as PASS, FAIL, NOT POSSIBLE HERE or NOT RUN (``make gpu-check``).

    course selftest gpu                       # the default plan; report in out/gpu-check/
    course selftest gpu --only serial-fp32,throughput --out /tmp/gpu-check
    course selftest gpu --all --budget 540 --require throughput,ddp-gloo-cuda

Each item runs under a deadline and every process it starts is stopped when it ends; the report is rewritten
after every item. ``--budget SECONDS`` starts an item only while its estimate fits what is left (else NOT RUN,
saying so) and cuts its deadline to what is left. Exit codes: 0 every item that could run here passed (those
NOT POSSIBLE HERE or NOT RUN are listed on the last line and in the report); 1 an item FAILed; 2 bad input;
3 nothing failed, but an item named in ``--require`` did not PASS. See docs/gpu-check.md.
"""
import argparse
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import psutil

from course_lib.cli import comma_list
from course_lib.core.paths import out_dir
from course_lib.runtime.proc import stop_tree
from course_lib.selftest import report
from course_lib.selftest.items import BY_NAME, ITEMS, plan_seconds, runs_on_one_gpu
from course_lib.selftest.probe import probe_within
from course_lib.selftest.runs import FAIL, NOT_POSSIBLE, NOT_RUN, Context, Outcome


def run_item(item, probe, folder: Path, scale: float = 1.0, left: float | None = None, starting=None) -> dict:
    """One item: NOT POSSIBLE from its needs, NOT RUN when its estimate or least deadline exceeds ``left`` (the
    budget), else its outcome within its deadline cut to ``left``; nothing left running."""
    start = time.monotonic()
    why, full = item.needs(probe), item.timeout * scale
    if why and probe.gpus and runs_on_one_gpu(item):
        # where there is a GPU the check exists to run it: a green report without it would have tested nothing
        outcome = Outcome(FAIL, f"not possible on this machine with {probe.gpus} GPU(s): {why}. It runs on one GPU: "
                                "where there is a GPU it must run")
    elif why:
        outcome = Outcome(NOT_POSSIBLE, why)
    elif left is not None and max(item.estimate, item.floor) > left:
        least = f", a deadline of at least {item.floor:.0f} s" if item.floor > item.estimate else ""
        outcome = Outcome(NOT_RUN, f"budget: estimated {item.estimate:.0f} s on one H100{least}, "
                                   f"{max(left, 0):.0f} s left (--budget)")
    else:
        before = set(psutil.Process().children(recursive=True))   # psutil: a reused pid is another process
        deadline = full if left is None else min(full, left)
        if starting:
            starting(item, deadline)
        try:
            outcome = item.run(Context(probe, folder / item.name, deadline))
        except Exception as e:  # noqa: BLE001 - an item that breaks is that item's FAIL, the others still run
            where = traceback.extract_tb(e.__traceback__)[-1]
            outcome = Outcome(FAIL, f"{type(e).__name__}: {e} (at {Path(where.filename).name}:{where.lineno})")
        finally:    # the backstop (its runs stop their own trees); what was there before (a notebook's) stays
            stop_tree([p for p in psutil.Process().children(recursive=True) if p not in before])
        if outcome.status == FAIL and deadline < full and time.monotonic() - start >= deadline - 1:
            # the FAIL came when a deadline the budget had cut ran out: the budget stopped it
            first = outcome.detail.splitlines()[0][:200] if outcome.detail else ""
            outcome = Outcome(NOT_RUN, f"budget: stopped at its deadline of {deadline:.0f} s, cut by --budget from "
                                       f"{full:.0f} s; it had: {first}", outcome.figures)
    return {"name": item.name, "what": item.what, "precision": item.precision, "status": outcome.status,
            "detail": outcome.detail, "figures": outcome.figures, "seconds": round(time.monotonic() - start, 1),
            "estimate_s": item.estimate}


def names(text: str | None) -> list[str]:
    asked = comma_list(text or "")
    unknown = [n for n in asked if n not in BY_NAME]
    if unknown:
        raise ValueError(f"no such item: {', '.join(unknown)} (items: {', '.join(BY_NAME)})")
    return asked


def select(only: str | None, everything: bool = False) -> list:
    """The items named in ``only`` (else all with ``everything``, else the default plan), in run order."""
    asked = names(only)
    return [i for i in ITEMS if (i.name in asked if asked else everything or i.default)]


def add_arguments(p):
    # `course selftest gpu` sets it; the old spelling `course selftest --gpu` still works, unlisted
    p.add_argument("--gpu", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=out_dir() / "gpu-check", metavar="DIR",
                   help="report folder (default: out/gpu-check)")
    p.add_argument("--only", help="comma-separated item names (default: the default plan)")
    p.add_argument("--all", action="store_true", help="every item, the notebooks too (default: the default plan)")
    p.add_argument("--require", help="comma-separated items that must PASS: one NOT POSSIBLE or NOT RUN makes "
                                     "the exit code 3")
    p.add_argument("--budget", type=float, help="seconds for the whole run: an item whose estimate no longer fits "
                                                "is NOT RUN; deadlines are cut to what is left")
    p.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every item's deadline")
    p.add_argument("--list", action="store_true", help="list the items and exit")


def run(args) -> int:
    if not (args.gpu or args.list):
        print("course selftest: say `course selftest gpu` (the GPU self-check), or --list", file=sys.stderr)
        return 2
    try:
        items, required = select(args.only, args.all), names(args.require)
        outside = [n for n in required if n not in {i.name for i in items}]
        if outside:
            raise ValueError(f"--require {','.join(outside)}: not in the items run (add it to --only, or --all)")
        if args.budget is not None and args.budget <= 0:
            raise ValueError("--budget takes a number of seconds above 0")
    except ValueError as e:
        print(f"course selftest: {e}", file=sys.stderr)
        return 2
    if args.list:
        for item in items:
            print(f"{item.name:<19} ~{item.estimate:4.0f} s  {item.what}")
        return 0
    return check(items, args.out, args.timeout_scale, budget=args.budget, required=required)


def check(items, out: Path, scale: float = 1.0, budget: float | None = None, required=()) -> int:
    """Run ``items``, the report rewritten before the first and after each; the exit code. SIGTERM (a wrapper's
    ``timeout``) ends it as Ctrl-C does: the running item's processes, in sessions of their own, are stopped."""
    if threading.current_thread() is not threading.main_thread():
        return _check(items, out, scale, budget, required)
    before = signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
    try:
        return _check(items, out, scale, budget, required)
    finally:
        signal.signal(signal.SIGTERM, before)


def _check(items, out: Path, scale: float, budget: float | None, required) -> int:
    out = Path(out).resolve()   # the items' folders: a child started elsewhere (the warm server) finds them
    started, start = datetime.now(timezone.utc).isoformat(timespec="seconds"), time.monotonic()
    machine = probe_within()
    print(f"GPU self-check: {machine.summary()}; plan ~{plan_seconds(items, machine):.0f} s (estimates for one H100)"
          + (f", budget {budget:.0f} s" if budget else ""), flush=True)
    results = []

    def save(pending, running=""):
        data = report.as_json(asdict(machine), results, started, time.monotonic() - start, pending=pending,
                              running=running, required=required, budget=budget)
        return data, report.write(out, data, machine.summary())

    for n, item in enumerate(items):
        save([i.name for i in items[n + 1:]], running=item.name)
        left = None if budget is None else budget - (time.monotonic() - start)
        r = run_item(item, machine, out, scale, left, starting=lambda i, deadline: print(
            f"{i.name:<19} running (estimate {i.estimate:.0f} s, deadline {deadline:.0f} s)", flush=True))
        results.append(r)
        first = r["detail"].splitlines()[0][:100] if r["detail"] else ""
        print(f"{item.name:<19} {r['status']:<17} {r['seconds']:5.0f} s  {first}".rstrip(), flush=True)
    data, (js, md) = save([])
    print(f"{report.headline(data)}; report: {md} and {js.name}")
    if data["not_possible"]:
        print(f"not tested here: {', '.join(data['not_possible'])}")
    missing = [n for n in required if n not in {r["name"] for r in results if r["status"] == "PASS"}]
    if missing and data["exit_code"] == report.REQUIRED_MISSING:
        print(f"required but not passed: {', '.join(missing)} (exit code {report.REQUIRED_MISSING})")
    return data["exit_code"]
