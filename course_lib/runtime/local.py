"""The local engine: no Slurm, so this machine's processes stand in for one node.

``submit`` writes the run folder the Slurm engine writes (job.sbatch for reference, output.log, job.json) and starts
``python -m course_lib.runtime.local RUN_DIR``, which runs the job with launch() (the time limit as its deadline) and
writes ``rank: line`` (as ``srun --label``) into the log and its state into state.json, for the Job to read.
Not submitit's LocalExecutor: it runs a pickled function, not the learner's job script with srun's or torchrun's
variables and a run folder the Slurm engine's Job reads back the same way.
"""
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from course_lib.core.paths import PACKAGE_PARENT
from course_lib.core.site import Site
from course_lib.core.spec import JobSpec
from course_lib.runtime import gpus, slurm, warm
from course_lib.runtime.job import INFO_NAME, LOG_NAME, Job, SubmitError, read_json, write_folder, write_json
from course_lib.runtime.launch import launch
from course_lib.runtime.proc import freeze, stop_tree, wait_gone
from course_lib.runtime.sampler import Sampler
from course_lib.runtime.warm import socket_dirs

STATE_NAME = "state.json"
PIDS_NAME = "pids"


def script_for(spec: JobSpec, site: Site, runs_dir: Path) -> str:
    """The sbatch script this job would be on Slurm (written beside the log for reference)."""
    python = site.python or shlex.quote(sys.executable)
    return slurm.script_for(spec, site, runs_dir, torchrun=f"{python} -m torch.distributed.run",
                            header=["No Slurm here: the local engine ran this job with course_lib.runtime.launch "
                                    "instead", "(same ranks, environment and time limit; this script is what sbatch "
                                    "would get)."])


class LocalJob(Job):
    engine = "local"

    def __init__(self, job_id, spec, run_dir, submitted, proc: psutil.Process | None):
        super().__init__(job_id, spec, run_dir, submitted)
        # the runner: a psutil.Popen when this process started it, a psutil.Process found by its command line after a
        # kernel restart (reattach; not our child: psutil still signals only that process, never a reused pid),
        # None when it is gone
        self.proc = proc

    def _runner_exit(self, timeout: float = 0.0) -> int | str | None:
        """The runner's exit code once it has ended (our child is reaped: "?" for another's), None while it runs."""
        if isinstance(self.proc, psutil.Popen):
            try:
                return self.proc.wait(timeout)
            except psutil.TimeoutExpired:
                return None
        # not our child: gone, or a zombie its new parent has not reaped yet, is ended (proc.wait_gone)
        return "?" if self.proc is None or not wait_gone([self.proc], timeout) else None

    def _query(self):
        info = read_json(self.run_dir / STATE_NAME)
        state = info.get("state", "PENDING")
        if state in ("PENDING", "RUNNING") and (code := self._runner_exit()) is not None:
            info = read_json(self.run_dir / STATE_NAME)   # it may have written its end state just before exiting
            state = info.get("state", state)
            if state in ("PENDING", "RUNNING"):
                return ("FAILED", f"the local runner exited ({code}) without an end state; "
                        "see runner.log", None)
        if state not in ("PENDING", "RUNNING"):
            # the runner writes its end state just before it exits: a caller told "COMPLETED" must find it gone
            self._wait_or_kill()
        return state, info.get("reason", ""), info.get("exit_code")

    def _wait_or_kill(self) -> list | None:
        """Give the runner 30 s to exit; then KILL it and everything below it. The killed tree, or None."""
        if self._runner_exit(30) is not None:
            return None
        tree = freeze([self.proc])   # stopped, then read: nothing it starts meanwhile escapes (proc.freeze)
        servers = socket_dirs(tree)  # a killed fork server cannot remove its socket's folder
        tree = stop_tree(tree)
        self._runner_exit(10)
        for folder in servers:
            shutil.rmtree(folder, ignore_errors=True)
        return tree

    def _cancel(self) -> None:
        if self._runner_exit() is not None:
            return
        with contextlib.suppress(psutil.NoSuchProcess):
            self.proc.send_signal(signal.SIGTERM)   # the runner stops its ranks, records CANCELLED
        tree = self._wait_or_kill()
        if tree is not None:
            # it did not answer and was killed with all below it (frozen first: nothing left its tree meanwhile):
            # wait until all of that is gone, and write the end state it could not write
            wait_gone(tree, 10)
            write_json(self.run_dir / STATE_NAME, {"state": "CANCELLED", "reason": "cancelled (runner killed)",
                                                    "exit_code": -signal.SIGKILL})


def _with_course_on_path(pythonpath: str | None) -> str:
    """PYTHONPATH with the course's folder first (course_lib importable), once."""
    parts = [p for p in (pythonpath or "").split(os.pathsep) if p and p != str(PACKAGE_PARENT)]
    return os.pathsep.join([str(PACKAGE_PARENT), *parts])


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


