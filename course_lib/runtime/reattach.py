"""A learner's jobs after a kernel restart (``jobs.list()``, ``jobs.attach(job_id)``): a job goes on (in Slurm, or a
local job in its own session) and its run folder (``job.json``) has all it takes to follow it again."""
import getpass
import time
from pathlib import Path

import psutil

from course_lib.core.spec import JobSpec
from course_lib.runtime.job import INFO_NAME, Job, read_json, runs_dir
from course_lib.runtime.local import LocalJob
from course_lib.runtime.slurm import SlurmJob, command


def _find_runner(run_dir: Path) -> psutil.Process | None:
    """The ``python -m course_lib.runtime.local RUN_DIR`` process of this run folder, if it still runs (a psutil
    Process, not a Popen look-alike: not our child, it has no exit status for us; its end state is in state.json)."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "course_lib.runtime.local" in cmd and cmd[-1:] == [str(run_dir)]:
            return proc
    return None


def from_folder(run_dir: Path) -> Job:
    """The Job recorded in ``run_dir`` (its engine, id and spec), ready to refresh, wait on or cancel."""
    info = read_json(run_dir / INFO_NAME)
    if "spec" not in info or "id" not in info:
        raise LookupError(f"{run_dir / INFO_NAME} does not describe a job (no id or spec)")
    spec = JobSpec(**info["spec"])
    if info.get("engine") == "slurm":
        return SlurmJob(info["id"], spec, run_dir, time.monotonic())
    return LocalJob(info["id"], spec, run_dir, time.monotonic(), _find_runner(run_dir))


def attach(job_id: str, runs=None) -> Job:
    """The job ``job_id`` of this workspace again (after a kernel restart): ``attach(id).wait()``."""
    runs = runs_dir(runs)
    matches = [p for p in runs.glob(f"*-{job_id}") if (p / INFO_NAME).is_file()]
    if not matches:
        known = ", ".join(sorted(str(read_json(p).get("id")) for p in runs.glob(f"*/{INFO_NAME}")))
        raise LookupError(f"no run folder for job {job_id} in {runs}; jobs there: {known or 'none'} "
                          "(see jobs.list())")
    job = from_folder(max(matches, key=lambda p: p.stat().st_mtime))
    job.refresh()
    return job


def scheduler_ids() -> list[str]:
    """This user's jobs that Slurm knows now (empty without Slurm)."""
    r = command(["squeue", "-h", "-u", getpass.getuser(), "-o", "%i"], timeout=20)
    return r.stdout.split() if r.returncode == 0 else []


def list_jobs(runs=None) -> list:
    """Every job of this workspace, oldest first, each refreshed; Slurm jobs of this user with no run
    folder here are listed after them as ``(job id, "no run folder in this workspace")``."""
    runs = runs_dir(runs)
    folders = sorted((p for p in runs.glob("*") if (p / INFO_NAME).is_file()), key=lambda p: p.stat().st_mtime)
    found = []
    for folder in folders:
        try:
            job = from_folder(folder)
            job.refresh()
            found.append(job)
        except (LookupError, TypeError):
            continue   # a folder from an older course whose spec no longer loads: not this learner's job now
    ours = {job.id for job in found}
    found += [(i, "no run folder in this workspace") for i in scheduler_ids() if i not in ours]
    return found
