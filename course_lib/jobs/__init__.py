"""Jobs: sbatch scripts from templates, submitted to Slurm or run locally, watched and read back.

    from course_lib import jobs
    spec = jobs.JobSpec(name="ddp", script="train_ddp.py",
                        args=["--dataset", "digits", "--epochs", "2"], ntasks_per_node=2, launcher="srun")
    print(jobs.script(spec))          # the sbatch script, before anything is submitted
    job = jobs.submit(spec).wait()    # live display; Slurm where there is one, else local processes
    job.state, job.exit_code, job.metrics()

Engine: ``choose(kind)``, the course's one engine chooser for jobs, checks and runs (its docstring has the order).
Site profile: ``site=`` argument, else ``$COURSE_SITE`` (see course_lib.core.site). Run folders: ``runs_dir=``,
else ``$COURSE_RUNS_DIR``, else ``jobs/runs/`` of the course.
"""
import os

from course_lib.core.site import Site, SiteError, load_site
from course_lib.core.spec import JobSpec, JobSpecError, render, time_seconds
from course_lib.jobs import diagnose
from course_lib.runtime import local, slurm
from course_lib.runtime.job import TERMINAL, Job, SubmitError, runs_dir
from course_lib.runtime.reattach import attach  # jobs.attach("local-3").wait(): a job again after a kernel restart
from course_lib.runtime.reattach import list_jobs as list  # noqa: F401 - jobs.list(); shadows list() here: use [*x]
from course_lib.runtime.runner import IN_JOB
from course_lib.runtime.scope import scoped_engine
from course_lib.runtime.slurm import SlurmJob

SlurmJob.hints = staticmethod(diagnose.hints)   # a failed Slurm job's summary names the known causes

ENGINES = ("slurm", "local")
CHOICES = ENGINES + ("auto",)
_probe_cache: dict = {}

# kind -> (its own environment variable, its own site profile key, its engine with nothing set, the error's words)
KINDS = {"jobs": (None, None, "auto", "engine must be 'slurm', 'local' or 'auto', not {!r} (check engine= or "
                                      "COURSE_ENGINE)"),
         "checks": ("COURSE_CHECKS", "checks", "local",
                    "checks run on local, slurm, auto, not {!r} (check --engine, COURSE_CHECKS or COURSE_ENGINE)"),
         "runs": ("COURSE_RUNS", "runs", "local",
                  "runs go to local, slurm or auto, not {!r} (engine=, COURSE_RUNS or COURSE_ENGINE)")}

# jobs.list is left out: a star import would hide the builtin list
__all__ = ["Job", "JobSpec", "JobSpecError", "Site", "SiteError", "SubmitError", "TERMINAL", "choose", "engine",
           "load_site", "render", "runs_dir", "script", "submit", "time_seconds", "training_spec", "attach"]


def choose(kind: str, choice: str | None = None, site: Site | None = None) -> tuple[str, str]:
    """(engine, why) for ``kind`` ("jobs", "checks" or "runs"): "local" or "slurm". The first of these that is set:

    0. a run inside a job (a Slurm job, or a run's or check's job of the course) stays local: no job submits jobs;
    1. ``choice``: this call's (``engine=``, ``--engine``); for runs next, the enclosing check's (a check that runs
       here keeps its runs here);
    2. the kind's own override: ``$COURSE_CHECKS`` or ``$COURSE_RUNS``, then the site profile's ``checks`` or
       ``runs`` (jobs have neither);
    3. ``$COURSE_ENGINE``, the one knob for all three kinds;
    4. the site profile's ``engine`` (``site``, else ``$COURSE_SITE``'s);
    5. the kind's default: jobs auto, checks and runs local.
    ``auto``: Slurm when sbatch is on PATH and the controller answers, else local. A job asked onto Slurm where
    there is none raises SubmitError; a check or run asked onto Slurm is not probed here (its job says).
    """
    wrong = KINDS[kind][3]
    if kind == "runs" and (os.environ.get(IN_JOB) or os.environ.get("SLURM_JOB_ID")):
        return "local", "a run inside a job stays on its node"
    choice, why = next((value, why) for value, why in _settings(kind, choice, site) if value)
    if choice.lower() not in CHOICES:
        raise ValueError(wrong.format(choice))
    choice = choice.lower()
    if choice == "local" or (choice == "slurm" and kind != "jobs"):   # a check or run asked for Slurm: no probe
        return choice, why
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


def _settings(kind: str, choice: str | None, site: Site | None):
    """(value, where it came from) for each rung of choose()'s order, top first; lazily, so that the site profile is
    read only when every rung above its first is empty."""
    variable, key, default, _ = KINDS[kind]
    yield choice, f"asked for the {choice} engine"
    if kind == "runs":
        yield scoped_engine(), "the enclosing check's engine"
    if variable:
        yield os.environ.get(variable), f"{variable}={os.environ.get(variable)}"
        site = site or load_site()
        yield getattr(site, key), f"the site profile {site.name}'s {key}"
    yield os.environ.get("COURSE_ENGINE"), f"COURSE_ENGINE={os.environ.get('COURSE_ENGINE')}"
    site = site or load_site()
    yield site.engine, f"the site profile {site.name}'s engine"
    yield default, f"the default for {kind}"


def engine(choice: str | None = None, site: Site | None = None) -> tuple[str, str]:
    """(engine, why) for a job: ``("slurm", "...")`` or ``("local", "no sbatch on PATH")`` (choose("jobs"))."""
    return choose("jobs", choice, site)


def script(spec: JobSpec, site: Site | str | None = None, engine_name: str | None = None,
           runs: str | os.PathLike | None = None) -> str:
    """The sbatch script ``submit`` would write for ``spec`` (to read before submitting)."""
    site = site if isinstance(site, Site) else load_site(site)
    name = engine_name or engine(site=site)[0]
    return (slurm if name == "slurm" else local).script_for(spec, site, runs_dir(runs))


def submit(spec: JobSpec, engine_name: str | None = None, site: Site | str | None = None,
           runs: str | os.PathLike | None = None) -> Job:
    """Submit ``spec`` to Slurm or run it locally; either way a Job comes back at once.

    A request the scheduler refuses raises SubmitError with the scheduler's own message.
    """
    site = site if isinstance(site, Site) else load_site(site)
    name, _ = engine(engine_name, site)
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
