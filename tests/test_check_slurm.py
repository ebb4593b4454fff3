"""``course check --engine slurm`` (and a site profile's ``checks = "slurm"``, or COURSE_ENGINE=slurm where the profile
leaves checks to it) on the project's local Slurm: the same verdicts as the local check, Slurm's refusal in one
message with exit code 2, and a job that cannot start cancelled at the queue deadline, leaving nothing in the queue.
"""
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT, in_queue, running_within

from course_lib.check import check, engine_for_checks
from course_lib.core.site import SiteError, load_site

TP_SOLUTION = ROOT / "solutions" / "06_tensor_parallel" / "tp.py"
TP_FAULTY = ROOT / "tests" / "tp_faulty" / "matmul_transposed.py"
DDP_SOLUTION = ROOT / "solutions" / "02_ddp" / "mnist_classify_ddp.py"


def profile(tmp_path, name="checks-on-slurm", **values):
    """The local test cluster's profile with ``values`` changed, as a file COURSE_SITE can name."""
    text = (ROOT / "course_lib" / "jobs" / "sites" / "local.toml").read_text()
    for key, value in values.items():
        text = re.sub(rf"(?m)^{key} = .*$", f"{key} = {value!r}".replace("'", '"'), text)
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def course_check(*args, env):
    return subprocess.run([sys.executable, "-m", "course_lib.cli", "check", *map(str, args)], capture_output=True,
                          text=True, timeout=900, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)})


def test_where_checks_run_follows_the_option_then_the_environment_then_the_profile(tmp_path, monkeypatch):
    monkeypatch.delenv("COURSE_CHECKS", raising=False)
    monkeypatch.setenv("COURSE_SITE", "local")
    assert engine_for_checks() == "local" and load_site("example-gpu-cluster").checks == "slurm"
    monkeypatch.setenv("COURSE_SITE", str(profile(tmp_path, checks="slurm")))
    assert engine_for_checks() == "slurm" and engine_for_checks("local") == "local"
    monkeypatch.setenv("COURSE_CHECKS", "local")
    assert engine_for_checks() == "local"
    monkeypatch.setenv("COURSE_CHECKS", "slrum")
    with pytest.raises(ValueError, match="not 'slrum'"):
        engine_for_checks()
    with pytest.raises(SiteError, match="checks must be one of"):
        load_site(str(profile(tmp_path, name="typo", checks="cluster")))
    monkeypatch.setenv("PATH", str(tmp_path))       # no sbatch there: auto, as in course grade, takes local
    assert engine_for_checks("auto") == "local"


