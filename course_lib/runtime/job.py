"""A submitted job, the same on both engines (slurm.py and local.py fill in ``_query()``: (state, reason, exit code)
now, and ``_cancel()``): state, wait() with a live display, log, cancel, exit code, metrics. Not submitit's Job: that
is a pickled function's, in submitit's own folder; this one is the learner's sbatch script's, read back from the run
folder that script writes.
"""
import contextlib
import json
import os
import re
import time
from pathlib import Path

from course_lib.core.atomic import write_text
from course_lib.core.paths import runs_dir as _workspace_runs
from course_lib.core.spec import JobSpec
from course_lib.metrics import parse_epoch_lines
from course_lib.runtime.launch import rejoin_tee
from course_lib.runtime.progress import follow, wait

# Slurm's end states; the local engine uses the first four
TERMINAL = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED")
LOG_NAME = "output.log"
SCRIPT_NAME = "job.sbatch"
INFO_NAME = "job.json"
QUERY_EVERY = 0.25   # seconds
# srun --label's "  3: text"; what follows it may be torchrun --tee's "[default1]:text" (rank_labelled)
SRUN_LABEL = re.compile(r"^\s*(\d+): (.*)$")


def runs_dir(path: str | os.PathLike | None = None) -> Path:
    """The folder of the run folders: ``path``, else $COURSE_RUNS_DIR, else the workspace's jobs/runs/."""
    return Path(path or os.environ.get("COURSE_RUNS_DIR") or _workspace_runs()).resolve()


def read_json(path: Path) -> dict:
    """A run folder's JSON file (job.json, state.json); {} while it is not there or not readable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_json(path: Path, data: dict) -> None:
    write_text(path, json.dumps(data, indent=2))   # atomic: a reader sees the old or the new state, never half


def write_folder(run_dir: Path, engine: str, job_id: str, site, spec: JobSpec, script: str, **more) -> None:
    """A new run folder's job.sbatch and job.json (all that ``reattach`` needs to follow the job again)."""
    (run_dir / SCRIPT_NAME).write_text(script)
    write_json(run_dir / INFO_NAME, {"engine": engine, "id": job_id, "site": site.name, "spec": spec.to_dict(), **more})


class SubmitError(RuntimeError):
    """The job could not be submitted; the message is the scheduler's own (e.g. sbatch's error)."""


