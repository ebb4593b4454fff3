"""A job description, and the sbatch script rendered from it (jinja2 template ``templates/sbatch.sh.j2``).

``JobSpec(name="ddp", script="train_ddp.py", args=["--epochs", "1"],
ntasks_per_node=2, launcher="srun")`` says *what* to run; the site profile (course_lib.core.site) says
*where*: partition, account, modules, NCCL settings. Both engines take the same JobSpec.
"""
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

from course_lib.core.site import Site, load_site

# the template stays beside the jobs lesson, where learners and the docs find it
TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "jobs" / "templates"
LAUNCHERS = ("srun", "torchrun", "python")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
TIME = re.compile(r"^(?:(?P<d>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$")


class JobSpecError(ValueError):
    """A job description that cannot be submitted; the message says which field and why."""


def time_seconds(text: str) -> int:
    """Slurm's ``--time`` in seconds: ``"10"`` (minutes), ``"5:30"``, ``"01:00:00"``, ``"1-12"``, ``"1-0:30:00"``."""
    m = TIME.match(str(text).strip())
    if not m:
        raise JobSpecError(f"time {text!r} is not a Slurm time limit "
                           "(e.g. \"10\" minutes, \"00:30:00\", \"1-00:00:00\")")
    d, a, b, c = (int(x) if x is not None else None for x in m.group("d", "a", "b", "c"))
    if d is not None:   # D-H[:M[:S]]
        return d * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if c is not None:   # H:M:S
        return a * 3600 + b * 60 + c
    if b is not None:   # M:S
        return a * 60 + b
    return a * 60       # M


@dataclass
class JobSpec:
    """What to run, on how much. ``None`` for partition/account/reservation/qos/modules: the site's value.

    ``ntasks_per_node`` is the number of ranks per node for every launcher; with ``torchrun`` Slurm gets one
    task per node (with all those CPUs) and torchrun starts the ranks. ``cpus_per_task`` is per rank.
    """
    name: str
    script: str
    args: list = field(default_factory=list)
    nodes: int = 1
    ntasks_per_node: int = 1
    cpus_per_task: int = 1
    gpus_per_node: int = 0
    time: str = "00:10:00"
    partition: str | None = None
    account: str | None = None
    reservation: str | None = None
    qos: str | None = None
    modules: list | None = None
    env: dict = field(default_factory=dict)
    launcher: str = "srun"
    monitor: bool = False

    def __post_init__(self):
        self.args = [str(a) for a in self.args]
        self.script = str(self.script)
        self.validate()

    @property
    def ranks(self) -> int:
        return self.nodes * self.ntasks_per_node

    @property
    def time_limit_s(self) -> int:
        return time_seconds(self.time)

    def epochs(self, default: int | None = None) -> int | None:
        """The ``--epochs`` the script is given (for progress displays), else ``default``."""
        for i, a in enumerate(self.args):
            if a == "--epochs" and i + 1 < len(self.args):
                return int(self.args[i + 1])
            if a.startswith("--epochs="):
                return int(a.split("=", 1)[1])
        return default

    def validate(self) -> None:
        if not NAME.match(self.name):
            raise JobSpecError(f"name {self.name!r}: use letters, digits, '.', '_' or '-' (at most 64), "
                               "e.g. 'ddp-2ranks'")
        if self.launcher not in LAUNCHERS:
            raise JobSpecError(f"launcher {self.launcher!r}: choose one of {', '.join(LAUNCHERS)}")
        for key in ("nodes", "ntasks_per_node", "cpus_per_task"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise JobSpecError(f"{key} must be a whole number >= 1, not {value!r}")
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 0:
            raise JobSpecError(f"gpus_per_node must be a whole number >= 0, not {self.gpus_per_node!r}")
        if self.launcher == "python" and self.ranks != 1:
            raise JobSpecError("launcher 'python' runs one process: use nodes=1, ntasks_per_node=1 "
                               "(or launcher 'srun'/'torchrun' for more ranks)")
        time_seconds(self.time)
        for key in self.env:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(key)):
                raise JobSpecError(f"env: {key!r} is not a valid environment variable name")

    def with_site(self, site: Site) -> "JobSpec":
        """A copy where every ``None`` is filled from the site profile."""
        values = asdict(self)
        for key in ("partition", "account", "reservation", "qos"):
            if values[key] is None:
                values[key] = getattr(site, key)
        if values["modules"] is None:
            values["modules"] = list(site.modules)
        return JobSpec(**values)

    def to_dict(self) -> dict:
        return asdict(self)


def _environment():
    import jinja2  # here, not at import: `course --help` stays fast

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)), trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined,
                             autoescape=False)
    env.filters["shquote"] = lambda v: shlex.quote(str(v))
    return env


def render(spec: JobSpec, site: Site | None = None, *, python: str, pythonpath: str, output: str,
           workdir: str | None = None, torchrun: str | None = None, torchrun_logs: str | None = None,
           header: list[str] | None = None) -> str:
    """The sbatch script for ``spec`` on ``site``. The path arguments are shell text, already quoted.

    ``python``: the interpreter on the compute node; ``pythonpath``: where course_lib is; ``output``: the
    ``#SBATCH --output`` pattern; ``workdir``: where the job runs (None: the directory sbatch ran in);
    ``torchrun``: the torchrun command (default ``torchrun``); ``torchrun_logs``: torchrun's --log-dir (None: its
    default, a new folder in /tmp); ``header``: comment lines under the #SBATCH block.
    """
    site = site or load_site()
    job = spec.with_site(site)
    options = [(k, getattr(job, k)) for k in ("partition", "account", "reservation", "qos") if getattr(job, k)]
    options += [(k, getattr(site, k)) for k in ("mem", "constraint") if getattr(site, k)]
    env = sorted({**site.env, **{str(k): str(v) for k, v in job.env.items()}}.items())
    command = shlex.join([job.script, *job.args])
    return _environment().get_template("sbatch.sh.j2").render(
        job=job, site=site, options=options, env=env, command=command, python=python,
        torchrun=torchrun or "torchrun", torchrun_logs=torchrun_logs, pythonpath=pythonpath, output=output,
        srun_args="".join(" " + shlex.quote(a) for a in site.srun_args),
        workdir=workdir,
        header=header or [])
