"""What the items share: their outcome, and the subprocesses and ranks they start, each under a deadline and
stopped with its whole tree when it ends (an item never leaves a process behind).
"""
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from course_lib import registry
from course_lib.core.paths import PACKAGE_PARENT, course_root
from course_lib.runtime.launch import kill_group, launch

PASS, FAIL, NOT_POSSIBLE, NOT_RUN = "PASS", "FAIL", "NOT POSSIBLE HERE", "NOT RUN"
SERIAL = Path("solutions", registry.SERIAL)
DDP = Path("solutions", registry.get("ddp").file)
TP = Path("solutions", registry.get("tp").file)


def source(relative: Path) -> Path:
    """A file of the course as shipped (the self-check runs the solutions, never a learner's files)."""
    return course_root() / relative


@dataclass
class Outcome:
    status: str
    detail: str = ""
    figures: dict = field(default_factory=dict)     # name -> number (images/s, GB/s, ...)


@dataclass
class Context:
    """What an item gets: the machine, its own folder (logs, run folders) and its deadline in seconds."""
    probe: object
    folder: Path
    timeout: float


@dataclass
class Ran:
    returncode: int | None        # None: still running at the deadline (then killed)
    seconds: float
    text: str                     # everything it printed (stdout and stderr)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def tail(self, n: int = 8) -> str:
        return "\n".join(self.text.splitlines()[-n:])

    def why(self) -> str:
        """One line on a run that did not succeed, then its last lines."""
        head = (f"deadline of {self.seconds:.0f} s reached (killed)" if self.returncode is None
                else f"exit code {self.returncode}")
        return f"{head}; last lines:\n{self.tail()}"


def child_env(extra: dict | None = None) -> dict:
    """This environment, with this course_lib first on PYTHONPATH (the children import the same code)."""
    path = os.pathsep.join(p for p in (str(PACKAGE_PARENT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **(extra or {})}


def run_command(argv: list, log: Path, timeout: float, cwd: Path | None = None, env: dict | None = None) -> Ran:
    """Run ``argv`` (output to ``log``) within ``timeout`` seconds; its process tree is gone when this returns."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log, "wb") as out:
        p = subprocess.Popen([str(a) for a in argv], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             cwd=cwd, env=child_env(env), start_new_session=True)
        try:
            code = p.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            kill_group(p)
    return Ran(code, time.monotonic() - start, log.read_text(errors="replace"))


def python(*args) -> list:
    """``python ARGS`` with this interpreter (the one whose torch was probed)."""
    return [sys.executable, *args]


def run_ranks(ctx: Context, args: list, nprocs: int, env: dict | None = None, warm: bool | None = None):
    """``course_lib.runtime.launch`` with the item's deadline, every rank's lines also written to ranks.log.
    ``ctx.folder`` is made absolute first: the warm server (``warm=True``) runs in a folder of its own and would
    resolve a relative cwd there (the rank could not start, its error lost in ``os._exit``)."""
    folder = ctx.folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "ranks.log", "w", buffering=1) as log:
        return launch([str(a) for a in args], nprocs=nprocs, timeout=ctx.timeout, cwd=folder, env=child_env(env),
                      on_line=lambda r, line: log.write(f"[rank {r}] {line}\n"), warm=warm)


def worker(ctx: Context, name: str, nprocs: int, *args, env: dict | None = None) -> tuple[str, Outcome | None]:
    """Run ``course_lib.selftest.ranks NAME ARGS`` on ``nprocs`` ranks: (rank 0's ``NAME ok ...`` line, None),
    or (its line, a FAIL with the line or, where it printed none, the launch's summary)."""
    res = run_ranks(ctx, ["-m", "course_lib.selftest.ranks", name, *args], nprocs, env)
    line = next((x for x in res.output(0).splitlines() if x.startswith(f"{name} ")), "")
    if res.ok and line.startswith(f"{name} ok "):
        return line, None
    return line, Outcome(FAIL, line or res.summary())
