"""Loss curves of notebook 08: an uninterrupted run against one where a rank is killed and torchrun restarts it,
read per attempt from rank 0's lines; a step done twice keeps the last attempt's value.
"""
import contextlib
import os
import re
from dataclasses import dataclass, field

RANK_ENV = {"PYTHONDONTWRITEBYTECODE": "1"}   # no __pycache__ written beside the learner's file
STEP = re.compile(r"^step=(\d+) epoch=(\d+) batch=(\d+) loss=(\S+)$")
ATTEMPT = re.compile(r"^attempt=(\d+) world_size=(\d+) steps_per_epoch=(\d+)$")
SNAPSHOT = re.compile(r"^snapshot epoch=(\d+) step=(\d+)$")
RESUMED = re.compile(r"^resumed epoch=(\d+) step=(\d+)")
KILLED = re.compile(r"^rank (\d+): SIGKILL to myself before step (\d+)")
TOLERANCE = 1e-6      # relative; on one CPU thread per rank the curves come out bit for bit equal


@dataclass
class Attempt:
    number: int
    losses: dict = field(default_factory=dict)       # global step -> loss
    snapshots: list = field(default_factory=list)    # (epoch, step) in order
    resumed: tuple | None = None                     # (epoch, step) it went on from
    killed: tuple | None = None                      # (rank, step) that died


@dataclass
class Curve:
    attempts: list = field(default_factory=list)
    steps_per_epoch: int = 0
    result: object = None          # course_lib.runtime.launch.LaunchResult
    lines: list = field(default_factory=list)

    @property
    def losses(self) -> dict:
        """global step -> loss, the last attempt's value where a step was done twice."""
        out: dict = {}
        for a in self.attempts:
            out.update(a.losses)
        return dict(sorted(out.items()))

    def on_line(self, rank: int, line: str) -> None:
        self.lines.append(f"[rank {rank}] {line}" if rank >= 0 else f"[torchrun] {line}")
        del self.lines[:-400]
        m = KILLED.match(line)
        if m and self.attempts:
            self.attempts[-1].killed = (int(m.group(1)), int(m.group(2)))
        if rank != 0:
            return
        if m := ATTEMPT.match(line):
            self.attempts.append(Attempt(int(m.group(1))))
            self.steps_per_epoch = int(m.group(3))
        elif not self.attempts:
            return
        elif m := STEP.match(line):
            self.attempts[-1].losses[int(m.group(1))] = float(m.group(4))
        elif m := SNAPSHOT.match(line):
            self.attempts[-1].snapshots.append((int(m.group(1)), int(m.group(2))))
        elif m := RESUMED.match(line):
            self.attempts[-1].resumed = (int(m.group(1)), int(m.group(2)))

    def global_step(self, position) -> int:
        """The global step after which a snapshot at (epoch, step) was taken."""
        epoch, step = position
        return (epoch - 1) * self.steps_per_epoch + step


def run(snapshots=None, nprocs: int = 2, epochs: int = 3, every: int = 3, kill_at: int = 0, restarts: int = 0,
        timeout: float = 240, workdir=None, style: str = "torchrun") -> Curve:
    """Train under torchrun; ``snapshots``: the learner's file (None: never save, the reference run).

    ``style="srun"`` starts the ranks without torchrun (no restarts): one process fewer, for a reference run."""
    from course_lib import runs
    from course_lib.ckpt.train import prepare_data
    from course_lib.runtime.warm import DDP_IMPORTS
    curve = Curve()
    args = ["-m", "course_lib.ckpt.train", "--epochs", str(epochs), "--every", str(every)]
    if snapshots is not None:
        args += ["--snapshots", os.path.abspath(snapshots)]
    if kill_at:
        args += ["--kill-at", str(kill_at)]
    with runs.workdir("ckpt-run-") if workdir is None else contextlib.nullcontext(_fresh(workdir)) as work:
        args += ["--data", prepare_data(os.path.join(work, "digits.pt"))]   # the digits subset, as a file
        torchrun_args = ["--max-restarts", str(restarts)] if style == "torchrun" else []
        # here: the ranks (and torchrun's agent) forked from a server that imported torch and what DDP imports once
        with runs.session(RANK_ENV, DDP_IMPORTS):
            curve.result = runs.launch(args, nprocs=nprocs, style=style, timeout=timeout, cwd=work,
                                       on_line=curve.on_line, torchrun_args=torchrun_args, env=RANK_ENV)
    return curve


def _fresh(folder) -> str:
    """A working folder the caller keeps (the notebook shows what is in it), without an earlier run's snapshot
    (it would be resumed)."""
    folder = str(folder)
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        if name.startswith("snapshot.pt"):
            os.unlink(os.path.join(folder, name))
    return folder


def compare(reference: dict, resumed: dict, rtol: float = TOLERANCE) -> tuple[bool, str]:
    """(equal, what differs) for two curves {step: loss}."""
    missing = sorted(set(reference) - set(resumed))
    extra = sorted(set(resumed) - set(reference))
    if missing:
        return False, f"{_span(missing)} never trained (the uninterrupted run has {len(reference)} steps)"
    if extra:
        return False, f"{_span(extra)} more than the uninterrupted run's {len(reference)}"
    worst = max((abs(resumed[s] - reference[s]) for s in reference), default=0.0)
    for step in reference:
        a, b = reference[step], resumed[step]
        if abs(a - b) > rtol * max(abs(a), abs(b)):
            return False, (f"from step {step} on the loss differs from the uninterrupted run "
                           f"(step {step}: {b:.6f}, uninterrupted {a:.6f})")
    return True, f"all {len(reference)} steps equal (largest difference {worst:.1e}, tolerance {rtol:.0e} relative)"


def _span(steps: list) -> str:
    return f"steps {steps[0]}-{steps[-1]} were" if len(steps) > 1 else f"step {steps[0]} was"
