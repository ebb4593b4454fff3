"""Run the learner's job script on Slurm with ``python`` and ``torchrun`` replaced by the probe, from the course folder
(as the learner submits it), under one deadline; ``sbatch --test-only`` first.
"""
import json
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.core.paths import PACKAGE_PARENT
from course_lib.runtime.runner import wait
from course_lib.runtime.slurm import SlurmJob, command, node_states, taking_no_jobs
from course_lib.sbatch.probe import MARK


@dataclass
class Outcome:
    accepted: bool = False
    refusal: str = ""              # sbatch --test-only's message
    job_id: str = ""
    state: str = ""                # COMPLETED, FAILED, ... or "TIMEOUT (cancelled by the check)"
    seconds: float = 0.0           # from submission to the end
    nodes: int = 0                 # nodes this Slurm has (sinfo), 0 if unknown
    unusable: dict = field(default_factory=dict)   # node -> its state, for nodes that take no job now (refused)
    records: list = field(default_factory=list)    # the probe's records, in order
    log: str = ""

    def of(self, kind: str) -> list[dict]:
        return [r for r in self.records if r.get("kind") == kind]


def test_only(path: Path, workdir: Path) -> tuple[bool, str]:
    r = command(["sbatch", "--test-only", f"--chdir={workdir}", str(path)])
    return r.returncode == 0, (r.stderr or r.stdout).strip()


def submit_and_wait(path: Path, workdir: Path, site_env: dict, timeout: float) -> Outcome:
    out = Outcome()
    with tempfile.TemporaryDirectory(prefix="sbatch-check-") as tmp:
        folder = Path(tmp)
        (folder / "probe").mkdir()
        (folder / "bin").mkdir()
        for name in ("python", "python3", "torchrun"):    # each runs the probe with the course's python and course_lib
            shim = folder / "bin" / name
            shim.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(PACKAGE_PARENT))}${{PYTHONPATH:+:$PYTHONPATH}} "
                            f"exec {shlex.quote(sys.executable)} -m course_lib.sbatch.probe "
                            f"{'torchrun' if name == 'torchrun' else 'python'} \"$@\"\n")
            shim.chmod(0o755)
        env = dict(os.environ, **site_env)
        env.update(COURSE_PROBE_DIR=str(folder / "probe"), COURSE_PROBE_TIMEOUT=str(max(10.0, timeout / 4)),
                   PATH=f"{folder / 'bin'}:{Path(sys.executable).parent}:{env.get('PATH', '')}")
        for key in [k for k in env if k.startswith(("SBATCH_", "SLURM_JOB", "SLURM_NTASKS"))]:
            env.pop(key)           # a check started inside a job must not pass that job's shape on
        out.accepted, out.refusal = test_only(path, workdir)
        if not out.accepted:
            return refused(out.refusal)
        log = folder / "job.out"
        r = command(["sbatch", "--parsable", f"--chdir={workdir}", f"--output={log}", f"--error={log}", str(path)],
                    timeout=60, env=env)
        if r.returncode != 0:
            out.accepted, out.refusal = False, (r.stderr or r.stdout).strip()
            return out
        out.job_id = r.stdout.strip().split(";")[0]
        job = SlurmJob(out.job_id, None, folder, time.monotonic())
        # one deadline from submission, queue and run together: the job is left to it, then cancelled here
        wait(job, say=None, run_timeout=float("inf"), poll=0.5, timeout=timeout)
        out.state = job.state if job.done else f"TIMEOUT (not done in {timeout:.0f} s: cancelled by the check)"
        if not job.done:
            job.cancel()           # scancel, then wait until Slurm says it has ended
        out.seconds = job.elapsed
        out.log = log.read_text(errors="replace") if log.exists() else ""
        files = sorted((folder / "probe").glob("*.jsonl"), key=lambda p: p.stat().st_mtime)
        from_files = records("".join(p.read_text(errors="replace") for p in files))
        # the files are whole; the log has the ranks of other nodes too where /tmp is not shared (a real cluster)
        out.records = max(from_files, records(out.log), key=lambda rs: sum(r.get("kind") == "rank" for r in rs))
    return out


def refused(message: str) -> Outcome:
    """A job sbatch refused with ``message``, with this Slurm's nodes and those of them that take no job now."""
    states = node_states()
    return Outcome(refusal=message, nodes=len(states), unusable=taking_no_jobs(states))


def records(log: str) -> list[dict]:
    """The probe's records in a job's output. Two ranks' lines can run into one another (their writes to the
    shared output interleave), so each record is read from its marker up to where its JSON ends."""
    found, decoder = [], json.JSONDecoder()
    for chunk in log.split(MARK)[1:]:
        try:
            found.append(decoder.raw_decode(chunk)[0])
        except ValueError:
            pass          # cut by another rank's write: that rank's other records still count
    return found
