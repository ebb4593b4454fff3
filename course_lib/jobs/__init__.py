"""Jobs: sbatch scripts from templates, submitted to Slurm or run locally, watched and read back.

    from course_lib import jobs
    spec = jobs.JobSpec(name="ddp", script="train_ddp.py",
                        args=["--dataset", "digits", "--epochs", "2"], ntasks_per_node=2, launcher="srun")
    print(jobs.script(spec))          # the sbatch script, before anything is submitted
    job = jobs.submit(spec).wait()    # live display; Slurm where there is one, else local processes
    job.state, job.exit_code, job.metrics()

Engine: ``engine=`` argument, else ``$COURSE_ENGINE`` (``slurm``, ``local`` or ``auto``), else auto:
Slurm when ``sbatch`` is on PATH and the controller answers, local otherwise. Site profile:
``site=`` argument, else ``$COURSE_SITE`` (see course_lib.jobs.site). Run folders: ``runs_dir=``,
else ``$COURSE_RUNS_DIR``, else ``jobs/runs/`` of the course.
"""
from __future__ import annotations

import os

from course_lib.jobs.job import TERMINAL, Job, SubmitError, runs_dir
from course_lib.jobs.site import Site, SiteError, load_site
from course_lib.jobs.spec import JobSpec, JobSpecError, render, time_seconds

ENGINES = ("slurm", "local")
_probe_cache: dict = {}

# jobs.list is left out: a star import would hide the builtin list
__all__ = ["Job", "JobSpec", "JobSpecError", "Site", "SiteError", "SubmitError", "TERMINAL", "engine",
           "load_site", "render", "runs_dir", "script", "submit", "time_seconds", "training_spec", "attach"]


def engine(choice: str | None = None) -> tuple[str, str]:
    """(engine, why): ``("slurm", "...")`` or ``("local", "no sbatch on PATH")``."""
    choice = (choice or os.environ.get("COURSE_ENGINE") or "auto").lower()
    if choice not in ENGINES + ("auto",):
        raise ValueError(f"engine must be 'slurm', 'local' or 'auto', not {choice!r} (check COURSE_ENGINE)")
    if choice == "local":
        return "local", "asked for the local engine"
    from course_lib.jobs import slurm

    key = (os.environ.get("SLURM_CONF"), os.environ.get("PATH"))
    if key not in _probe_cache:   # sinfo once per configuration, not once per job
        _probe_cache[key] = slurm.available()
    ok, why = _probe_cache[key]
    if not ok:
        _probe_cache.pop(key)     # try again next time: the cluster may come up
        if choice == "slurm":
            raise SubmitError(f"the Slurm engine was asked for, but {why}")
        return "local", why
    return "slurm", "sbatch is on PATH and Slurm answers"


def script(spec: JobSpec, site: Site | str | None = None, engine_name: str | None = None,
           runs: str | os.PathLike | None = None) -> str:
    """The sbatch script ``submit`` would write for ``spec`` (to read before submitting)."""
    site = site if isinstance(site, Site) else load_site(site)
    name = engine_name or engine()[0]
    from course_lib.jobs import local, slurm

    return (slurm if name == "slurm" else local).script_for(spec, site, runs_dir(runs))


def submit(spec: JobSpec, engine_name: str | None = None, site: Site | str | None = None,
           runs: str | os.PathLike | None = None) -> Job:
    """Submit ``spec`` to Slurm or run it locally; either way a Job comes back at once.

    A request the scheduler refuses raises SubmitError with the scheduler's own message.
    """
    site = site if isinstance(site, Site) else load_site(site)
    name, _ = engine(engine_name)
    from course_lib.jobs import local, slurm

    return (slurm if name == "slurm" else local).submit(spec, site, runs_dir(runs))


def training_spec(name: str, script, args=(), ranks: int = 1, launcher: str = "srun",
                  site: Site | str | None = None, **extra) -> JobSpec:
    """A training job sized for the site: one rank per GPU, sharing the node's CPUs, where the site profile
    has GPUs; otherwise ``ranks`` CPU ranks of one core each (more would only oversubscribe the cores)."""
    site = site if isinstance(site, Site) else load_site(site)
    gpus = site.gpus_per_node > 0
    return JobSpec(name=name, script=str(script), args=[*args], ntasks_per_node=ranks, launcher=launcher,
                   gpus_per_node=ranks if gpus else 0,
                   cpus_per_task=max(1, site.cpus_per_node // ranks) if gpus else 1, **extra)


def list(runs: str | os.PathLike | None = None):   # shadows list() in this module: use [*x] here
    """This workspace's jobs (run folders, state now) and this user's Slurm jobs without a folder here."""
    from course_lib.jobs.reattach import list_jobs

    return list_jobs(runs)


def attach(job_id: str, runs: str | os.PathLike | None = None) -> Job:
    """The job ``job_id`` again after a kernel restart: ``jobs.attach("local-3").wait()`` shows its progress."""
    from course_lib.jobs.reattach import attach as _attach

    return _attach(job_id, runs)
