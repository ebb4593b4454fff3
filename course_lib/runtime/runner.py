"""A short job that runs ``python -m MODULE REQUEST`` for the caller and is waited for (runtime.progress.wait): a check
as a job (course_lib.check_slurm) and a notebook's run as a job (course_lib.runs).
Not submitit's executors: these jobs take the site profile (partition, account, modules, [env]), the course's
sbatch template and run folder as the learner's own jobs do, and a request as JSON rather than a pickle.
"""
import json
import os
from pathlib import Path

from course_lib.core.spec import JobSpec
from course_lib.runtime.progress import JobError, say_on_stderr, wait  # noqa: F401 - runner.wait is the API
from course_lib.runtime.slurm import TAKES_NO_JOB, forget_the_job

IN_JOB = "COURSE_IN_JOB"   # set in a run's or a check's job: the runs it starts stay there (jobs.choose)

# what the job script exports for a training run; the job's own ranks get the submitter's values instead
JOB_ONLY = ("MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "SRUN_CPUS_PER_TASK")


def spec(name: str, module: str, request: dict, site, minutes: int, cpus: int = 1, gpus: int = 0,
         partition: str | None = None, qos: str | None = None):
    """The JobSpec of one task that runs ``python -m module JSON(request)`` for ``minutes``, with ``cpus`` CPUs
    (at most a node's) and ``gpus`` GPUs. The request carries the submitter's JOB_ONLY values (become_the_job)."""
    request = {**request, "env_job_only": {k: os.environ[k] for k in JOB_ONLY if k in os.environ}}
    # launcher "python" runs `python -m MODULE REQUEST`: -m keeps course_lib/ off sys.path
    return JobSpec(name=name, script="-m", args=[module, json.dumps(request)], launcher="python",
                   cpus_per_task=max(1, min(cpus, site.cpus_per_node)), gpus_per_node=gpus, time=str(minutes),
                   partition=partition, qos=qos)


def not_taken(what: str, refused: Exception, here: str) -> str:
    """What to say when Slurm did not take a run's or a check's job: its words, then what to do (wait for the nodes
    it names as taking no job now, else fix the site profile), or run it ``here``."""
    fix = ("Wait until `sinfo` shows those nodes up" if TAKES_NO_JOB in str(refused) else
           "Fix the site profile's partition, account, reservation or qos (COURSE_SITE names it)")
    return f"Slurm did not take the {what}'s job: {refused}\n{fix}, or run {here}"


def become_the_job(argv: list[str]) -> tuple[dict, Path]:
    """In the job (``python -m MODULE REQUEST``): (the request, the job's folder, where its script started). The process
    then sees what one started here would (no Slurm variables: a learner's script reads SLURM_PROCID before RANK; the
    submitter's JOB_ONLY values), works in the submitter's folder, and every run it starts stays here."""
    request, folder = json.loads(argv[0]), Path.cwd()
    os.chdir(request["cwd"])
    forget_the_job()
    for key in JOB_ONLY:
        os.environ.pop(key, None)
    os.environ.update(request.get("env_job_only", {}))
    os.environ[IN_JOB] = "1"
    os.environ["COURSE_RUNS"] = "local"
    return request, folder