@pytest.mark.slurm
@pytest.mark.slow
def test_checks_on_slurm_give_the_local_verdicts_text_and_exit_code(slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_RUNS_DIR", str(tmp_path / "runs"))
    # Python (the notebooks): a profile that says checks = "slurm"
    monkeypatch.setenv("COURSE_SITE", str(profile(tmp_path, checks="slurm")))
    said = []
    here = check("tp", TP_SOLUTION, engine="local", world_sizes=(2,))
    there = check("tp", TP_SOLUTION, world_sizes=(2,), say=said.append)
    assert here.passed and there.passed, there.text()
    assert there.rows() == here.rows()
    assert any(s.startswith("job ") and " started " in s for s in said), said
    # the command line: COURSE_CHECKS=slurm, a faulty file
    here = check("tp", TP_FAULTY, engine="local")
    r = course_check("tp", TP_FAULTY, env={**os.environ, "COURSE_CHECKS": "slurm", "COURSE_SITE": "local"})
    assert not here.passed and r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.splitlines()[:-1] == here.text().splitlines()[:-1]   # the last line: the time it took
    folders = sorted((tmp_path / "runs").iterdir())
    assert [f.name.rsplit("-", 1)[0] for f in folders] == ["check-tp"] * 2, folders
    assert all((f / "report.json").is_file() and (f / "output.log").is_file() for f in folders)


@pytest.mark.slurm
@pytest.mark.slow
def test_a_check_job_is_reused_while_the_file_is_unchanged_as_a_local_check_is(slurm, tmp_path, monkeypatch):
    """Notebook 02's check cells on Slurm, each asking for one step: one job checks every step and the next cell
    reuses its verdicts, as the local check's cache does; a changed file, or cache=False, makes a new job."""
    runs = tmp_path / "runs"
    monkeypatch.setenv("COURSE_RUNS_DIR", str(runs))
    script = tmp_path / "mnist_classify_ddp.py"
    script.write_text(DDP_SOLUTION.read_text())
    options = dict(engine="slurm", say=None, timeout=120, more_ranks=None, simulate=False)
    reused = "reused: the file has not changed since"

    def jobs_made():
        return len(list(runs.glob("check-ddp-*")))
    first, second = (check("ddp", script, steps=[step], **options) for step in (1, 2))
    assert [v.item for v in first.verdicts] == ["Step 1"] and [v.item for v in second.verdicts] == ["Step 2"]
    assert first.passed and second.passed, first.text() + second.text()
    assert reused in second.text() and jobs_made() == 1, second.text()
    script.write_text(script.read_text() + "\n# changed\n")
    changed = check("ddp", script, steps=[2], **options)
    assert changed.passed and reused not in changed.text() and jobs_made() == 2, changed.text()
    again = check("ddp", script, steps=[2], cache=False, **options)
    assert again.passed and reused not in again.text() and jobs_made() == 3, again.text()


@pytest.mark.slurm
@pytest.mark.slow
def test_a_job_slurm_refuses_is_one_message_and_exit_code_2(slurm, tmp_path):
    env = {**os.environ, "COURSE_RUNS_DIR": str(tmp_path / "runs"),
           "COURSE_SITE": str(profile(tmp_path, partition="nosuchpartition"))}
    r = course_check("tp", TP_SOLUTION, "--engine", "slurm", env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr.strip()
    assert err.startswith("course check: Slurm did not take the check's job: sbatch refused the job:"), err
    assert "invalid partition specified: nosuchpartition" in err and err.count("course check:") == 1, err
    assert err.splitlines()[-1].startswith("Fix the site profile's partition") and "--engine local" in err, err
    assert "Traceback" not in err and r.stdout == ""
    assert not any((tmp_path / "runs").glob("check-*")), "a refused job left a folder"


@pytest.mark.slurm
@pytest.mark.slow
def test_course_engine_alone_sends_the_check_to_slurm(slurm, tmp_path):
    """The one knob on the command line's path: COURSE_ENGINE=slurm and a profile that leaves checks to it (checks
    = "", as the default profile does) make `course check` a Slurm job; the profile's partition, which this Slurm
    refuses, shows it went there (a check run here would pass)."""
    env = {**os.environ, "COURSE_RUNS_DIR": str(tmp_path / "runs"), "COURSE_ENGINE": "slurm",
           "COURSE_SITE": str(profile(tmp_path, partition="nosuchpartition", checks=""))}
    env.pop("COURSE_CHECKS", None)
    r = course_check("tp", TP_SOLUTION, env=env)
    assert r.returncode == 2 and "Slurm did not take the check's job" in r.stderr, r.stdout + r.stderr


@pytest.mark.slurm
@pytest.mark.slow
def test_a_job_that_cannot_start_is_cancelled_at_the_queue_deadline(slurm, tmp_path):
    env = {**os.environ, "COURSE_RUNS_DIR": str(tmp_path / "runs"), "COURSE_SITE": "local"}
    # the whole node taken by another job: the check's job waits (Resources) until we cancel it
    blocker = subprocess.run(["sbatch", "--parsable", "--exclusive", "--job-name=blocker", "-o", "/dev/null",
                              "--wrap", "sleep 600"], capture_output=True, text=True, timeout=60, env=env)
    assert blocker.returncode == 0, blocker.stderr
    blocker_id = blocker.stdout.strip().split(";")[0]
    try:
        running_within(blocker_id)
        r = course_check("tp", TP_SOLUTION, "--engine", "slurm", "--queue-timeout", "5", env=env)
    finally:
        subprocess.run(["scancel", blocker_id], timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    queued = re.search(r"queued as job (\d+) \(state PENDING, reason \w+(; \d+\w\w of \d+ pending in \w+)?\)", r.stderr)
    assert queued, r.stderr
    job_id = queued.group(1)
    assert f"course check: job {job_id} cancelled (scancel {job_id}): it waited in the queue longer than 5 s" \
        in r.stderr, r.stderr
    assert "it was PENDING" in r.stderr and "now CANCELLED" in r.stderr, r.stderr
    assert in_queue(job_id) == "", "the cancelled check is still in the queue"
