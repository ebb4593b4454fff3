"""``course grade --engine slurm``: the class as one Slurm job array, a task per learner (docs/grading.md, "A class
as a Slurm job array"). Each task (``python -m course_lib.grading.array MANIFEST``: ``main``) grades learner
``$SLURM_ARRAY_TASK_ID`` as the local engine does and rewrites ``<out>/slurm/<job id>/rows/<task>.json`` after each
exercise, so a task Slurm kills leaves what it finished (SIGTERM kills the running check first); the grader merges
them, and a task Slurm ended early gives a ``fail`` row per exercise it did not finish.
"""
import json
import math
import os
import shlex
import signal
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

from course_lib.core.atomic import write_text
from course_lib.core.paths import PACKAGE_PARENT
from course_lib.grading.cgroups import describe
from course_lib.grading.discover import discover
from course_lib.grading.reports import Outputs, write_reports
from course_lib.grading.run import check_one, header_of, now_utc, raise_interrupt, timing_note
from course_lib.grading.sandbox import Limits
from course_lib.runtime import runner
from course_lib.runtime.job import TERMINAL, SubmitError
from course_lib.runtime.progress import in_notebook
from course_lib.runtime.slurm import SlurmJob, command, forget_the_job

POLL = 2.0     # seconds between two looks at the queue
WHY = {"TIMEOUT": "it reached its time limit (--slurm-time)", "NODE_FAIL": "its node failed",
       "CANCELLED": "it was cancelled", "OUT_OF_MEMORY": "it ran out of memory",
       "PREEMPTED": "it was preempted", "BOOT_FAIL": "its node did not boot", "FAILED": "it failed"}


def array_ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8" (sbatch --array's syntax)."""
    parts, start = [], None
    for i, n in enumerate(indices):
        if start is None:
            start = n
        if i + 1 == len(indices) or indices[i + 1] != n + 1:
            parts.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ",".join(parts)


def script(manifest: Path, site, todo: list[int], throttle: int, minutes: int, cpus: int) -> str:
    """The sbatch script of the array: one task per learner index in ``todo``."""
    slurm_dir = manifest.parent
    python = site.python or shlex.quote(sys.executable)
    shell = "#!/bin/bash -l" if site.module_init == "login" else "#!/bin/bash"
    lines = [shell, "#SBATCH --job-name=course-grade", f"#SBATCH --array={array_ranges(todo)}%{throttle}",
             f"#SBATCH --output={slurm_dir}/task-%A_%a.log", f"#SBATCH --time={minutes}", "#SBATCH --ntasks=1",
             f"#SBATCH --cpus-per-task={cpus}"]
    # grading needs CPUs only: the site's partition and QoS for checks, where it has them
    options = dict(site.sbatch_options(), **{k: v for k, v in (("partition", site.check_partition),
                                                                ("qos", site.check_qos)) if v})
    lines += [f"#SBATCH --{key}={value}" for key, value in options.items()]
    lines += [f"# Written by course grade for site '{site.name}': one task grades one learner (manifest.json)",
              "set -e"]
    lines += site.module_setup() if site.modules else []
    lines += [f"module load {shlex.quote(m)}" for m in site.modules]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in site.env.items()]
    lines += [f"export PYTHONPATH={shlex.quote(str(PACKAGE_PARENT))}${{PYTHONPATH:+:$PYTHONPATH}}",
              f"cd {shlex.quote(str(slurm_dir))}",
              f"exec {python} -m course_lib.grading.array {shlex.quote(str(manifest))}"]
    return "\n".join(lines) + "\n"


def _state(states: dict, i: int) -> str:
    state = states.get(i, ("", ""))[0]
    return state.split()[0] if state else ""       # sacct says "CANCELLED by 0"


class _Array(SlurmJob):
    """The array as one job for runner.wait: ended when every task in ``todo`` has (squeue -r, else sacct), or when
    Slurm has had no record of it for a minute; each look moves the progress bar."""

    def __init__(self, job_id: str, todo: list[int], slurm_dir: Path):
        super().__init__(job_id, None, slurm_dir / job_id, time.monotonic())
        self.todo, self.states, self.unknown_since = todo, {}, None
        self.bar = Progress(len(todo), f"Slurm job {job_id}")

    def _query(self) -> tuple[str, str, int | None]:
        self.states = states = slurm_states(self.id, self.todo)
        ended = sum(_state(states, i) in TERMINAL for i in self.todo)
        running = sum(_state(states, i) == "RUNNING" for i in self.todo)
        self.bar.update(ended, f"{running} running, {len(self.todo) - ended - running} waiting")
        if ended == len(self.todo):
            return "COMPLETED", "every task has ended", None
        if states:
            self.unknown_since = None
        elif self.unknown_since is None:
            self.unknown_since = time.monotonic()
        elif time.monotonic() - self.unknown_since > 60:
            return "COMPLETED", "Slurm has had no record of the array for a minute", None
        return ("RUNNING" if running or ended else "PENDING"), "", None

    def _record(self) -> None:
        pass   # the tasks write their own rows; the array has no job.json