class Job:
    engine = "?"

    def __init__(self, job_id: str, spec: JobSpec, run_dir: Path, submitted: float):
        self.id = str(job_id)
        self.spec = spec
        self.run_dir = Path(run_dir)
        self.submitted = submitted          # time.monotonic() just before submitting
        self.finished: float | None = None  # time.monotonic() when the end state was first seen
        self._state, self._reason, self._exit_code = "PENDING", "", None
        self._queried = float("-inf")

    # ------------------------------------------------------------ state
    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def log_path(self) -> Path:
        return self.run_dir / LOG_NAME

    @property
    def script_path(self) -> Path:
        return self.run_dir / SCRIPT_NAME

    def refresh(self) -> str:
        # one scheduler query per QUERY_EVERY seconds, however many properties a display reads
        if self._state not in TERMINAL and time.monotonic() - self._queried >= QUERY_EVERY:
            self._state, self._reason, self._exit_code = self._query()
            self._queried = time.monotonic()
            if self._state in TERMINAL and self.finished is None:
                self.finished = time.monotonic()
                self._record()
        return self._state

    @property
    def state(self) -> str:
        """PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT or CANCELLED (Slurm may say more, e.g. OUT_OF_MEMORY)."""
        return self.refresh()

    @property
    def done(self) -> bool:
        return self.refresh() in TERMINAL

    @property
    def ok(self) -> bool:
        return self.refresh() == "COMPLETED"

    @property
    def reason(self) -> str:
        """Why the job waits or why it ended (Slurm's Reason, or the local launcher's account)."""
        self.refresh()
        return self._reason

    @property
    def exit_code(self) -> int | None:
        """The job's exit code once it has ended (the first failing rank's), else None."""
        self.refresh()
        return self._exit_code

    @property
    def elapsed(self) -> float:
        """Seconds from submission to the end state (or to now, while it runs)."""
        return (self.finished or time.monotonic()) - self.submitted

    # ------------------------------------------------------------ output
    def log(self, tail: int | None = None) -> str:
        """The job's output (all ranks, each line prefixed ``rank: ``); ``tail``: only the last lines."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        if tail is not None:
            text = "\n".join(text.splitlines()[-tail:])
        return text

    def metrics(self, rank: int | None = 0) -> list[dict]:
        """The per-epoch records (epoch, train_loss, test_acc, images_per_s, epoch_s ...) from the log.

        ``rank=0``: rank 0's (and unlabelled) lines; ``rank=None``: every rank's, each with its ``rank``.
        """
        return parse_epoch_lines(rank_labelled(self.log(), self.spec), rank=rank)

    def epochs_done(self) -> int:
        return len({rec.get("epoch") for rec in self.metrics(rank=0)})

    # ------------------------------------------------------------ control
    def cancel(self) -> "Job":
        """Stop the job (Slurm: scancel; local: every process it started) and wait until it has ended."""
        if not self.done:
            self._cancel()
            wait(self, say=None, run_timeout=float("inf"), poll=0.3, timeout=60, interrupt_cancels=False)
        return self

    def wait(self, timeout: float | None = None, progress: bool = True, poll: float = 0.5) -> "Job":
        """Wait until the job ends (or ``timeout`` seconds), showing its progress; returns the job.

        In Jupyter: a widget with state, elapsed time, epochs done and the last log lines; in a terminal a
        progress bar. Interrupting (Ctrl-C / the stop button) stops the waiting, not the job.
        """
        follow(self, timeout=timeout, poll=poll, display=progress)
        return self

    # ------------------------------------------------------------ reports
    def summary(self, tail: int = 15) -> str:
        """One line on the outcome; for a job that did not complete, the reason and the log's last lines."""
        state = self.state
        line = f"job {self.id} ({self.name}, {self.engine}): {state}"
        if state in TERMINAL:
            line += f" after {self.elapsed:.1f} s, exit code {self._exit_code}"
        if self._reason and state != "COMPLETED":
            line += f", reason: {self._reason}"
        if state in TERMINAL and state != "COMPLETED":
            last = self.log(tail=tail)
            line += f"\n--- last lines of {self.log_path}:\n" + (last or "(the log is empty)")
        return line

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.name!r} {self.engine} {self._state}>"

    def _record(self) -> None:
        """Keep the outcome beside the log (job.json), for a later look at the run folder."""
        path = self.run_dir / INFO_NAME
        info = {**read_json(path), "state": self._state, "reason": self._reason, "exit_code": self._exit_code,
                "submit_to_end_s": round(self.elapsed, 3)}
        with contextlib.suppress(OSError):
            write_json(path, info)


def rank_labelled(text: str, spec: JobSpec) -> str:
    """The log with each rank's lines labelled ``rank: ``, whichever launcher wrote it.

    ``srun --label`` writes ``rank: `` (padded, `` 3: ``, from 10 tasks on). Under torchrun the label is the
    node (one srun task per node) and torchrun's ``--tee`` adds ``[default<local rank>]:``; the global rank
    is node * ranks_per_node + local rank, and a line --tee cut into pieces is joined again (rejoin_tee).
    """
    out, partial = [], {}
    for line in text.splitlines():
        m = SRUN_LABEL.match(line)
        node, rest = (int(m.group(1)), m.group(2)) if m else (None, line)
        whole = rejoin_tee(rest, partial, key=lambda local: (node or 0) * spec.ntasks_per_node + local)
        if whole is not None:
            out += [f"{rank}: {piece}" for rank, piece in whole]
        else:
            out.append(line if node is None else f"{node}: {rest}")
    out += [f"{rank}: {piece}" for rank, piece in sorted(partial.items())]   # a last piece with no newline
    return "\n".join(out)
