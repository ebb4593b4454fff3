"""Feedback per learner (course_lib.grading.feedback): each learner's file holds their own rows only."""
import subprocess
import sys

from conftest import ROOT

from course_lib.grading import write_reports
from course_lib.grading.feedback import file_stem

AR = "05_allreduce/allreduce.py"


def row(learner, exercise, item, result, message):
    return {"learner": learner, "exercise": exercise, "item": item, "result": result, "message": message}


def test_a_dollar_in_a_message_is_no_latex_in_the_markdown(tmp_path):
    """JupyterLab reads $...$ in Markdown as LaTeX: the MASTER_ADDR hint, in grades.md and the feedback, keeps its
    dollars escaped (issue 55: it was garbled); the HTML page shows it in a <pre>, which MathJax leaves alone."""
    hint = 'use the first node: export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'
    write_reports(tmp_path, [row("ann", "sbatch", "MASTER_ADDR", "fail", hint)], [], ["sbatch"], "# t", [], {})
    escaped = 'MASTER_ADDR=\\$(scontrol show hostnames "\\$SLURM_JOB_NODELIST" \\| head -n 1)'
    assert escaped in (tmp_path / "grades.md").read_text()
    feedback = (tmp_path / "feedback" / "ann.md").read_text()
    assert escaped.replace("\\|", "|") in feedback and "=$(" not in feedback
    assert "<pre style=" in (tmp_path / "feedback" / "ann.html").read_text()


def test_each_learner_gets_only_their_own_rows(tmp_path):
    rows = [row("ann", "allreduce", "ring_allreduce", "fail", "rank 1 got 3.0, expected 6.0: ANN-ONLY"),
            row("ann", "tp", "file", "missing", "not handed in"),
            row("anna", "allreduce", "ring_allreduce", "pass", "sums right: ANNA-ONLY"),
            row("anna", "tp", "RowParallelLinear", "fail", "bias <added> twice & more: ANNA-TP"),
            row("-rf x", "tp", "file", "fail", "not valid Python")]
    write_reports(tmp_path, rows, [], ["allreduce", "tp"], "# t", [], {})
    fb = tmp_path / "feedback"
    ann, anna = (fb / "ann.md").read_text(), (fb / "anna.md").read_text()
    assert "ANN-ONLY" in ann and "ANNA" not in ann and "# Feedback for ann\n" in ann
    assert "ANNA-ONLY" in anna and "ANNA-TP" in anna and "ANN-ONLY" not in anna
    assert "## allreduce: 0 of 1 checks pass" in ann and "## tp: not handed in" in ann
    assert "course check allreduce exercises/05_allreduce/allreduce.py" in ann
    page = (fb / "anna.html").read_text()
    assert "bias &lt;added&gt; twice &amp; more" in page and "ANN-ONLY" not in page
    odd = file_stem("-rf x")
    assert odd != "-rf x" and not odd.startswith("-") and (fb / f"{odd}.md").exists()
    assert sorted(p.name for p in fb.iterdir()) == sorted(
        f"{s}.{ext}" for s in ("ann", "anna", odd) for ext in ("md", "html"))


def test_course_grade_writes_feedback(tmp_path):
    subs = tmp_path / "subs"
    for name, text in (("ann", "def ring_allreduce(:\n"), ("anna", "x = (\n")):
        (subs / name / "05_allreduce").mkdir(parents=True)
        (subs / name / AR).write_text(text)
    p = subprocess.run([sys.executable, "-m", "course_lib.cli", "grade", str(subs), "--out", str(tmp_path / "o"),
                        "--exercise", "allreduce"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Isolation: " in (tmp_path / "o" / "grades.md").read_text()     # the header names it
    ann = (tmp_path / "o" / "feedback" / "ann.md").read_text()
    anna = (tmp_path / "o" / "feedback" / "anna.md").read_text()
    assert "def ring_allreduce(:" in ann and "x = (" not in ann
    assert "x = (" in anna and "def ring_allreduce(:" not in anna
