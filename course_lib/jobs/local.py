"""The local engine: no Slurm, so this machine's processes stand in for one node.

``submit`` writes the same run folder as the Slurm engine (job.sbatch shown for reference, output.log,
job.json) and starts a runner process, ``python -m course_lib.jobs.local RUN_DIR``, which runs the job
with course_lib.launch: srun-style environment or the real torchrun, the job's time limit as deadline,
the first failing rank stopping the rest, nothing left running. The runner writes each rank's lines as
``rank: line`` (like ``srun --label``) and its state into state.json; the Job reads both.
A job in the background means wait() and cancel() work exactly as with Slurm.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from course_lib import ROOT
from course_lib.jobs.job import INFO_NAME, LOG_NAME, SCRIPT_NAME, Job, SubmitError
from course_lib.jobs.site import Site
from course_lib.jobs.spec import JobSpec, render

STATE_NAME = "state.json"
PIDS_NAME = "pids"


def script_for(spec: JobSpec, site: Site, runs_dir: Path) -> str:
    """The sbatch script this job would be on Slurm (written beside the log for reference)."""
    python = site.python or shlex.quote(sys.executable)
    pattern = f"{runs_dir}/{spec.name}-"
    return render(spec, site, python=python, torchrun=f"{python} -m torch.distributed.run",
                  torchrun_logs="torchrun-logs", pythonpath=shlex.quote(str(ROOT)),
                  output=shlex.quote(f"{pattern}%j/{LOG_NAME}"),
                  workdir='"' + f"{pattern}$SLURM_JOB_ID" + '"',
                  header=["No Slurm here: the local engine ran this job with course_lib.launch instead",
                          "(same ranks, environment and time limit; this script is what sbatch would get)."])


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)   # atomic: a reader sees the old or the new state, never half


class LocalJob(Job):
    engine = "local"

    def __init__(self, job_id, spec, run_dir, submitted, proc: subprocess.Popen):
        super().__init__(job_id, spec, run_dir, submitted)
        self.proc = proc

    def _read_state(self) -> dict:
        try:
            return json.loads((self.run_dir / STATE_NAME).read_text())
        except (OSError, ValueError):
            return {}

    def _query(self):
        info = self._read_state()
        state = info.get("state", "PENDING")
        if state in ("PENDING", "RUNNING") and self.proc.poll() is not None:
            info = self._read_state()   # it may have written its end state just before exiting
            state = info.get("state", state)
            if state in ("PENDING", "RUNNING"):
                return "FAILED", f"the local runner exited ({self.proc.returncode}) without an end state; see runner.log", None
        return state, info.get("reason", ""), info.get("exit_code")

    def _cancel(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)   # the runner stops its ranks (launch's kill_group) and records CANCELLED
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            # it did not answer: stop it and every rank it started, by the process groups it recorded
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            kill_recorded(self.run_dir)
            _write_json(self.run_dir / STATE_NAME, {"state": "CANCELLED", "reason": "cancelled (runner killed)",
                                                    "exit_code": -signal.SIGKILL})


def kill_recorded(run_dir: Path) -> None:
    """KILL the process groups the ranks of this job ran in (recorded in ``pids`` as they started)."""
    try:
        pids = [int(x) for x in (run_dir / PIDS_NAME).read_text().split()]
    except (OSError, ValueError):
        return
    for pid in pids:
        try:   # only a group whose leader still runs in this job's folder: pids get reused
            if os.readlink(f"/proc/{pid}/cwd") == str(run_dir):
                os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def _with_root(pythonpath: str | None) -> str:
    """PYTHONPATH with the course's folder first (course_lib importable), once."""
    parts = [p for p in (pythonpath or "").split(os.pathsep) if p and p != str(ROOT)]
    return os.pathsep.join([str(ROOT), *parts])


def _next_id(runs_dir: Path, name: str) -> tuple[str, Path]:
    """``local-N``, N one more than any local job in ``runs_dir``; the folder is made here (mkdir is atomic)."""
    taken = [int(p.name.rsplit("-local-", 1)[1]) for p in runs_dir.glob("*-local-*")
             if p.name.rsplit("-local-", 1)[1].isdigit()]
    n = max(taken, default=0) + 1
    while True:
        run_dir = runs_dir / f"{name}-local-{n}"
        try:
            run_dir.mkdir()
            return f"local-{n}", run_dir
        except FileExistsError:
            n += 1


def check_resources(spec: JobSpec, site: Site) -> None:
    """Refuse what this machine cannot give, as sbatch would (GPUs that are not there)."""
    if spec.gpus_per_node:
        import torch   # only here: a GPU job is rare on the local engine

        have = torch.cuda.device_count()
        if spec.gpus_per_node > have:
            raise SubmitError(f"local engine: the job asks for {spec.gpus_per_node} GPU(s) per node, this machine "
                              f"has {have}; ask for gpus_per_node=0 (CPU, gloo) or run where there are GPUs")


