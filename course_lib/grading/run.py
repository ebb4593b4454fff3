"""Grading a class: every (learner, exercise) check on a pool of threads, reports rewritten as learners finish.

Each check runs in its own sandbox process (course_lib.grading.sandbox); the threads only wait for them.
Ctrl-C (or SIGTERM) stops the running checks, keeps the reports of the learners already done, and returns
130; a later run with ``done_rows`` (``--resume``) grades only what those rows do not hold.
"""
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from course_lib.grading.discover import Learner, discover
from course_lib.grading.feedback import slug
from course_lib.grading.reports import Outputs, fold_general, outcome_rows, write_reports
from course_lib.grading.sandbox import Limits, run_check
from course_lib.grading.scores import tally
from course_lib.registry import EXERCISES


def timing_note(ex: str, outcome) -> str:
    extra = f"{ex} {outcome.seconds:.1f} s"
    if outcome.output_bytes > 1 << 20:
        extra += f", printed {outcome.output_bytes / 2**20:.1f} MB (log keeps its first and last KB)"
    if outcome.leftovers:
        extra += f", {outcome.leftovers} process(es) left running were killed"
    return extra


def check_one(learner: Learner, ex: str, limits: Limits, out: Path, on_start=None) -> tuple[list[dict], object]:
    """Run one learner's ``ex`` in the sandbox, its output to ``out/logs``: (rows, outcome); outcome is None when
    there is nothing to run (a ``file`` row says why) or the grader itself could not run the check (disk full, no
    /tmp: a ``grader`` row)."""
    found = learner.found[ex]
    if found.problem:
        return [{"item": "file", "result": found.problem[0], "message": found.problem[1]}], None
    try:
        outcome = run_check(ex, found.path, EXERCISES[ex].file, limits, on_start=on_start)
    except OSError as e:
        return [{"item": "grader", "result": "fail", "message": f"the grader could not run this check: {e}"}], None
    log = out / "logs" / slug(learner.name) / f"{ex}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(outcome.output, encoding="utf-8", errors="replace")
    return fold_general(outcome_rows(outcome, limits), ex), outcome


