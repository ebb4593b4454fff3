"""Where the notebooks' multi-process runs go, and what the run's node has.

``runs.launch(...)`` takes what course_lib.runtime.launch.launch takes and gives the same LaunchResult; its engine is
course_lib.jobs.choose("runs") (its docstring has the order). ``runs.session(env)`` is the warm start
(course_lib.runtime.warm.session) where runs are local, nothing where they go to Slurm. The checkers call
course_lib.runtime.launch directly: where a check runs is the site's ``checks``, and its runs go with it.

- ``local``: the ranks run on this machine (a laptop, CI, a hub whose servers are themselves Slurm jobs).
- ``slurm``: ``launch_on_slurm`` submits one short job on the site's partition (a CPU per rank, a GPU per rank up to
  the node's where the site has GPUs; course_lib.runtime.runner), which runs the same local launch on the compute
  node (course_lib.runtime.run_job). Its ranks' lines come back as they are printed (to ``on_line``), then their exit
  codes: the caller gets the LaunchResult a local launch gives (``.job``: the job's id). A queued job says so with
  Slurm's reason; the job is cancelled at the queue deadline, past the run's deadline (plus START for Python to
  start), when ``stop`` is set, or on Ctrl-C.
"""
import contextlib
import json
import math
import os
import re
import tempfile
import time
from pathlib import Path

from course_lib import jobs
from course_lib.core.result import LINES_NAME, RESULT_NAME, LaunchResult, RankResult, parse_record
from course_lib.core.site import load_site
from course_lib.jobs import SubmitError
from course_lib.runtime import gpus, runner, slurm
from course_lib.runtime import launch as local
from course_lib.runtime import warm as warm_start

QUEUE_TIMEOUT = 900.0   # seconds a run may wait in the queue before it is cancelled
START = 120.0           # seconds beyond the run's own deadline for the job's Python to start and end


class RunJobError(runner.JobError):
    """A run sent to Slurm gave no result (refused, left in the queue, ended without one); the message says why."""


def engine_for(choice: str | None = None) -> str:
    """"local" or "slurm" for a run (course_lib.jobs.choose("runs") has the order)."""
    return jobs.choose("runs", choice)[0]


def launch(script_args, nprocs: int = 2, style: str = "srun", timeout: float = 120, env: dict | None = None,
           cwd=None, on_line=local.default_printer, grace: float = 2.0, torchrun_args=(), stop=None,
           warm: bool | None = True, engine: str | None = None) -> LaunchResult:
    """Run ``python *script_args`` as ``nprocs`` ranks where the site runs them (``engine``: this call's choice);
    the arguments and the result as course_lib.runtime.launch.launch's, but warm by default: the ranks are forked
    from a server that imported torch once, kept for the next run (``warm=False``: fresh interpreters)."""
    if engine_for(engine) == "slurm":
        if style not in ("srun", "torchrun"):
            raise ValueError(f"style must be 'srun' or 'torchrun', not {style!r}")
        return launch_on_slurm(script_args, nprocs, style, timeout, env, cwd, on_line, grace, torchrun_args, stop,
                               warm)
    env = gpus.placed(nprocs, env)   # fewer GPUs than ranks: all on CPU with gloo, said (course_lib.runtime.gpus)
    return local.launch(script_args, nprocs, style, timeout, env, cwd, on_line, grace,
                        torchrun_args=torchrun_args, stop=stop, warm=warm)


def session(env: dict | None = None, preload=(), engine: str | None = None):
    """The warm start for the launches inside (course_lib.runtime.warm.session) where they run here; where they go to
    Slurm, nothing (a server here would import torch for nothing)."""
    if engine_for(engine) == "slurm":
        return contextlib.nullcontext()
    return warm_start.session(env, preload)


def workdir(prefix: str = "run-"):
    """A scratch folder the ranks can reach, removed on the way out: in the runs folder (on the file system the
    compute nodes share) where runs go to Slurm, else in this machine's temp folder."""
    if engine_for() == "slurm":
        folder = jobs.runs_dir()
        folder.mkdir(parents=True, exist_ok=True)
        return tempfile.TemporaryDirectory(prefix=prefix, dir=folder)
    return tempfile.TemporaryDirectory(prefix=prefix)


def node_gpus(choice: str | None = None) -> int:
    """GPUs of the node a run would go to: the site profile's per node when runs go to Slurm, else this machine's."""
    if engine_for(choice) == "slurm":
        return load_site().gpus_per_node
    import torch  # deferred on purpose: `course` and a Slurm run's submitter need no torch

    return torch.cuda.device_count()