def submit(spec: JobSpec, site: Site, runs_dir: Path) -> LocalJob:
    check_resources(spec, site)
    runs_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    job_id, run_dir = _next_id(runs_dir, spec.name)
    (run_dir / SCRIPT_NAME).write_text(script_for(spec, site, runs_dir).replace("%j", job_id)
                                       .replace("$SLURM_JOB_ID", job_id))
    info = {"engine": "local", "id": job_id, "site": site.name, "spec": spec.to_dict(),
            "env": {**site.env, **{str(k): str(v) for k, v in spec.env.items()}},
            "data_dir": site.data_dir}
    _write_json(run_dir / INFO_NAME, info)
    env = dict(os.environ)
    env["PYTHONPATH"] = _with_root(env.get("PYTHONPATH"))
    with open(run_dir / "runner.log", "ab") as runner_log:
        proc = subprocess.Popen([sys.executable, "-m", "course_lib.jobs.local", str(run_dir)], cwd=run_dir,
                                env=env, stdin=subprocess.DEVNULL, stdout=runner_log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return LocalJob(job_id, spec, run_dir, start, proc)


# ---------------------------------------------------------------------------------------------- runner
class Cancelled(BaseException):
    """Raised in the runner by SIGTERM: unwinds through launch(), whose ``finally`` kills every rank."""


def _on_term(signum, frame):
    raise Cancelled()


def run_job(run_dir: Path) -> int:
    from course_lib.launch import launch

    info = json.loads((run_dir / INFO_NAME).read_text())
    spec = JobSpec(**info["spec"])
    state_path = run_dir / STATE_NAME
    env = dict(info.get("env", {}))
    env["OMP_NUM_THREADS"] = str(spec.cpus_per_task)   # as the sbatch script sets it
    env["PYTHONUNBUFFERED"] = "1"
    env["SLURM_JOB_ID"] = info["id"]
    env["SLURM_CPUS_PER_TASK"] = str(spec.cpus_per_task)
    env["PYTHONPATH"] = _with_root(os.environ.get("PYTHONPATH"))
    if info.get("data_dir"):
        env["COURSE_DATA_DIR"] = info["data_dir"]
    style = "torchrun" if spec.launcher == "torchrun" else "srun"
    pids_path = run_dir / PIDS_NAME

    def record_pid():   # in each rank's process, before exec: its process group, for a last-resort kill
        fd = os.open(pids_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.close(fd)

    with open(run_dir / LOG_NAME, "a", buffering=1) as log:
        def on_line(rank: int, line: str) -> None:
            log.write(f"{rank}: {line}\n" if rank >= 0 else f"{line}\n")

        log.write(f"job {info['id']} on localhost (local engine: {spec.ranks} {style}-style process(es) "
                  f"on this machine, time limit {spec.time})\n")
        if spec.nodes > 1:
            log.write(f"local engine: {spec.nodes} nodes x {spec.ntasks_per_node} ranks run as {spec.ranks} "
                      "processes on this one machine\n")
        _write_json(state_path, {"state": "RUNNING", "reason": "", "exit_code": None, "pid": os.getpid()})
        final = {"state": "FAILED", "reason": "", "exit_code": None}
        try:
            res = launch([spec.script, *spec.args], nprocs=spec.ranks, style=style, timeout=spec.time_limit_s,
                         env=env, cwd=run_dir, on_line=on_line, preexec_fn=record_pid)
            if res.ok:
                final = {"state": "COMPLETED", "reason": "", "exit_code": 0}
            elif res.timed_out:
                final = {"state": "TIMEOUT", "reason": f"time limit {spec.time} reached", "exit_code": None}
            else:
                failed = res.ranks[res.failed_rank] if res.failed_rank is not None else None
                code = failed.returncode if failed is not None else res.returncode
                final = {"state": "FAILED", "reason": res.summary(tail=0).splitlines()[0], "exit_code": code}
            final["ranks"] = [r.returncode for r in res.ranks]
            final["elapsed"] = round(res.elapsed, 3)
        except Cancelled:
            final = {"state": "CANCELLED", "reason": "cancelled", "exit_code": -signal.SIGTERM}
        except Exception as e:  # the launcher itself failed (e.g. no such script): the job failed, say why
            final = {"state": "FAILED", "reason": f"{type(e).__name__}: {e}", "exit_code": None}
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)   # a second cancel must not interrupt the bookkeeping
            log.write(f"local engine: {final['state']}" + (f" ({final['reason']})" if final["reason"] else "") + "\n")
            _write_json(state_path, final)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    return run_job(Path(argv[0]))


if __name__ == "__main__":
    sys.exit(main())
