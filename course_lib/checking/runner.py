"""The checker's side of a check: launch the harness's worker per world size, read its markers into one record
per case, launch again after a case that hung or a failure that left messages in flight.

A record (``CaseRecord``) holds every rank's verdict on one case; the summary (``summary.py``) turns the records
into a Report.
"""
import linecache
import os
import re
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from course_lib.checking.deadlock import FOLDER_ENV
from course_lib.checking.protocol import plugin
from course_lib.core.rankkit import parse
from course_lib.runtime import launch as launching  # through the module: tools/bench_checks.py times each launch there

WORKER = "course_lib.checking.worker"
ENV = {"OMP_NUM_THREADS": "1"}


@dataclass
class CaseRecord:
    key: str
    item: str
    label: str
    world: int
    started: set = field(default_factory=set)
    verdicts: dict = field(default_factory=dict)     # rank -> its verdict
    stuck: dict = field(default_factory=dict)        # rank -> where it waited when its deadline fired
    seconds: float = 0.0                             # the case's deadline
    waited: float = 0.0                              # once it hung: how long it really waited (at least the deadline)
    began: float = 0.0                               # when its first rank said "start" (time.monotonic)
    fired: float = 0.0                               # when the last rank said "stuck"
    deadlock: bool = False                           # the ranks saw every rank wait on another (not the deadline)
    died: dict = field(default_factory=dict)         # rank -> the learner's line where its process died (a signal)
    ended: str = ""                                  # why ranks gave no verdict: "hung", or how the launch ended

    @property
    def failed(self) -> bool:
        return bool(self.ended) or any(not v["ok"] for v in self.verdicts.values())


class Launch:
    """The markers of one launch, per file (``on_line`` is the launch's line callback)."""

    def __init__(self, world: int, seconds: float):
        self.world, self.seconds = world, seconds
        self.records: dict = {}       # (file, case key) -> CaseRecord, in the order the cases started
        self.loads: dict = {}         # file -> the verdict that the file does not load
        self.done = self.relaunch = False
        self.other: dict = {}         # rank -> the last lines that were not markers
        self.result = None
        self.crashes: dict = {}       # rank -> the learner's line where it died of a signal

    def record(self, ev: dict) -> CaseRecord:
        key = (ev.get("file", 0), ev["case"])
        if key not in self.records:
            self.records[key] = CaseRecord(ev["case"], ev.get("item", ""), ev.get("label", ""), self.world,
                                           seconds=self.seconds)
        return self.records[key]

    def on_line(self, rank: int, line: str) -> None:
        ev = parse(line)
        kind = ev.pop("ev") if ev else None
        if kind is None:      # the learner's own output: the last lines go into a crash message
            self.other.setdefault(rank, []).append(line)
            del self.other[rank][:-8]
        elif kind == "verdict" and ev.get("load"):
            self.loads.setdefault(ev.get("file", 0), ev)
        elif kind == "start":
            rec = self.record(ev)
            rec.started.add(rank)
            rec.began = rec.began or time.monotonic()
            rec.label, rec.item = ev["label"], ev["item"]
        elif kind == "verdict":
            self.record(ev).verdicts[rank] = ev
        elif kind == "stuck":
            rec = self.record(ev)
            rec.stuck[rank] = ev.get("where", "")
            rec.fired = time.monotonic()
            rec.deadlock = rec.deadlock or bool(ev.get("deadlock"))
        elif kind in ("done", "relaunch"):
            setattr(self, kind, True)

    def close(self, result) -> None:
        """After the launch: a case in which some rank's deadline fired hung (a rank that gave its verdict may have
        waited for a stuck partner, and ended first); one that not every rank finished otherwise says how it ended."""
        self.result = result
        for rec in self.records.values():
            if rec.stuck or len(rec.verdicts) < self.world and result.timed_out:
                rec.ended = "hung"
                if rec.began:     # the watchdog's clock runs slower on a loaded machine: say the real wait
                    waited = (rec.fired or time.monotonic()) - rec.began
                    rec.waited = waited if rec.deadlock else max(rec.seconds, waited)
            elif len(rec.verdicts) < self.world:
                rec.ended = self.how_it_ended()
                rec.died = {r: at for r, at in self.crashes.items() if r not in rec.verdicts}

    def how_it_ended(self) -> str:
        res = self.result
        codes = ", ".join(f"rank {r.rank}: {'still running' if r.returncode is None else r.returncode}"
                          for r in res.ranks if r.returncode != 0)
        return "\n".join([f"a rank exited during the case ({codes})", *self.tail()])

    def tail(self) -> list[str]:
        return [f"rank {r}: {line}" for r, lines in sorted(self.other.items()) for line in lines[-3:]][-6:]

    def failure(self) -> str:
        """The worker itself failed outside any case (an import of torch, a crash)."""
        return worker_failed(self.world, self.result, self.other)["message"]


def worker_failed(nprocs: int, result, lines: dict) -> dict:
    """The verdict of a check run whose worker itself failed: the launch's summary and the last 8 lines the ranks
    printed that are not markers (``lines``: rank -> its lines)."""
    tail = [line for r in sorted(lines) for line in lines[r] if parse(line) is None][-8:]
    return {"case": "worker", "item": None, "rank": 0, "ok": False,
            "message": "\n".join([f"the check run on {nprocs} ranks failed: {result.summary()}", *tail])}


FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>\S+)')