def slurm_states(job_id: str, todo: list[int]) -> dict[int, tuple[str, str]]:
    """task index -> (state, reason) from ``squeue -r -t all``, else the job-completion log (``sacct -c``)."""
    states = {}
    r = command(["squeue", "-h", "-r", "-t", "all", "-j", job_id, "-o", "%K|%T|%r"])
    for line in r.stdout.splitlines() if r.returncode == 0 else []:
        task, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        if task.isdigit():
            states[int(task)] = (state, "" if reason == "None" else reason)
    if len(states) < len(todo):
        for cmd in (["sacct", "-n", "-P", "-j", job_id, "-o", "JobID,State"],
                    ["sacct", "-c", "-n", "-P", "-j", job_id, "-o", "JobID,State"]):
            for line in command(cmd).stdout.splitlines():
                jid, _, state = line.partition("|")
                task = jid.partition("_")[2]
                if task.isdigit() and int(task) not in states and "." not in task:
                    states[int(task)] = (state.split()[0] if state else "UNKNOWN", "")
    return states


def collect(job_id: str, todo: list[int], learners: list, exercises: list[str], rows_dir: Path,
            states: dict[int, tuple[str, str]], interrupted: bool = False) -> tuple[list[dict], dict, str]:
    """(rows, timing notes per learner, the isolation the tasks reported) of the tasks in ``todo``.

    A task that did not finish gives a fail row for each exercise it did not do, with Slurm's state; when the
    grader was interrupted such learners are left out instead (``--resume`` grades them again)."""
    rows, timing, isolation = [], {}, set()
    for i in todo:
        name = learners[i].name
        try:
            data = json.loads((rows_dir / f"{i}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):   # the task never started, or Slurm killed it before its first write
            data = {"rows": [], "done": [], "finished": False, "timing": []}
        if data.get("isolation"):
            isolation.add(data["isolation"].removeprefix("Isolation: "))
        if data.get("timing"):
            timing[name] = "Check times: " + "; ".join(data["timing"]) + "."
        if interrupted and not data["finished"]:
            continue
        rows += data["rows"]
        if data["finished"]:
            continue
        state, reason = states.get(i, ("UNKNOWN", "Slurm has no record of this task"))
        why = WHY.get(_state(states, i), f"it ended as {state or 'UNKNOWN'}")
        for ex in exercises:
            if ex not in data["done"]:
                rows.append({"learner": name, "exercise": ex, "item": "slurm", "result": "fail",
                             "message": f"Slurm ended the grading task {job_id}_{i} ({state}"
                                        + (f", {reason}" if reason else "") + f") before this check gave a verdict: "
                                        f"{why}. The task's log: slurm/task-{job_id}_{i}.log."})
    return rows, timing, "; ".join(sorted(isolation))


class Progress:
    """Learners graded out of all: tqdm.auto's bar (a widget in Jupyter, a bar in a terminal), else (a log file) a
    line per change."""

    def __init__(self, total: int, label: str):
        self.total, self.label, self.last, self.bar = total, label, None, None
        if in_notebook() or sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, unit="learner", desc=label, file=sys.stderr, dynamic_ncols=True)

    def update(self, done: int, note: str) -> None:
        if self.bar is not None:
            self.bar.n = done
            self.bar.set_postfix_str(note, refresh=True)
        elif (done, note) != self.last:
            print(f"{self.label}: {done}/{self.total} learners graded, {note}", file=sys.stderr, flush=True)
        self.last = (done, note)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def grade_on_slurm(subs: Path, out: Path, exercises: list[str], limits, done_rows: list[dict], scratch: Path,
                   notes: list[str], on_done, site, throttle: int, minutes: int | None, cpus: int,
                   outputs: Outputs) -> int:
    """Grade the class as a Slurm job array into ``out``; the exit code (0, 2 could not submit, 130)."""
    learners, ignored = discover(subs, exercises, scratch)
    done = {(r["learner"], r["exercise"]) for r in done_rows}
    todo = [i for i, lr in enumerate(learners) if any((lr.name, ex) not in done for ex in exercises)]
    slurm_dir = out / "slurm"
    slurm_dir.mkdir(parents=True, exist_ok=True)
    manifest = {"submissions": str(subs.resolve()), "out": str(out.resolve()), "exercises": exercises,
                "limits": asdict(limits), "learners": [{"name": lr.name, "source": lr.source} for lr in learners]}
    manifest_path = slurm_dir / "manifest.json"
    write_text(manifest_path, json.dumps(manifest, indent=1))
    rows = [r for r in done_rows if r["learner"] not in {learners[i].name for i in todo}]
    print(f"grading {len(learners)} learners x {len(exercises)} exercises in {subs} on Slurm: {len(todo)} "
          f"learners to grade, {len(learners) - len(todo)} already in {out / 'grades.csv'}", flush=True)
    timing, isolation, code = {}, "", 0
    if todo:
        # a task's time limit: every check to its deadline, plus a few minutes to start and find the files
        minutes = minutes or math.ceil((len(exercises) * limits.deadline + 180) / 60)
        write_text(slurm_dir / "grade.sbatch", script(manifest_path.resolve(), site, todo, throttle, minutes, cpus))
        r = command(["sbatch", "--parsable", str(slurm_dir / "grade.sbatch")])
        if r.returncode != 0:
            raise SubmitError("sbatch refused the grading array: " + ((r.stderr or r.stdout).strip()
                                                                      or f"exit {r.returncode}"))
        job_id = r.stdout.strip().split(";")[0]
        print(f"submitted job array {job_id} ({len(todo)} tasks, at most {throttle} at a time); task logs in "
              f"{slurm_dir}", flush=True)
        old = signal.signal(signal.SIGTERM, raise_interrupt) if threading.current_thread() is \
            threading.main_thread() else None      # SIGTERM stops as Ctrl-C does
        array = _Array(job_id, todo, slurm_dir)
        try:
            runner.wait(array, say=None, run_timeout=float("inf"), poll=POLL, interrupt_cancels=False)
            states = array.states
        except KeyboardInterrupt:
            command(["scancel", job_id])
            states, code = slurm_states(job_id, todo), 130
        finally:
            array.bar.close()
            if old is not None:
                signal.signal(signal.SIGTERM, old)
        new, timing, isolation = collect(job_id, todo, learners, exercises, slurm_dir / job_id / "rows", states,
                                         interrupted=code == 130)
        rows += new
    header = header_of(subs, learners, exercises, limits, notes + [
        f"Engine: Slurm job array; isolation in the tasks: {isolation or 'no task reported it'}"])
    outputs.graded_at.update({r["learner"]: now_utc() for r in rows if r["learner"] not in outputs.graded_at})
    write_reports(out, rows, learners, exercises, header, ignored, timing, outputs)
    if code == 130:
        print(f"course grade: interrupted: the job array was cancelled; the learners graded so far are in {out}; "
              "--resume continues", file=sys.stderr)
        return code
    print(f"graded: {out / 'grades.csv'}, {out / 'grades.md'}, {out / 'feedback'}")
    if on_done is not None:
        on_done(rows, learners)
    return 0


# ---------------------------------------------------------------- one task of the array, on a node

def _write(path: Path, data: dict) -> None:
    write_text(path, json.dumps(data, indent=1))


def grade_task(manifest: dict, index: int, rows_dir: Path) -> dict:
    """Grade learner ``index`` of the manifest; the data written to ``rows_dir/<index>.json``."""
    entry = manifest["learners"][index]
    exercises, limits = manifest["exercises"], Limits(**manifest["limits"])
    out = Path(manifest["out"])
    data = {"learner": entry["name"], "rows": [], "done": [], "finished": False, "timing": [],
            "isolation": describe(limits), "host": os.uname().nodename}
    path = rows_dir / f"{index}.json"
    kills = []
    with tempfile.TemporaryDirectory(prefix="course-grade-task-") as scratch:
        found, _ = discover(Path(manifest["submissions"]), exercises, Path(scratch), only={entry["source"]})
        learner = next(lr for lr in found if lr.source == entry["source"])
        learner.name = entry["name"]
        _write(path, data)
        try:
            for ex in exercises:
                rows, outcome = check_one(learner, ex, limits, out, kills.append)
                kills.clear()      # only the running check is stopped on SIGTERM
                if outcome is not None:
                    data["timing"].append(timing_note(ex, outcome))
                data["rows"] += [{"learner": learner.name, "exercise": ex, **r} for r in rows]
                data["done"].append(ex)
                _write(path, data)
        except KeyboardInterrupt:    # SIGTERM from Slurm: stop the running check and end
            for kill in kills:
                kill()
            raise
    data["finished"] = True
    _write(path, data)
    return data


def main(argv: list[str]) -> int:
    manifest_path = Path(argv[0])
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    index = int(os.environ["SLURM_ARRAY_TASK_ID"])
    rows_dir = manifest_path.parent / os.environ["SLURM_ARRAY_JOB_ID"] / "rows"
    rows_dir.mkdir(parents=True, exist_ok=True)
    forget_the_job()   # the checks must see what they see on the local engine
    signal.signal(signal.SIGTERM, raise_interrupt)
    start = time.monotonic()
    try:
        data = grade_task(manifest, index, rows_dir)
    except KeyboardInterrupt:
        print(f"task {index}: stopped by SIGTERM (Slurm's time limit or scancel)", flush=True)
        return 143
    print(f"task {index}: {data['learner']}: {len(data['rows'])} rows in {time.monotonic() - start:.1f} s "
          f"on {data['host']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
