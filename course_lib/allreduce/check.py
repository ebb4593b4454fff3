"""Checker for the all-reduce exercise: ``course check allreduce PATH``.

Each of ``naive_allreduce``, ``ring_allreduce`` and ``tree_allreduce`` runs on W = 1..5 real gloo
processes (``course_lib.allreduce.worker``, launched srun-style), on element counts 0, 1, W-1,
W+1, a prime and 1,000,003, in float32, float64 and int64, plus a 2-D tensor. A case passes when every
rank's *input tensor* holds the sum afterwards (exact for integers, to 1e-5 / 1e-12 for float32 /
float64), without any collective call. Each case has a deadline; a case that runs past it is reported
as a deadlock with the ranks that were stuck and the line each was waiting on.

A function's first failure is its verdict: the message names the function, W, the element count, the
dtype and, for wrong values, expected against got on the first wrong rank.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from course_lib.core.rankkit import parse
from course_lib.core.report import MISSING, Report, Verdict

FUNCTIONS = ("naive_allreduce", "ring_allreduce", "tree_allreduce")
WORLD_SIZES = (1, 2, 3, 4, 5)
WORKER = "course_lib.allreduce.worker"
DEADLOCK_HINT = ("a send or recv without its partner waits forever. With gloo a send waits for the matching "
                 "recv, so if every rank sends first nobody receives: post sends and receives together "
                 "(isend/irecv, batch_isend_irecv) or order them (even ranks send first, odd ranks receive "
                 "first) -- and check that every send has a recv on the rank it names")


@dataclass
class Run:
    """What one launch's markers said, per function."""
    imported: dict | None = None
    labels: dict = field(default_factory=dict)          # (fn, case) -> label
    begun: dict = field(default_factory=dict)           # (fn, case) -> set of ranks
    results: dict = field(default_factory=dict)         # (fn, case) -> {rank: result}
    stuck: dict = field(default_factory=dict)           # (fn, case) -> {rank: stuck event}
    finished: dict = field(default_factory=dict)        # fn -> ok
    other: dict = field(default_factory=dict)           # rank -> last non-marker lines

    def on_line(self, rank: int, line: str) -> None:
        ev = parse(line)
        if ev is None:     # the learner's own output: the last lines go into a crash message
            self.other.setdefault(rank, []).append(line)
            del self.other[rank][:-8]
            return
        kind, key = ev.get("ev"), (ev.get("fn"), ev.get("case"))
        if kind == "import" and (self.imported is None or not ev["ok"]):
            self.imported = ev
        elif kind == "begin":
            self.labels[key] = ev["label"]
            self.begun.setdefault(key, set()).add(rank)
        elif kind == "result":
            self.results.setdefault(key, {})[rank] = ev
        elif kind == "stuck":
            self.stuck.setdefault(key, {})[rank] = ev
        elif kind == "fn_done" and rank == 0:
            self.finished[ev["fn"]] = ev["ok"]


def _case_failure(run: Run, fn: str, world: int) -> str | None:
    """The message for the first failing case of ``fn`` in this run, or None if none failed."""
    keys = sorted(k for k in run.begun if k[0] == fn)
    for key in keys:
        label = run.labels[key]
        results = run.results.get(key, {})
        bad = {r: ev for r, ev in sorted(results.items()) if not ev["ok"]}
        missing = sorted(set(range(world)) - set(results))
        if bad and _after_a_hang(run, key, bad, missing):   # the ranks that saw a partner leave waited too
            return _stuck_message(run, key, label, sorted(missing + list(bad)), world, gone=bad)
        if bad:
            r0, ev = next(iter(bad.items()))
            ranks = sorted(bad)
            who = f"rank {r0}" if len(ranks) == 1 else f"ranks {ranks} (rank {r0} shown)"
            msg = f"{label}: {who}: {ev['msg']}"
            if missing:
                msg += f"\nranks {missing} did not return (waiting on a partner that gave up)"
            return msg
        if missing:
            return _stuck_message(run, key, label, missing, world)
    return None


def _after_a_hang(run: Run, key, bad: dict, missing: list[int]) -> bool:
    """Every failing rank failed only because a partner's connection closed, and a rank that did not return was
    stuck: that rank's watchdog ended it first (on a busy machine the ranks' deadlines do not end at the same
    instant), so the hang is the learner's fault, the closed connection its consequence."""
    stuck = run.stuck.get(key, {})
    return all(ev.get("kind") == "peer_gone" for ev in bad.values()) and any(r in stuck for r in missing)


def _stuck_message(run: Run, key, label: str, missing: list[int], world: int, gone: dict | None = None) -> str:
    """``gone``: ranks that were waiting when a stuck partner's watchdog ended it (their error says where)."""
    stuck, gone = run.stuck.get(key, {}), gone or {}
    returned = sorted(set(range(world)) - set(missing))
    lines = [f"{label}: deadlock or hang: ranks {missing} did not return within the deadline"
             + (f" (ranks {returned} did)" if returned else "")]
    for r in missing:
        ev = stuck.get(r)
        if ev and ev.get("where"):
            lines.append(f"rank {r} was waiting at {ev['where']}")
        elif gone.get(r, {}).get("where"):
            lines.append(f"rank {r} was waiting at {gone[r]['where']} (until its partner's connection closed)")
    lines.append("hint: " + DEADLOCK_HINT)
    return "\n".join(lines)