def crash_lines(folder: str, world: int, paths: list) -> dict:
    """rank -> 'allreduce.py:40 in naive_allreduce: dist.recv(...)', the innermost frame of a learner's file in the
    stacks that a rank which died of a signal left (``worker.note_crashes``; faulthandler lists the most recent
    call first)."""
    learner = {os.path.realpath(p) for p in paths}
    out = {}
    for r in range(world):
        try:
            text = open(os.path.join(folder, f"crash-{r}")).read()
        except OSError:
            continue
        frames = [m for m in map(FRAME.match, text.splitlines()) if m and os.path.realpath(m["file"]) in learner]
        if frames:    # the innermost line, and the one that called it (a helper's line alone says little)
            out[r] = " (called from ".join(
                f"{os.path.basename(m['file'])}:{m['line']} in {m['func']}: "
                f"{linecache.getline(m['file'], int(m['line'])).strip()}" for m in frames[:2]) + ")" * (len(frames) > 1)
    return out


def launch_once(exercise: str, spec, paths: list, world: int, timeout: float, case_timeout: float, stop=None,
                skip=(), passed=(), ended=(), cwd=None) -> Launch:
    run = Launch(world, case_timeout)
    args = ["-m", WORKER, exercise, *[os.path.abspath(p) for p in paths], "--case-timeout", str(case_timeout)]
    for name, values in (("--skip", skip), ("--passed", passed), ("--ended", ended)):
        if values:
            args += [name, ",".join(sorted(values))]
    with tempfile.TemporaryDirectory(prefix="course-waits-") as waits:    # where the ranks say they wait
        env = {**(plugin(spec).ENV or ENV), FOLDER_ENV: waits}
        res = launching.launch(args, nprocs=world, timeout=timeout, on_line=run.on_line, grace=3.0, env=env, stop=stop,
                               cwd=cwd)
        run.crashes = crash_lines(waits, world, paths)
    run.close(res)
    return run


def one_world(exercise: str, spec, path: str, world: int, timeout: float, case_timeout: float, stop, cwd=None,
              hung=None):
    """Every case on ``world`` ranks, launching again after a hang or an unclean failure: (records, the load
    failure or None, general failures). ``hung``: the items that hung, shared by the world sizes: with STOP_ITEM
    a launch that starts after an item hung at another world size skips it (one hang per item, not one each)."""
    hung = set() if hung is None else hung
    records: dict = {}
    deadline = time.monotonic() + timeout
    stop_item = plugin(spec).STOP_ITEM
    while not stop.is_set():
        left = deadline - time.monotonic()
        if left < 5:
            late = f"the overall deadline of {timeout:.0f} s was reached on {world} ranks"
            return list(records.values()), None, [late]
        items = {}
        for rec in records.values():
            items[rec.item] = items.get(rec.item, True) and not rec.failed
        ended = {i for i, ok in items.items() if not ok} | set(hung) if stop_item else ()
        run = launch_once(exercise, spec, [path], world, left, case_timeout, stop,
                          skip={r.key for r in records.values()}, passed={i for i, ok in items.items() if ok},
                          ended=ended, cwd=cwd)
        if run.loads:
            stop.set()      # the file does not load: the other world sizes need not run
            return [], run.loads[0], []
        new = {rec.key: rec for rec in run.records.values() if rec.key not in records}
        records.update(new)
        hung.update(rec.item for rec in new.values() if rec.ended == "hung")
        if run.done and run.result.ok or all_said(spec, world, records):
            break           # (a rank may end after its last verdict: a case that tests a crash)
        if plugin(spec).STOP_AT_FAILURE:
            return list(records.values()), None, [] if any(r.ended for r in new.values()) else [run.failure()]
        crashed = plugin(spec).FRESH_AFTER_FAILURE and any(rec.ended for rec in new.values())
        if new and (run.relaunch or crashed or any(rec.ended == "hung" for rec in new.values())):
            continue        # the hung (or crashed) case is skipped next time, and so are the items that ended
        if not any(rec.ended for rec in new.values()):    # not a crash inside a case: the worker itself failed
            return list(records.values()), None, [run.failure()]
        break
    return list(records.values()), None, []


def all_said(spec, world: int, records: dict) -> bool:
    """Every case of ``world`` has every rank's verdict."""
    keys = [c.key(world) for c in spec.cases(world)]
    return all(k in records and not records[k].ended for k in keys)


def run_worlds(exercise: str, spec, path: str, worlds, timeout: float, case_timeout: float, cwd=None):
    """``one_world`` for each world size, ``spec.PARALLEL`` of them side by side (largest first); the results in
    the order of ``worlds``: (records, load failure or None, general failures)."""
    stop = threading.Event()     # set on Ctrl-C, or once a file that does not load is seen: the rest stop
    parallel = plugin(spec).PARALLEL
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        order = sorted(worlds, reverse=True) if parallel > 1 else list(worlds)
        hung: set = set()
        futures = {w: pool.submit(one_world, exercise, spec, path, w, timeout, case_timeout, stop, cwd, hung)
                   for w in order}
        try:
            results = [futures[w].result() for w in worlds]
        except BaseException:
            stop.set()
            raise
    records = [rec for recs, _, _ in results for rec in recs]
    load = next((ld for _, ld, _ in results if ld), None)
    return records, load, [g for _, _, gs in results for g in gs]


def run_many(exercise: str, spec, paths: list, worlds, timeout: float, case_timeout: float):
    """Every file in one launch per world size: ({file index: records}, {file index: load failure}), or None when a
    launch did not end cleanly (a hang, a crash: the caller checks each file alone instead)."""
    by_file: dict = {k: [] for k in range(len(paths))}
    loads: dict = {}
    for world in worlds:
        run = launch_once(exercise, spec, paths, world, timeout, case_timeout)
        if not (run.done and run.result.ok) or any(rec.ended for rec in run.records.values()):
            return None
        for (k, _), rec in run.records.items():
            by_file[k].append(rec)
        loads.update(run.loads)
    return by_file, loads
