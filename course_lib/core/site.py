"""Site profiles: what a cluster needs in every job script (partition, account, modules, node shape).

A profile is a TOML file. ``COURSE_SITE`` picks one: a name from ``course_lib/jobs/sites/`` (``local``,
``generic``, ``example-gpu-cluster``) or a path to your own ``.toml``. Unset: ``generic``.
Every key must be present (``""``, ``0`` or ``[]`` for "not used"), so a typo is an error that names the
key instead of silently losing the account or the reservation. The keys in ``OPTIONAL`` may be left out.
"""
import difflib
import os
import shlex
from dataclasses import make_dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

# the profiles stay in course_lib/jobs/sites/, where the docs and COURSE_SITE name them
SITES_DIR = Path(__file__).resolve().parent.parent / "jobs" / "sites"
DEFAULT_SITE = "generic"

# key -> type; the profile must have exactly these (plus the optional tables env and nccl)
KEYS = {
    "description": str, "partition": str, "account": str, "reservation": str, "qos": str,
    "modules": list, "python": str, "gpus_per_node": int, "cpus_per_node": int,
    "gpu_request": str, "data_dir": str,
}
TABLES = ("env", "nccl")
# optional keys -> default: profiles written before the key existed stay valid
OPTIONAL = {
    "engine": "",             # where jobs, checks and runs go: "local", "slurm", "auto" ("": jobs auto, the rest local)
    "checks": "",             # where `course check` runs: "local" or "slurm" (a short job); "" = as engine says
    "runs": "",               # where the notebooks' multi-process runs go: "local" or "slurm"; "" = as engine says
    # how a job script gets the `module` command: "" (the job's environment has it), "login" (the script runs as a
    # login shell, #!/bin/bash -l, which reads /etc/profile), or a file to source (e.g. /etc/profile.d/lmod.sh)
    "module_init": "",
    "time": "",               # the workshop jobs' time limit ("" = the course's 00:30:00)
    "mem": "",                # --mem, e.g. "16G" ("" = the partition's default)
    "constraint": "",         # --constraint, e.g. "a100"
    "sbatch_extra": [],       # more #SBATCH options, each as written after "#SBATCH ", e.g. "--exclusive"
    "srun_args": [],          # options for every srun that starts ranks, e.g. "--cpu-bind=cores"
    "check_partition": "",    # checks run as jobs (checks = "slurm") go here ("" = partition)
    "check_qos": "",          # ... with this QoS ("" = qos)
}
CHECK_ENGINES = ("local", "slurm")
ENGINES = CHECK_ENGINES + ("auto",)
GPU_REQUESTS = ("gpus-per-node", "gres")


class SiteError(ValueError):
    """A site profile that cannot be used; the message names the file and the key."""


# the profile's keys as attributes, each listed once above (KEYS, OPTIONAL, TABLES): every one is set by load_site
_Profile = make_dataclass("_Profile", [("name", str), ("path", Path), *KEYS.items(),
                                       *((k, type(v)) for k, v in OPTIONAL.items()), *((t, dict) for t in TABLES)],
                          frozen=True)


class Site(_Profile):
    def sbatch_options(self) -> list[tuple[str, str]]:
        """The ``#SBATCH --key=value`` pairs this site adds (only the ones it sets)."""
        return [(k, getattr(self, k)) for k in ("partition", "account", "reservation", "qos") if getattr(self, k)]

    def module_setup(self) -> list[str]:
        """Shell lines that make `module` usable in a job script (before the first ``module load``)."""
        if self.module_init in ("", "login"):
            return []
        return [f"source {shlex.quote(self.module_init)}"]


def available() -> list[str]:
    """The names of the profiles shipped with the course."""
    return sorted(p.stem for p in SITES_DIR.glob("*.toml"))


def _resolve(name_or_path: str) -> Path:
    p = Path(name_or_path).expanduser()
    if p.suffix == ".toml" or os.sep in name_or_path:
        if not p.is_file():
            raise SiteError(f"site profile {p} does not exist (COURSE_SITE names a file or one of {available()})")
        return p
    p = SITES_DIR / f"{name_or_path}.toml"
    if not p.is_file():
        hint = difflib.get_close_matches(name_or_path, available(), n=1)
        raise SiteError(f"no site profile called {name_or_path!r}"
                        + (f"; did you mean {hint[0]!r}?" if hint else "")
                        + f" (shipped: {', '.join(available())}; or give a path to a .toml file)")
    return p


def load_site(name_or_path: str | None = None) -> Site:
    """The profile ``name_or_path``, else ``$COURSE_SITE``, else ``generic``; checked key by key."""
    path = _resolve(name_or_path or os.environ.get("COURSE_SITE") or DEFAULT_SITE)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise SiteError(f"{path}: not valid TOML: {e}") from None
    return Site(name=path.stem, path=path, **_checked(data, path))


def _checked(data: dict, path: Path) -> dict:
    allowed = list(KEYS) + list(OPTIONAL) + list(TABLES)
    for key in data:
        if key not in allowed:
            hint = difflib.get_close_matches(key, allowed, n=1)
            raise SiteError(f"{path}: unknown key {key!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                            + f"; the keys are: {', '.join(allowed)}")
    missing = [k for k in KEYS if k not in data]
    if missing:
        also = f" (and {', '.join(missing[1:])})" if missing[1:] else ""
        raise SiteError(f"{path}: missing key {missing[0]!r}{also}"
                        + "; every key must be there, with \"\", 0 or [] when not used (see example-gpu-cluster.toml)")
    out = {}
    for key, kind in KEYS.items():
        value = data[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise SiteError(f"{path}: {key} must be a {kind.__name__}, not {type(value).__name__} ({value!r})")
        out[key] = tuple(value) if kind is list else value
    if not all(isinstance(m, str) and m for m in out["modules"]):
        raise SiteError(f"{path}: modules must be a list of module names (strings), e.g. [\"pytorch/2.5\"]")
    if out["gpus_per_node"] < 0 or out["cpus_per_node"] < 1:
        raise SiteError(f"{path}: gpus_per_node must be >= 0 and cpus_per_node >= 1")
    if out["gpu_request"] not in GPU_REQUESTS:
        raise SiteError(f"{path}: gpu_request must be one of {GPU_REQUESTS}, not {out['gpu_request']!r}")
    for key, default in OPTIONAL.items():
        value = data.get(key, default)
        if not isinstance(value, type(default)):
            raise SiteError(f"{path}: {key} must be a {type(default).__name__}, not {type(value).__name__} ({value!r})")
        if isinstance(value, list) and not all(isinstance(v, str) and v.startswith("-") for v in value):
            raise SiteError(f"{path}: {key} must list options as written on the command line, e.g. [\"--exclusive\"]")
        out[key] = tuple(value) if isinstance(value, list) else value
    for key, choices in (("engine", ENGINES), ("checks", CHECK_ENGINES), ("runs", CHECK_ENGINES)):
        if out[key] not in ("",) + choices:
            raise SiteError(f"{path}: {key} must be one of {choices}, not {out[key]!r}")
    if out["module_init"] not in ("", "login") and not out["module_init"].startswith("/"):
        raise SiteError(f"{path}: module_init must be \"\", \"login\" or the absolute path of the file that defines "
                        f"`module` (e.g. /etc/profile.d/lmod.sh), not {out['module_init']!r}")
    for table in TABLES:
        values = data.get(table, {})
        if not isinstance(values, dict) or not all(isinstance(v, (str, int)) for v in values.values()):
            raise SiteError(f"{path}: [{table}] must be a table of NAME = \"value\" lines")
        out[table] = {k: str(v) for k, v in values.items()}
    return out
