"""``course grade --engine slurm`` on the project's local Slurm: one job array, a task per learner, the same
verdicts as the local engine, a task that Slurm kills at its time limit becomes a fail row, --resume submits
only what is missing.

The checker is tests/grading_class/run_file_check.py (pass when the file runs as 2 ranks), so the checks take
seconds; the real checkers' verdicts on the made-up class are test_grading.py's business, and
benchmarks/grading_class.py grades 30 learners with both engines.
"""
import csv
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, gone_within, processes_under

from course_lib.grading import Learner, read_rows
from course_lib.grading.array import array_ranges, collect, script
from course_lib.jobs import load_site

AR = "05_allreduce/allreduce.py"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def course(*args, env=None, tmp=None):
    env = dict(env or os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests" / "grading_class")]))
    if tmp is not None:
        env["TMPDIR"] = str(tmp)     # the sandboxes' folders: a process still working there is a leftover
    return subprocess.run([sys.executable, "-m", "course_lib.cli", "grade", *map(str, args), "--exercise",
                           "allreduce", "--checker", "run_file_check", "--timeout", "120"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)


def verdicts(out: Path) -> list[tuple]:
    return [(r["learner"], r["exercise"], r["item"], r["result"]) for r in read_rows(out / "grades.csv")]


def test_the_array_script_takes_the_site_profile(tmp_path):
    assert array_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8" and array_ranges([4]) == "4"
    text = script(tmp_path / "slurm" / "manifest.json", load_site("example-gpu-cluster"), [0, 1, 3], 8, 12, 2)
    for line in ("#SBATCH --array=0-1,3%8", "#SBATCH --time=12", "#SBATCH --cpus-per-task=2",
                 "#SBATCH --partition=gpu", "#SBATCH --account=my-project", "#SBATCH --reservation=workshop",
                 "module load cuda/12.4", "-m course_lib.grading.array "):
        assert line in text, line
    assert "--gpus" not in text       # grading asks for no GPUs
    # a module-based site: the init file first, and the site's partition for checks (grading is CPU work)
    site = dataclasses.replace(load_site("example-gpu-cluster"), module_init="/etc/profile.d/lmod.sh",
                               check_partition="cpu")
    text = script(tmp_path / "slurm" / "manifest.json", site, [0], 8, 12, 2)
    assert "#SBATCH --partition=cpu" in text and "--partition=gpu" not in text
    assert text.index("source /etc/profile.d/lmod.sh") < text.index("module load cuda/12.4")


def test_tasks_slurm_ended_become_fail_rows(tmp_path):
    rows_dir = tmp_path / "rows"
    rows_dir.mkdir()
    ok = {"learner": "ann", "rows": [{"learner": "ann", "exercise": "allreduce", "item": "f", "result": "pass",
                                      "message": ""}] * 2, "done": ["allreduce", "tp"], "finished": True,
          "timing": ["allreduce 3.0 s"], "isolation": "Isolation: cgroup v1 (...)"}
    half = {**ok, "learner": "anna", "rows": [{**ok["rows"][0], "learner": "anna"}], "done": ["allreduce"],
            "finished": False}
    (rows_dir / "0.json").write_text(json.dumps(ok))
    (rows_dir / "1.json").write_text(json.dumps(half))
    learners = [Learner("ann", "folder"), Learner("anna", "folder"), Learner("bo", "folder")]
    states = {0: ("COMPLETED", ""), 1: ("NODE_FAIL", ""), 2: ("CANCELLED by 0", "")}
    rows, timing, isolation = collect("7", [0, 1, 2], learners, ["allreduce", "tp"], rows_dir, states)
    got = [(r["learner"], r["exercise"], r["item"], r["result"]) for r in rows]
    assert got == [("ann", "allreduce", "f", "pass")] * 2 + [
        ("anna", "allreduce", "f", "pass"), ("anna", "tp", "slurm", "fail"),
        ("bo", "allreduce", "slurm", "fail"), ("bo", "tp", "slurm", "fail")]
    assert "task 7_1 (NODE_FAIL) before this check gave a verdict: its node failed" in rows[3]["message"]
    assert "it was cancelled" in rows[4]["message"] and isolation == "cgroup v1 (...)"
    assert timing["ann"] == "Check times: allreduce 3.0 s."
    rows, _, _ = collect("7", [0, 1, 2], learners, ["allreduce", "tp"], rows_dir, states, interrupted=True)
    assert {r["learner"] for r in rows} == {"ann"}       # --resume grades the others again


@pytest.mark.slow
def test_slurm_asked_for_where_none_answers(tmp_path):
    (tmp_path / "subs" / "ann").mkdir(parents=True)
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "no-such-slurm.conf"), "COURSE_ENGINE": ""}
    p = course(tmp_path / "subs", "--out", tmp_path / "out", "--engine", "slurm", env=env)
    assert p.returncode == 2 and "the Slurm engine was asked for" in p.stderr, p.stdout + p.stderr
    p = course(tmp_path / "subs", "--out", tmp_path / "auto", "--engine", "auto", env=env)
    assert p.returncode == 0 and "submitted job array" not in p.stdout, p.stdout + p.stderr   # auto: local
    assert read_rows(tmp_path / "auto" / "grades.csv")[0]["result"] == "missing"


