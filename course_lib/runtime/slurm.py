"""The Slurm engine: ``sbatch`` (``--test-only`` first, then held, its run folder made, released: the folder
exists before the job writes into it), ``squeue -t all``, ``scontrol``, ``sacct`` (``-c`` where accounting is
off), ``scancel``. Not submitit's SlurmExecutor: the learner submits the sbatch script they read and wrote
(teaching content), not a pickled function.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from course_lib.core.paths import PACKAGE_PARENT
from course_lib.core.site import Site
from course_lib.core.spec import JobSpec, render
from course_lib.runtime.job import LOG_NAME, TERMINAL, Job, SubmitError, write_folder

TIMEOUT = 30    # seconds for one Slurm command (a busy controller can be slow)
# sbatch --test-only's words for a job that no node of the partition can take now: too big for every node, or
# every node that could is down, drained or not answering ("*")
UNPLACEABLE = "Requested node configuration is not available"
TAKES_NO_JOB = "takes no job now"   # how ``refusal`` names such a node


def command(cmd: list[str], timeout: float = TIMEOUT, cwd=None, env=None) -> subprocess.CompletedProcess:
    """Run one Slurm command (the course's only runner of them); a timeout (rc 124) or a missing command (rc 127)
    comes back as its result, with why."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              cwd=cwd, env=env)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"{cmd[0]}: no answer in {timeout} s")
    except FileNotFoundError:
        return subprocess.CompletedProcess(cmd, 127, "", f"{cmd[0]}: command not found")


def available() -> tuple[bool, str]:
    """(True, "") when sbatch is on PATH and the controller answers; else (False, why not)."""
    if shutil.which("sbatch") is None:
        return False, "no sbatch on PATH"
    r = command(["sinfo", "-h", "-o", "%P"], timeout=15)
    if r.returncode != 0:
        # the last line is sinfo's verdict; said without its "sinfo: fatal:" prefix, which reads like a crash of
        # the course where Slurm's client is merely installed without a cluster (a laptop, a CI machine)
        lines = (r.stderr or r.stdout).strip().splitlines()
        detail = re.sub(r"^\w+: (fatal|error): ", "", lines[-1]) if lines else f"sinfo exit {r.returncode}"
        return False, (f"Slurm's commands are installed but no Slurm controller answers here: {detail} "
                       "(set SLURM_CONF if this machine belongs to a cluster)")
    return True, ""


def _torchrun_for(site: Site, python: str) -> str:
    """The venv's own torchrun when jobs use the notebook's python (so both come from the same torch)."""
    if site.python:
        return "torchrun"
    beside = Path(sys.executable).with_name("torchrun")
    return shlex.quote(str(beside)) if beside.exists() else f"{python} -m torch.distributed.run"


def script_for(spec: JobSpec, site: Site, runs_dir: Path, torchrun: str | None = None, header=None) -> str:
    """The script the Slurm engine submits for ``spec`` (what a notebook shows before submitting); the local engine's
    copy for reference names its own ``torchrun`` and ``header``."""
    python = site.python or shlex.quote(sys.executable)
    pattern = f"{runs_dir}/{spec.name}-"
    return render(spec, site, python=python, torchrun=torchrun or _torchrun_for(site, python),
                  torchrun_logs="torchrun-logs", pythonpath=shlex.quote(str(PACKAGE_PARENT)),
                  output=shlex.quote(f"{pattern}%j/{LOG_NAME}"),
                  workdir='"' + f"{pattern}$SLURM_JOB_ID".replace('"', '\\"') + '"',
                  header=header or [f"Written by course_lib.jobs for site '{site.name}'; files of this job: "
                                    f"{pattern}<job id>/"])


def _ordinal(n: int) -> str:
    return f"{n}th" if 10 < n % 100 < 14 else f"{n}{({1: 'st', 2: 'nd', 3: 'rd'}).get(n % 10, 'th')}"


class SlurmJob(Job):
    engine = "slurm"
    # job -> the known causes of its failure, read from its log and script: course_lib.jobs sets its diagnose.hints
    # here (what a learner's multi-node script gets wrong is the jobs lesson's, above the runtime)
    hints = staticmethod(lambda job: [])

    def _query(self) -> tuple[str, str, int | None]:
        r = command(["squeue", "-h", "-t", "all", "-j", self.id, "-o", "%T|%r"])
        if r.returncode == 0 and r.stdout.strip():
            state, _, reason = r.stdout.strip().splitlines()[0].partition("|")
            if state not in TERMINAL:
                return state, "" if reason == "None" else reason, None
        # ended (or squeue forgot it): scontrol has the exit code while the job is in the controller's memory
        r = command(["scontrol", "-o", "show", "job", self.id])
        fields = dict(item.split("=", 1) for item in r.stdout.split() if "=" in item) if r.returncode == 0 else {}
        if fields:
            reason = fields.get("Reason", "")
            return (fields.get("JobState", "UNKNOWN"), "" if reason in ("None", "(null)") else reason,
                    _code(fields.get("ExitCode")))
        # gone from the controller (MinJobAge passed): accounting
        return self._from_accounting()

    def _from_accounting(self) -> tuple[str, str, int | None]:
        """sacct, or ``sacct -c`` (the job-completion log) where accounting storage is off."""
        for cmd in (["sacct", "-n", "-P", "-X", "-j", self.id, "-o", "State,ExitCode"],
                    ["sacct", "-c", "-n", "-P", "-X", "-j", self.id, "-o", "State,ExitCode"]):
            rows = [row for row in command(cmd).stdout.strip().splitlines() if "|" in row]
            if rows:
                state, _, code = rows[-1].partition("|")
                return state.split()[0], "", _code(code)
        return "UNKNOWN", "Slurm has no record of this job (squeue, scontrol, sacct, sacct -c)", None

    def queue_place(self) -> str:
        """Where this pending job stands, as Slurm tells it: "2nd of 3 pending in debug" (squeue lists a
        partition's pending jobs highest priority first) and the expected start where the scheduler has computed
        one (squeue --start); "" when Slurm tells nothing (the job is not pending)."""
        r = command(["squeue", "-h", "--start", "-j", self.id, "-o", "%P|%S"])
        part, _, start = r.stdout.strip().partition("\n")[0].partition("|")
        if r.returncode != 0 or not part:
            return ""
        ahead = command(["squeue", "-h", "-t", "PD", "-p", part, "--sort=-p,i", "-o", "%i"]).stdout.split()
        if self.id not in ahead:
            return ""
        n = ahead.index(self.id) + 1
        place = f"{_ordinal(n)} of {len(ahead)} pending in {part}"
        return place + (f", expected to start {start}" if start[:1].isdigit() else "")

    def summary(self, tail: int = 15) -> str:
        """Job.summary, with the hints that name a cause of a failed or hung job right under the first line."""
        head, _, rest = super().summary(tail).partition("\n")
        found = self.hints(self) if self.done and not self.ok else []
        return "\n".join([head, *(f"hint: {h}" for h in found), *([rest] if rest else [])])

    def _cancel(self) -> None:
        r = command(["scancel", self.id])
        if r.returncode != 0:
            raise SubmitError(f"scancel {self.id} failed: {r.stderr.strip()}")


def forget_the_job() -> None:
    """Drop the job's Slurm and MPI variables, for a job that runs checks (course grade and course check on
    Slurm): a learner's DDP script reads SLURM_PROCID / SLURM_NTASKS before RANK / WORLD_SIZE (it is written for
    srun too), so every rank the checker starts would take itself for rank 0 of 1."""
    for key in list(os.environ):
        if key.startswith(("SLURM_", "SLURMD_", "PMI_", "PMIX_", "OMPI_")) and key != "SLURM_CONF":
            del os.environ[key]


def _code(text: str | None) -> int | None:
    """Slurm's ``ExitCode=3:0`` (exit code : signal) -> 3; killed by signal 15 -> -15, like Popen."""
    if not text or ":" not in text:
        return None
    code, signal = (int(x) for x in text.split(":", 1))
    return -signal if signal and not code else code


def node_states() -> dict[str, str]:
    """Each node of this Slurm with its state and, where one is set, the reason ("drained (Kill task failed)");
    {} when sinfo does not say."""
    r = command(["sinfo", "-h", "-N", "-o", "%N|%T|%E"])
    states = {}
    for line in r.stdout.splitlines() if r.returncode == 0 else ():
        node, state, reason = (line.split("|", 2) + ["", ""])[:3]
        reason = reason.strip()
        states[node.strip()] = state.strip() + (f" ({reason})" if reason and reason != "none" else "")
    return states


def taking_no_jobs(states: dict[str, str]) -> dict[str, str]:
    """Of ``node_states()``, the nodes that take no job now, with their states: all but those idle, busy or
    finishing (sinfo's %T) and answering (no "*")."""
    usable = ("idle", "mixed", "allocated", "completing", "planned", "reserved")
    return {n: s for n, s in states.items() if "*" in s or re.match(r"[a-z]*", s).group() not in usable}


def refusal(r: subprocess.CompletedProcess) -> str:
    """What sbatch said when it refused a job; where its words are also those for a job no node could ever hold
    (UNPLACEABLE), the nodes that take no job now are added, with their states."""
    text = (r.stderr or r.stdout).strip() or f"exit {r.returncode}"
    down = taking_no_jobs(node_states()) if UNPLACEABLE in text else {}
    return text + "".join(f"; {n} {TAKES_NO_JOB}: {state}" for n, state in sorted(down.items()))


def submit(spec: JobSpec, site: Site, runs_dir: Path, tries: int = 20) -> SlurmJob:
    """sbatch ``spec``: held, its folder made, released. An sbatch error is raised as SubmitError, verbatim."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    text = script_for(spec, site, runs_dir)
    with tempfile.NamedTemporaryFile("w", suffix=".sbatch", prefix=f".{spec.name}-", dir=runs_dir, delete=False) as f:
        f.write(text)
    tmp = Path(f.name)
    try:
        # a held job skips some of sbatch's checks (e.g. GPUs the nodes do not have): ask Slurm first
        r = command(["sbatch", "--test-only", str(tmp)])
        if r.returncode != 0:
            raise SubmitError("sbatch refused the job: " + refusal(r))
        for _ in range(tries):
            start = time.monotonic()
            r = command(["sbatch", "--parsable", "--hold", str(tmp)])
            if r.returncode != 0:
                raise SubmitError((r.stderr or r.stdout).strip() or f"sbatch exited with {r.returncode}")
            job_id = r.stdout.strip().split(";")[0]
            run_dir = runs_dir / f"{spec.name}-{job_id}"
            try:
                run_dir.mkdir()
            except FileExistsError:
                # job ids restart when a test cluster starts afresh: never write into an older run's folder
                command(["scancel", job_id])
                continue
            write_folder(run_dir, "slurm", job_id, site, spec, text)
            r = command(["scontrol", "release", job_id])
            if r.returncode != 0:
                command(["scancel", job_id])
                raise SubmitError(f"scontrol release {job_id} failed: {r.stderr.strip()}")
            return SlurmJob(job_id, spec, run_dir, start)
        raise SubmitError(f"{tries} job ids in a row already have a folder in {runs_dir}; move old runs away")
    finally:
        tmp.unlink(missing_ok=True)