def node_has_gpus(choice: str | None = None) -> bool:
    """Whether a run would have a GPU: decide fp16, NCCL, ``torch.compile`` on ``cuda`` with it."""
    return node_gpus(choice) > 0


def where(choice: str | None = None) -> str:
    """Where the runs go, in words, for a cell that says what it decided and why."""
    if engine_for(choice) == "slurm":
        site = load_site()
        return f"Slurm jobs on site '{site.name}' ({site.gpus_per_node} GPU(s) per node)"
    return "this machine"


class _Tail:
    """The job's rank lines file, read as it grows: each whole line to the result and ``on_line``."""

    def __init__(self, path: Path, result: LaunchResult, on_line):
        self.path, self.result, self.on_line = path, result, on_line
        self.offset, self.rest = 0, b""

    def read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        *lines, self.rest = (self.rest + data).split(b"\n")
        for raw in lines:
            record = parse_record(raw.decode("utf-8", "replace"))
            if record is not None:
                self.result.deliver(*record, self.on_line)


def job_spec(request: dict, site):
    """The run's job: a CPU per rank, a GPU per rank where the site has GPUs (at most a node's), the run's deadline
    plus START."""
    nprocs, args = request["nprocs"], request["script_args"]
    what = args[1] if args[:1] == ["-m"] and len(args) > 1 else Path(args[0]).stem if args else "run"
    name = "run-" + (re.sub(r"[^A-Za-z0-9._-]", "-", what.rsplit(".", 1)[-1])[:50] or "run")
    return runner.spec(name, "course_lib.runtime.run_job", request, site,
                       math.ceil((request["timeout"] + START) / 60), cpus=nprocs,
                       gpus=min(nprocs, site.gpus_per_node))


def launch_on_slurm(script_args, nprocs: int, style: str, timeout: float, env: dict | None, cwd, on_line,
                    grace: float, torchrun_args=(), stop=None, warm=None) -> LaunchResult:
    """launch()'s run as a short Slurm job; its LaunchResult (see the module docstring). RunJobError when Slurm
    refuses the job, it waits in the queue longer than QUEUE_TIMEOUT, or it ends without a result."""
    site = load_site()
    request = {"script_args": [str(a) for a in script_args], "nprocs": nprocs, "style": style, "timeout": timeout,
               "env": {str(k): str(v) for k, v in (env or {}).items()}, "cwd": str(Path(cwd or os.getcwd()).resolve()),
               "grace": grace, "torchrun_args": [str(a) for a in torchrun_args], "warm": warm}
    spec = job_spec(request, site)
    try:
        job = slurm.submit(spec, site, jobs.runs_dir())
    except SubmitError as e:
        here = 'it here: COURSE_RUNS=local (in Python: engine="local")'
        raise RunJobError(runner.not_taken("run", e, here)) from None
    start = time.monotonic()
    result = LaunchResult(style, nprocs, [RankResult(r) for r in range(nprocs)], job=job.id)
    tail = _Tail(job.run_dir / LINES_NAME, result, on_line)
    cut = None
    try:
        runner.wait(job, QUEUE_TIMEOUT, runner.say_on_stderr, run_timeout=timeout + START, on_poll=tail.read, stop=stop,
                    error=RunJobError)
    except RunJobError as e:
        if e.queued:
            raise
        cut = e          # past the deadline, or stopped: cancelled, the ranks' codes stay unknown
    tail.read()
    return _outcome(result, job, cut, stop, time.monotonic() - start)


def _outcome(result: LaunchResult, job, cut, stop, elapsed: float) -> LaunchResult:
    """The result with the job's exit codes (from its RESULT_NAME); RunJobError when it ended without them."""
    try:
        done = json.loads((job.run_dir / RESULT_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        done = None
    if done is None:
        if cut is None:
            raise RunJobError(f"job {job.id} ended {job.state} (exit code {job.exit_code}) without a result; "
                              f"the last lines of {job.log_path}:\n" + (job.log(tail=15) or "(empty)"))
        result.timed_out = not (stop is not None and stop.is_set())
        result.elapsed = elapsed
        result.launcher_lines.append(str(cut))
        return result
    for rank, code in zip(result.ranks, done["codes"]):
        rank.returncode = code
    result.timed_out, result.failed_rank = done["timed_out"], done["failed_rank"]
    result.elapsed, result.returncode = done["elapsed"], done["returncode"]
    return result