def _crash_message(run: Run, res, fn: str, world: int) -> str:
    """A rank died (exit code) or the launch ran out of time outside a case's deadline."""
    key = max((k for k in run.begun if k[0] == fn), key=lambda k: k[1], default=None)
    where = run.labels.get(key, f"W={world}")
    codes = ", ".join(f"rank {r.rank}: {'still running' if r.returncode is None else r.returncode}"
                      for r in res.ranks if r.returncode != 0)
    head = (f"{where}: the run exceeded its deadline of {res.elapsed:.0f} s" if res.timed_out
            else f"{where}: a rank exited during the case ({codes})")
    tail = [f"rank {r}: {line}" for r, lines in sorted(run.other.items()) for line in lines[-3:]]
    return "\n".join([head, *tail[-6:]])


def _launch(path: str, world: int, functions: list[str], timeout: float, case_timeout: float, stop=None):
    from course_lib.core.launch import launch
    run = Run()
    res = launch(["-m", WORKER, os.path.abspath(path), "--functions", ",".join(functions),
                  "--case-timeout", str(case_timeout)],
                 nprocs=world, timeout=timeout, on_line=run.on_line, grace=3.0,
                 env={"OMP_NUM_THREADS": "1"}, stop=stop)
    return run, res


def check(path: str, timeout: float = 180, case_timeout: float = 10.0, world_sizes=WORLD_SIZES) -> Report:
    """Check the learner's file at ``path``; ``timeout`` bounds each launch, ``case_timeout`` each case."""
    from course_lib.core import warm
    with warm.session({"OMP_NUM_THREADS": "1"}):   # one fork server for all of this check's launches
        return _check(path, timeout, case_timeout, world_sizes)


PARALLEL = 2   # world sizes run side by side: a rank waits for its peers often enough to leave a core free


def _check(path: str, timeout: float = 180, case_timeout: float = 10.0, world_sizes=WORLD_SIZES) -> Report:
    """The world sizes side by side (PARALLEL at a time, largest first); then, per function, its first failure
    in the order of ``world_sizes`` is its verdict, as if they had run one after the other."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    start = time.monotonic()
    report = Report("allreduce", path)
    stop = threading.Event()     # set on Ctrl-C, or once a file that does not load is seen: the rest stop
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        futures = {w: pool.submit(_one_world, path, w, timeout, case_timeout, stop)
                   for w in sorted(world_sizes, reverse=True)}
        try:
            worlds = {w: futures[w].result() for w in world_sizes}
        except BaseException:
            stop.set()
            raise
    verdicts: dict[str, tuple[str, str]] = {}          # fn -> (result, message), first failure wins
    passed_worlds: dict[str, list[int]] = {f: [] for f in FUNCTIONS}
    failed_import = next((worlds[w][0] for w in world_sizes if worlds[w][0]), None)
    if failed_import:
        report.verdicts.append(Verdict("import", "fail", failed_import))
        report.seconds = time.monotonic() - start
        return report
    for world in world_sizes:
        for fn in FUNCTIONS:
            if fn in verdicts:
                continue
            if fn in worlds[world][1]:
                verdicts[fn] = worlds[world][1][fn]
            else:
                passed_worlds[fn].append(world)
    for fn in FUNCTIONS:
        result, msg = verdicts.get(fn, ("pass", ""))
        if result == "pass":
            msg = (f"W={', '.join(map(str, passed_worlds[fn]))}: element counts 0, 1, W-1, W+1, a prime, "
                   "1,000,003 and a 2-D tensor; float32, float64, int64")
        report.verdicts.append(Verdict(fn, result, msg))
    report.seconds = time.monotonic() - start
    return report


def _one_world(path: str, world: int, timeout: float, case_timeout: float, stop) -> tuple[str | None, dict]:
    """Every function on ``world`` ranks, launching again for the rest after a failure that leaves messages in
    flight: (why the file did not load, or None; {fn: (result, message)} for the functions that failed)."""
    verdicts: dict[str, tuple[str, str]] = {}
    passed: set = set()
    todo = list(FUNCTIONS)
    while todo and not stop.is_set():
        run, res = _launch(path, world, todo, timeout, case_timeout, stop)
        imp = run.imported
        if imp is None or not imp["ok"]:
            if not stop.is_set():
                stop.set()       # the file does not load: the other world sizes need not run
                return _import_message(imp, run, res), {}
            return None, verdicts
        for fn, state in imp["functions"].items():
            if state == "missing":
                verdicts[fn] = (MISSING, f"no function {fn}(tensor, group=None) in the file")
            elif state != "ok":
                verdicts[fn] = ("fail", f"{fn} must accept group=None: the interface is {fn}(tensor, group=None)")
        progressed = False
        for fn in todo:
            if fn in verdicts:
                continue
            if run.finished.get(fn) is True:
                passed.add(fn)
                progressed = True
                continue
            if fn not in {k[0] for k in run.begun}:
                continue            # not reached in this launch: goes into the next one
            progressed = True
            verdicts[fn] = ("fail", _case_failure(run, fn, world) or _crash_message(run, res, fn, world))
        todo = [f for f in todo if f not in verdicts and f not in passed]
        if todo and not progressed:   # nothing started: the launch itself failed
            for fn in todo:
                verdicts[fn] = ("fail", f"W={world}: the worker did not start: {res.summary()}")
            break
    return None, verdicts


def _import_message(imp, run: Run, res) -> str:
    if imp is not None:
        where = f" at {imp['where']}" if imp.get("where") else ""
        return f"the file could not be loaded{where}: {imp['error']}\nfix this first, then check again"
    return "the checker's worker did not start:\n" + res.summary()