class _Grading:
    """One run: the rows so far, the checks still pending per learner, and what Ctrl-C must stop."""

    def __init__(self, out: Path, learners: list[Learner], exercises: list[str], limits: Limits,
                 header: str, ignored: list[str], done_rows: list[dict], outputs: Outputs):
        self.out, self.learners, self.exercises, self.limits = out, learners, exercises, limits
        self.outputs = outputs
        self.header, self.ignored = header, ignored
        self.rows = list(done_rows)
        self.done = {(r["learner"], r["exercise"]) for r in done_rows}
        self.todo = [(lr, ex) for lr in learners for ex in exercises if (lr.name, ex) not in self.done]
        self.pending = {lr.name: sum(1 for t in self.todo if t[0] is lr) for lr in learners}
        self.seconds: dict[str, list[str]] = {}
        self.timing: dict[str, str] = {}
        self.errors: list[str] = []
        self.kills: dict[int, object] = {}
        self.stopping = threading.Event()

    def _started(self, n: int, kill) -> None:
        self.kills[n] = kill
        if self.stopping.is_set():     # Ctrl-C came while this check was starting
            kill()

    def task(self, n: int, learner: Learner, ex: str):
        """Grade one (learner, exercise) in a pool thread: (learner, ex, rows, outcome), or None when stopped."""
        if self.stopping.is_set() and not learner.found[ex].problem:
            return None
        rows, outcome = check_one(learner, ex, self.limits, self.out, lambda kill: self._started(n, kill))
        if outcome is None and not learner.found[ex].problem:
            self.errors.append(f"{learner.name} / {ex}: {rows[0]['message']}")
        self.kills.pop(n, None)
        return learner, ex, rows, outcome

    def finished(self, learner: Learner, ex: str, new_rows: list[dict], outcome) -> None:
        """Record one check (in the main thread: the pool's threads only run checks); when it was the learner's
        last, rewrite the reports."""
        self.rows.extend({"learner": learner.name, "exercise": ex, **r} for r in new_rows)
        if outcome is not None:
            self.seconds.setdefault(learner.name, []).append(timing_note(ex, outcome))
        self.pending[learner.name] -= 1
        n_ok, n, skipped = tally(new_rows)
        skipped = f", {skipped} not run" if skipped else ""
        took = f" in {outcome.seconds:.1f} s" if outcome else ""
        print(f"  {learner.name} / {ex}: {n_ok}/{n} passed{skipped}{took}", flush=True)
        if self.pending[learner.name] == 0:
            self.outputs.graded_at[learner.name] = now_utc()
            if learner.name in self.seconds:
                self.timing[learner.name] = "Check times: " + "; ".join(self.seconds[learner.name]) + "."
            self.write()

    def write(self) -> None:
        write_reports(self.out, self.rows, self.learners, self.exercises, self.header, self.ignored, self.timing,
                      self.outputs)

    def stop(self, futures) -> None:
        """Ctrl-C: start no more checks and kill the running ones."""
        self.stopping.set()
        for f in futures:
            f.cancel()
        for kill in list(self.kills.values()):
            kill()

    def run(self, jobs: int) -> bool:
        """Run every check, ``jobs`` at a time; False when interrupted (Ctrl-C or SIGTERM)."""
        pool = ThreadPoolExecutor(max_workers=jobs)
        futures = {pool.submit(self.task, n, lr, ex) for n, (lr, ex) in enumerate(self.todo)}
        interrupted = threading.Event()
        # the signals only set a flag that the loop reads: a KeyboardInterrupt raised inside
        # concurrent.futures' wait() can leave a future's lock held, and the pool then never shuts down
        old = {}
        if threading.current_thread() is threading.main_thread():
            old = {sig: signal.signal(sig, lambda *_: interrupted.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while futures and not interrupted.is_set():
                ready, futures = wait(futures, timeout=0.5, return_when=FIRST_COMPLETED)
                for f in ready:
                    if f.result() is not None:
                        self.finished(*f.result())
        except KeyboardInterrupt:   # not the main thread's signals (e.g. a kernel interrupt elsewhere)
            interrupted.set()
        finally:
            if interrupted.is_set():
                self.stop(futures)
            pool.shutdown(wait=True, cancel_futures=True)
            for sig, handler in old.items():
                signal.signal(sig, handler)
        return not interrupted.is_set()


def now_utc() -> str:
    """The time of grading, as scores.csv and the exports give it: ISO 8601, UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def header_of(subs: Path, learners: list, exercises: list[str], limits: Limits, notes: list[str]) -> str:
    """The first lines of grades.md: what was graded, how, and the isolation in force."""
    return (f"# Grades of `{subs}`\n\n{len(learners)} learners; exercises: {', '.join(exercises)}; "
            f"deadline {limits.deadline:.0f} s per check. Results: pass, **fail**, missing (not handed in), "
            "not run (could not be established here; not counted). Scores: scores.csv."
            + "".join(f"\n\n{n}" for n in notes if n))


def grade(subs: Path, out: Path, exercises: list[str], limits: Limits, jobs: int, done_rows: list[dict],
          scratch: Path, notes: list[str] = (), on_done=None, outputs: Outputs | None = None) -> int:
    """Grade every learner of ``subs`` into ``out``; the exit code (0 graded, 2 could not, 130 interrupted).
    ``notes``: lines for the report's header; ``on_done(rows, learners)``: called once all is graded."""
    learners, ignored = discover(subs, exercises, scratch)
    header = header_of(subs, learners, exercises, limits, list(notes))
    g = _Grading(out, learners, exercises, limits, header, ignored, done_rows, outputs or Outputs())
    print(f"grading {len(learners)} learners x {len(exercises)} exercises in {subs} "
          f"({len(g.todo)} checks to run, {len(g.done)} already in {out / 'grades.csv'}), {jobs} at a time", flush=True)
    g.write()
    start = time.monotonic()
    if not g.run(jobs):
        print(f"course grade: interrupted: the learners graded so far are in {out}; --resume continues",
              file=sys.stderr)
        return 130
    g.write()
    print(f"graded in {time.monotonic() - start:.1f} s: {out / 'grades.csv'}, {out / 'grades.md'}, {out / 'feedback'}")
    if on_done is not None:
        on_done(g.rows, learners)
    if g.errors:
        print("course grade: some checks could not run (rows 'grader' in the report):\n  " + "\n  ".join(g.errors),
              file=sys.stderr)
        return 2
    return 0


def raise_interrupt(*_):   # a signal handler: SIGTERM stops as Ctrl-C does
    raise KeyboardInterrupt