def leftovers(folder: Path) -> list[str]:
    """Processes whose command line or working folder is under ``folder`` (after up to 30 s for them to end)."""
    return gone_within(lambda: processes_under(folder))


@pytest.mark.slow
def test_a_class_as_a_slurm_job_array(tmp_path, slurm):
    subs = tmp_path / "subs"
    write(subs / "ann" / AR, "print('ann runs')\n")
    write(subs / "anna" / AR, "raise SystemExit('anna stops')\n")
    write(subs / "bo" / AR, "def ring_allreduce(:\n")
    (subs / "cy").mkdir()
    local = course(subs, "--out", tmp_path / "local", "--engine", "local", env={**os.environ, "COURSE_ENGINE": ""})
    assert local.returncode == 0, local.stdout + local.stderr
    write(subs / "dan" / AR, "import time\nwhile True:\n    time.sleep(1)\n")      # hangs: Slurm's limit ends it
    out, tmp = tmp_path / "slurm", tmp_path / "tmp"
    tmp.mkdir()
    p = course(subs, "--out", out, "--engine", "slurm", "--slurm-time", "1", "--check-timeout", "300",
               "--throttle", "3", "--cpus-per-task", "1", tmp=tmp)
    print(p.stdout, p.stderr)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "submitted job array" in p.stdout
    script = (out / "slurm" / "grade.sbatch").read_text()
    assert "#SBATCH --array=0-4%3" in script and "#SBATCH --time=1" in script
    got = verdicts(out)
    assert [v for v in got if v[0] != "dan"] == verdicts(tmp_path / "local")      # same verdicts as local
    assert [v[3] for v in got] == ["pass", "fail", "fail", "missing", "fail"]
    assert not leftovers(tmp), "the killed task's check left processes behind"
    (dan,) = [r for r in read_rows(out / "grades.csv") if r["learner"] == "dan"]
    assert dan["item"] == "slurm" and "TIMEOUT" in dan["message"] and "time limit" in dan["message"], dan
    md = (out / "grades.md").read_text()
    assert "Engine: Slurm job array" in md and "isolation in the tasks: " in md and "no task reported" not in md
    assert "ann runs" not in (out / "feedback" / "anna.md").read_text()

    # --resume: only the learners grades.csv does not hold go to Slurm
    rows = [r for r in read_rows(out / "grades.csv") if r["learner"] != "bo"]
    with open(out / "grades.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    again = course(subs, "--out", out, "--engine", "slurm", "--resume")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1 learners to grade, 4 already in" in again.stdout
    assert verdicts(out) == got
    jobs = sorted((p.name for p in (out / "slurm").iterdir() if p.is_dir()), key=int)   # job ids: 9 before 14
    assert len(jobs) == 2 and sorted(p.name for p in (out / "slurm" / jobs[-1] / "rows").iterdir()) == ["2.json"]
