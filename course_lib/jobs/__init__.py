"""Jobs: sbatch scripts from templates, submitted to Slurm or run locally, watched and read back.

    from course_lib import jobs
    spec = jobs.JobSpec(name="ddp", script="train_ddp.py",
                        args=["--dataset", "digits", "--epochs", "2"], ntasks_per_node=2, launcher="srun")
    print(jobs.script(spec))          # the sbatch script, before anything is submitted
    job = jobs.submit(spec).wait()    # live display; Slurm where there is one, else local processes
    job.state, job.exit_code, job.metrics()

Engine: ``engine=`` argument, else ``$COURSE_ENGINE`` (``slurm``, ``local`` or ``auto``), else auto:
Slurm when ``sbatch`` is on PATH and the controller answers, local otherwise. ``choose(kind)`` is the course's one
engine chooser, for jobs, checks (``$COURSE_CHECKS``, site key ``checks``) and runs (``$COURSE_RUNS``, ``runs``).
Site profile: ``site=`` argument, else ``$COURSE_SITE`` (see course_lib.core.site). Run folders: ``runs_dir=``,
else ``$COURSE_RUNS_DIR``, else ``jobs/runs/`` of the course.
"""
from __future__ import annotations

import os

from course_lib.core.site import Site, SiteError, load_site
from course_lib.core.spec import JobSpec, JobSpecError, render, time_seconds
from course_lib.runtime.job import TERMINAL, Job, SubmitError, runs_dir
from course_lib.runtime.runner import IN_JOB
from course_lib.runtime.scope import scoped_engine

ENGINES = ("slurm", "local")
_probe_cache: dict = {}

# kind -> (its environment variable, its site profile key, its choices, the error's words: the callers' own)
KINDS = {"jobs": ("COURSE_ENGINE", None, ENGINES + ("auto",),
                  "engine must be 'slurm', 'local' or 'auto', not {!r} (check COURSE_ENGINE)"),
         "checks": ("COURSE_CHECKS", "checks", ("local", "slurm", "auto"),
                    "checks run on local, slurm, auto, not {!r} (check --engine or COURSE_CHECKS)"),
         "runs": ("COURSE_RUNS", "runs", ("local", "slurm"),
                  "runs go to local or slurm, not {!r} (engine= or COURSE_RUNS)")}

# jobs.list is left out: a star import would hide the builtin list
__all__ = ["Job", "JobSpec", "JobSpecError", "Site", "SiteError", "SubmitError", "TERMINAL", "choose", "engine",
           "load_site", "render", "runs_dir", "script", "submit", "time_seconds", "training_spec", "attach"]


def choose(kind: str, choice: str | None = None) -> tuple[str, str]:
    """(engine, why) for ``kind`` ("jobs", "checks" or "runs"): "local" or "slurm".

    The order: a run inside a job (a Slurm job, or a run's or check's job of the course) stays local (no job submits
    jobs); then ``choice``; for runs, the enclosing check's (a check that runs here keeps its runs here); the
    kind's environment variable (COURSE_ENGINE, COURSE_CHECKS, COURSE_RUNS); the site profile's key (``checks``,
    ``runs``; jobs have none: auto). ``auto``: Slurm when sbatch is on PATH and the controller answers, else local.
    """
    variable, key, choices, wrong = KINDS[kind]
    if kind == "runs" and (os.environ.get(IN_JOB) or os.environ.get("SLURM_JOB_ID")):
        return "local", "a run inside a job stays on its node"
    choice = choice or (scoped_engine() if kind == "runs" else None) or os.environ.get(variable)
    if not choice and key is not None:
        site = load_site()
        return getattr(site, key), f"the site profile {site.name}'s {key}"
    choice = choice or "auto"
    if choice.lower() not in choices:
        raise ValueError(wrong.format(choice if kind == "runs" else choice.lower()))
    choice = choice.lower()
    if choice == "local" or (choice == "slurm" and kind != "jobs"):   # a check or run asked for Slurm: no probe
        return choice, f"asked for the {choice} engine"
    from course_lib.runtime import slurm

    probe = (os.environ.get("SLURM_CONF"), os.environ.get("PATH"))
    if probe not in _probe_cache:   # sinfo once per configuration, not once per job
        _probe_cache[probe] = slurm.available()
    ok, why = _probe_cache[probe]
    if not ok:
        _probe_cache.pop(probe)     # try again next time: the cluster may come up
        if choice == "slurm":
            raise SubmitError(f"the Slurm engine was asked for, but {why}")
        return "local", why
    return "slurm", "sbatch is on PATH and Slurm answers"


def engine(choice: str | None = None) -> tuple[str, str]:
    """(engine, why) for a job: ``("slurm", "...")`` or ``("local", "no sbatch on PATH")`` (choose("jobs"))."""
    return choose("jobs", choice)


def script(spec: JobSpec, site: Site | str | None = None, engine_name: str | None = None,
           runs: str | os.PathLike | None = None) -> str:
    """The sbatch script ``submit`` would write for ``spec`` (to read before submitting)."""
    site = site if isinstance(site, Site) else load_site(site)
    name = engine_name or engine()[0]
    from course_lib.runtime import local, slurm

    return (slurm if name == "slurm" else local).script_for(spec, site, runs_dir(runs))


def submit(spec: JobSpec, engine_name: str | None = None, site: Site | str | None = None,
           runs: str | os.PathLike | None = None) -> Job:
    """Submit ``spec`` to Slurm or run it locally; either way a Job comes back at once.

    A request the scheduler refuses raises SubmitError with the scheduler's own message.
    """
    site = site if isinstance(site, Site) else load_site(site)
    name, _ = engine(engine_name)
    from course_lib.runtime import local, slurm

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
    from course_lib.runtime.reattach import list_jobs

    return list_jobs(runs)


def attach(job_id: str, runs: str | os.PathLike | None = None) -> Job:
    """The job ``job_id`` again after a kernel restart: ``jobs.attach("local-3").wait()`` shows its progress."""
    from course_lib.runtime.reattach import attach as _attach

    return _attach(job_id, runs)
