"""Waiting for the grading array (course_lib.grading.array): each task's Slurm state, a progress bar, and the
rows the tasks wrote, with a ``fail`` row for every check a task that Slurm ended did not finish."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from course_lib.jobs.progress import in_notebook
from course_lib.jobs.slurm import command

WHY = {"TIMEOUT": "it reached its time limit (--slurm-time)", "NODE_FAIL": "its node failed",
       "CANCELLED": "it was cancelled", "OUT_OF_MEMORY": "it ran out of memory",
       "PREEMPTED": "it was preempted", "BOOT_FAIL": "its node did not boot", "FAILED": "it failed"}


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


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def collect(job_id: str, todo: list[int], learners: list, exercises: list[str], rows_dir: Path,
            states: dict[int, tuple[str, str]], interrupted: bool = False) -> tuple[list[dict], dict, str]:
    """(rows, timing notes per learner, the isolation the tasks reported) of the tasks in ``todo``.

    A task that did not finish gives a fail row for each exercise it did not do, with Slurm's state; when the
    grader was interrupted such learners are left out instead (``--resume`` grades them again)."""
    rows, timing, isolation = [], {}, set()
    for i in todo:
        name = learners[i].name
        data = _read(rows_dir / f"{i}.json") or {"rows": [], "done": [], "finished": False, "timing": []}
        if data.get("isolation"):
            isolation.add(data["isolation"].removeprefix("Isolation: "))
        if data.get("timing"):
            timing[name] = "Check times: " + "; ".join(data["timing"]) + "."
        if data["finished"]:
            rows += data["rows"]
            continue
        if interrupted:
            continue
        state, reason = states.get(i, ("UNKNOWN", "Slurm has no record of this task"))
        why = WHY.get(state.split()[0] if state else "", f"it ended as {state or 'UNKNOWN'}")
        rows += data["rows"]
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
