"""A notebook's multi-process run with COURSE_RUNS=slurm, on the project's local Slurm: one job per run, its ranks'
lines back per rank as a local launch gives them, every rank under a slurmstepd, a failing rank named, a run past
its deadline ended and a stopped run cancelled, with no process and no job left; a queued run says so (Slurm's
reason) and is cancelled at the queue deadline."""
import re
import subprocess
import textwrap
import threading

import psutil
import pytest
from conftest import in_queue, running_within

from course_lib import runs
from course_lib.runs import launch

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

RANK = textwrap.dedent("""
    import os, sys, time
    import psutil
    rank = int(os.environ["SLURM_PROCID"])
    stepd = any(p.name() == "slurmstepd" for p in psutil.Process().parents())
    print(f"rank {rank} of {os.environ['SLURM_NTASKS']} under slurmstepd: {stepd}", flush=True)
    if sys.argv[1] == "fail" and rank == 1:
        sys.exit(3)
    if sys.argv[1] == "sleep":
        time.sleep(300)
""")


def jobs_known(ids) -> str:
    """What the job-completion log (accounting is off on the test cluster: sacct -c) says of ``ids``."""
    return subprocess.run(["sacct", "-c", "-n", "-P", "-o", "JobID,JobName,State", "-j", ",".join(ids)],
                          capture_output=True, text=True, timeout=60).stdout


def left(script) -> list:
    return [p for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])]


def test_runs_go_to_slurm_as_jobs_with_their_lines_per_rank(slurm, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_RUNS", "slurm")
    monkeypatch.setenv("COURSE_RUNS_DIR", str(tmp_path / "runs"))
    script = tmp_path / "ranks.py"
    script.write_text(RANK)
    seen = []
    ok = launch([str(script), "ok"], nprocs=3, timeout=60, on_line=lambda r, line: seen.append((r, line)))
    assert ok.ok and ok.job, ok.summary()
    assert sorted(seen) == [(r, f"rank {r} of 3 under slurmstepd: True") for r in range(3)], seen
    assert [ok.output(r) for r in range(3)] == [f"rank {r} of 3 under slurmstepd: True" for r in range(3)]

    bad = launch([str(script), "fail"], nprocs=2, timeout=60, on_line=None)
    assert not bad.ok and bad.failed_rank == 1 and bad.ranks[1].returncode == 3, bad.summary()
    assert "rank 1 failed first" in bad.summary()

    slow = launch([str(script), "sleep"], nprocs=2, timeout=5, on_line=None)
    assert slow.timed_out and slow.stuck_ranks == [0, 1], slow.summary()
    assert not left(script)

    stop = threading.Event()                      # a run stopped from outside (Ctrl-C in a cell): scancel
    stopped = launch([str(script), "sleep"], nprocs=2, timeout=60, stop=stop,
                     on_line=lambda r, line: stop.set())
    assert not stopped.ok and not stopped.timed_out and stopped.output(0).endswith("under slurmstepd: True")
    assert not left(script)

    ids = [r.job for r in (ok, bad, slow, stopped)]
    assert subprocess.run(["squeue", "-h", "-j", ",".join(ids)], capture_output=True, text=True,
                          timeout=60).stdout.strip() == ""
    known = jobs_known(ids)
    assert all(f"{i}|run-ranks|" in known for i in ids), known
    assert f"{ids[3]}|run-ranks|CANCELLED" in known, known

    # the whole node taken by another job, and one more job waiting before ours: the run waits in the queue, says
    # so with Slurm's reason and its place (2nd of 2), and is cancelled at the queue deadline
    monkeypatch.setattr(runs, "QUEUE_TIMEOUT", 5)
    before = [subprocess.run(["sbatch", "--parsable", "--exclusive", f"--job-name={name}", "-o", "/dev/null",
                              "--wrap", "sleep 600"], capture_output=True, text=True, timeout=60).stdout.strip()
              for name in ("blocker", "ahead")]
    assert (state := running_within(before[0])) == "RUNNING", f"the blocker did not start in 120 s: {state}"
    capsys.readouterr()
    try:
        with pytest.raises(runs.RunJobError, match="waited in the queue longer than 5 s") as refused:
            launch([str(script), "ok"], nprocs=2, timeout=60, on_line=None)
    finally:
        subprocess.run(["scancel", *before], timeout=60)
    job_id = re.search(r"job (\d+) cancelled", str(refused.value)).group(1)
    said = capsys.readouterr().err
    assert f"queued as job {job_id} (state PENDING" in said, said
    # Slurm's reason and the place: at the first look (under load the scheduler has looked by then), or in a
    # "still queued" line once it has
    assert re.search(rf"job {job_id} (\(state PENDING, |still queued \()reason (Resources|Priority); 2nd of 2 pending "
                     rf"in \w+\)", said), said
    assert in_queue(job_id) == ""