def submit(spec: JobSpec, site: Site, runs_dir: Path) -> LocalJob:
    if spec.gpus_per_node and spec.gpus_per_node > (have := gpus.count()):   # refused as sbatch would
        raise SubmitError(f"local engine: the job asks for {spec.gpus_per_node} GPU(s) per node, this machine "
                          f"has {have}; ask for gpus_per_node=0 (CPU, gloo) or run where there are GPUs")
    runs_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    job_id, run_dir = _next_id(runs_dir, spec.name)
    write_folder(run_dir, "local", job_id, site, spec,
                 script_for(spec, site, runs_dir).replace("%j", job_id).replace("$SLURM_JOB_ID", job_id),
                 env={**site.env, **{str(k): str(v) for k, v in spec.env.items()}}, data_dir=site.data_dir)
    env = dict(os.environ)
    env["PYTHONPATH"] = _with_course_on_path(env.get("PYTHONPATH"))
    with open(run_dir / "runner.log", "ab") as runner_log:
        proc = psutil.Popen([sys.executable, "-m", "course_lib.runtime.local", str(run_dir)], cwd=run_dir,
                                env=env, stdin=subprocess.DEVNULL, stdout=runner_log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return LocalJob(job_id, spec, run_dir, start, proc)


# ---------------------------------------------------------------------------------------------- runner
def _rank_env(info: dict, spec: JobSpec) -> dict:
    """What the ranks get on top of the runner's environment: what the sbatch script and srun would set."""
    env = {**info.get("env", {}), "OMP_NUM_THREADS": str(spec.cpus_per_task),   # as the sbatch script sets it
           "PYTHONUNBUFFERED": "1", "SLURM_JOB_ID": info["id"], "SLURM_CPUS_PER_TASK": str(spec.cpus_per_task),
           "PYTHONPATH": _with_course_on_path(os.environ.get("PYTHONPATH"))}
    if info.get("data_dir"):
        env["COURSE_DATA_DIR"] = info["data_dir"]
    return env


def _end_state(res, spec: JobSpec) -> dict:
    """The job's end state, in Slurm's words, from launch()'s result."""
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
    return final


def run_job(run_dir: Path) -> int:
    info = read_json(run_dir / INFO_NAME)
    spec = JobSpec(**info["spec"])
    state_path = run_dir / STATE_NAME
    style = "torchrun" if spec.launcher == "torchrun" else "srun"
    # pids: each rank's, or torchrun's agent's, a line each as it starts, for a look at the job from outside
    with open(run_dir / LOG_NAME, "a", buffering=1) as log, open(run_dir / PIDS_NAME, "a", buffering=1) as pids:
        def on_line(rank: int, line: str) -> None:
            log.write(f"{rank}: {line}\n" if rank >= 0 else f"{line}\n")

        log.write(f"job {info['id']} on localhost (local engine: {spec.ranks} {style}-style process(es) "
                  f"on this machine, time limit {spec.time})\n")
        if spec.nodes > 1:
            log.write(f"local engine: {spec.nodes} nodes x {spec.ntasks_per_node} ranks run as {spec.ranks} "
                      "processes on this one machine\n")
        write_json(state_path, {"state": "RUNNING", "reason": "", "exit_code": None, "pid": os.getpid()})
        final = {"state": "FAILED", "reason": "", "exit_code": None}
        try:
            # a machine with fewer GPUs than ranks: all ranks on CPU, said in the job's log
            env = gpus.placed(spec.ranks, _rank_env(info, spec), say=lambda note: log.write(f"local engine: {note}\n"))
            # monitor=True: the job's CPU use, as the sbatch script's ``top -b`` writes it
            top = Sampler(run_dir / f"{spec.name}-{info['id']}.top.log") if spec.monitor else contextlib.nullcontext()
            # several ranks of one CPU: forked from a server that imported torch (and what DDP imports) once, where
            # each would import it itself (about 4 CPU-seconds a rank on a 2-core machine); with more threads per
            # rank, torch starts a thread at import and fork cannot be used
            warm_ok = spec.ranks > 1 and spec.cpus_per_task == 1
            with top, warm.session(env, warm.DDP_IMPORTS) if warm_ok else contextlib.nullcontext() as server:
                if server is not None:
                    log.write("local engine: the ranks are forked from a server that imported torch once "
                              "(COURSE_WARM=0: each rank a fresh python)\n")
                res = launch([spec.script, *spec.args], nprocs=spec.ranks, style=style,
                             timeout=spec.time_limit_s, env=env, cwd=run_dir, on_line=on_line,
                             on_start=lambda pid: pids.write(f"{pid}\n"))
            final = _end_state(res, spec)
        except SystemExit:   # SIGTERM or SIGINT (cancel): launch() has stopped every rank on the way out
            final = {"state": "CANCELLED", "reason": "cancelled", "exit_code": -signal.SIGTERM}
        except Exception as e:  # the launcher itself failed (e.g. no such script): the job failed, say why
            final = {"state": "FAILED", "reason": f"{type(e).__name__}: {e}", "exit_code": None}
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)   # a second cancel must not interrupt the bookkeeping
            log.write(f"local engine: {final['state']}" + (f" ({final['reason']})" if final["reason"] else "") + "\n")
            write_json(state_path, final)
    return 0


def main() -> int:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _: sys.exit(128 + signum))
    return run_job(Path(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
