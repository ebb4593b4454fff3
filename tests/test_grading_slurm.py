"""``course grade --engine slurm`` on the project's local Slurm: one job array, a task per learner, the same
verdicts as the local engine, a task that Slurm kills at its time limit becomes a fail row, --resume submits
only what is missing.

The checker is tests/grading_class/run_file_check.py (pass when the file runs as 2 ranks), so the checks take
seconds; the real checkers' verdicts on the made-up class are test_grading.py's business, and
benchmarks/grading_class.py grades 30 learners with both engines.
"""
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from course_lib.grading import read_rows

ROOT = Path(__file__).resolve().parent.parent
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


def leftovers(folder: Path) -> list[str]:
    """Processes whose command line or working folder is under ``folder``."""
    time.sleep(1)
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if str(folder) in cmd + " " + cwd:
            found.append(f"{pid}: {cmd[:120]}")
    return found


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
    jobs = sorted(p.name for p in (out / "slurm").iterdir() if p.is_dir())
    assert len(jobs) == 2 and sorted(p.name for p in (out / "slurm" / jobs[-1] / "rows").iterdir()) == ["2.json"]
