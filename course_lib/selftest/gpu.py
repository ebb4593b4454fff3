"""Run every GPU path of the course and report each as PASS, FAIL or NOT POSSIBLE HERE (``make gpu-check``).

    course selftest --gpu                       # all items; report in out/gpu-check/
    course selftest --gpu --only serial-fp32,ddp-nccl --out /tmp/gpu-check

Each item runs under a deadline and every process it starts is stopped when it ends. Exit code 0 when no
item FAILs (NOT POSSIBLE HERE is not a failure: a CPU machine passes with every item not possible), 1 when
one does, 2 on bad input. See docs/gpu-check.md.
"""
from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

from course_lib.core.paths import out_dir
from course_lib.selftest.runs import FAIL, NOT_POSSIBLE, Context, Outcome


def run_item(item, probe, folder: Path, scale: float = 1.0) -> dict:
    """One item: NOT POSSIBLE from its needs, else its outcome (an exception is a FAIL); nothing left running."""
    start = time.monotonic()
    why = item.needs(probe)
    if why:
        outcome = Outcome(NOT_POSSIBLE, why)
    else:
        before = _children()
        try:
            outcome = item.run(Context(probe, folder / item.name, item.timeout * scale))
        except Exception as e:  # noqa: BLE001 - an item that breaks is that item's FAIL, the others still run
            where = traceback.extract_tb(e.__traceback__)[-1]
            outcome = Outcome(FAIL, f"{type(e).__name__}: {e} (at {Path(where.filename).name}:{where.lineno})")
        finally:
            _stop_leftovers(before)
    return {"name": item.name, "what": item.what, "status": outcome.status, "detail": outcome.detail,
            "figures": outcome.figures, "seconds": round(time.monotonic() - start, 1)}


def _key(p):
    """(pid, start time): a pid the system reuses later is another process."""
    try:
        return p.pid, p.create_time()
    except Exception:  # noqa: BLE001 - psutil.Error: it has just exited
        return None


def _children() -> set:
    from course_lib.core.proc import descendants

    return {_key(p) for p in descendants(os.getpid())}


def _stop_leftovers(before: set) -> None:
    """Kill what an item started and left behind (its runs kill their own trees; this is the backstop).
    Processes that were there before the item (a notebook's, a test session's) are left alone."""
    from course_lib.core.proc import descendants, signal_all

    signal_all([p for p in descendants(os.getpid()) if _key(p) not in before], signal.SIGKILL)


def select(only: str | None) -> list:
    """The items named in ``only`` (comma-separated), in run order; ValueError naming the unknown ones."""
    from course_lib.selftest.items import BY_NAME, ITEMS

    if not only:
        return list(ITEMS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise ValueError(f"no such item: {', '.join(unknown)} (items: {', '.join(BY_NAME)})")
    return [i for i in ITEMS if i.name in names]


def add_arguments(p):
    p.add_argument("--gpu", action="store_true", help="the GPU self-check (the only one for now)")
    p.add_argument("--out", type=Path, default=out_dir() / "gpu-check", help="report folder")
    p.add_argument("--only", help="comma-separated item names (default: all)")
    p.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every item's deadline")
    p.add_argument("--list", action="store_true", help="list the items and exit")


def run(args) -> int:
    if not (args.gpu or args.list):
        print("course selftest: say --gpu (the GPU self-check), or --list", file=sys.stderr)
        return 2
    try:
        items = select(args.only)
    except ValueError as e:
        print(f"course selftest: {e}", file=sys.stderr)
        return 2
    if args.list:
        for item in items:
            print(f"{item.name:<16} {item.what}")
        return 0
    return check(items, args.out, args.timeout_scale)


def check(items, out: Path, scale: float = 1.0) -> int:
    from course_lib.selftest import report
    from course_lib.selftest.probe import probe

    started, start = datetime.now(timezone.utc).isoformat(timespec="seconds"), time.monotonic()
    machine = probe()
    print(f"GPU self-check: {machine.summary()}", flush=True)
    results = []
    for item in items:
        if not item.needs(machine):
            print(f"{item.name:<16} running (deadline {item.timeout * scale:.0f} s)", flush=True)
        r = run_item(item, machine, out, scale)
        results.append(r)
        first = r["detail"].splitlines()[0][:100] if r["detail"] else ""
        print(f"{item.name:<16} {r['status']:<17} {r['seconds']:5.0f} s  {first}".rstrip(), flush=True)
    data = report.as_json(machine.as_dict(), results, started, time.monotonic() - start)
    js, md = report.write(out, data, machine.summary())
    c = data["counts"]
    print(f"{c['PASS']} PASS, {c['FAIL']} FAIL, {c['NOT POSSIBLE HERE']} NOT POSSIBLE HERE; report: {md} and {js.name}")
    return 0 if data["ok"] else 1
