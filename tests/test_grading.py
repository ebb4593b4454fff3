"""`course grade`: what is found in learners' folders, the reports, resume, and a whole made-up class.

The class test runs the course's real checkers (course_lib.allreduce.check and .tp) in the grader's
sandbox on the class of tests/grading_class/make_class.py and checks the report row by row.
"""
import csv
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import jsonschema
import pytest
from conftest import ROOT, gone_within, processes_under

from course_lib import grading
from course_lib.grading import discover, precheck, read_rows, write_reports

sys.path.insert(0, str(ROOT / "tests" / "grading_class"))
from make_class import make_class, starter  # noqa: E402

AR, TP = "05_allreduce/allreduce.py", "06_tensor_parallel/tp.py"
COURSE = [sys.executable, "-m", "course_lib.cli"]


def write(path: Path, text: str = "x = 1\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def learners_of(subs, tmp_path, exercises=("allreduce", "tp")):
    found, ignored = discover(subs, list(exercises), tmp_path / "scratch")
    return {learner.name: learner for learner in found}, ignored


# ---------------------------------------------------------------- what is found where

def test_files_are_found_where_learners_put_them(tmp_path):
    subs = tmp_path / "subs"
    write(subs / "tidy" / AR)
    write(subs / "nested" / "exercises" / AR)
    write(subs / "nested" / "exercises" / TP)
    write(subs / "flat" / "allreduce.py")
    write(subs / "flat" / "Tp (1).py")
    write(subs / "both" / AR, "ok = 1\n")
    write(subs / "both" / "old" / "allreduce.py", "old = 1\n")
    write(subs / "nb" / "05_allreduce" / "allreduce.ipynb", "{}")
    (tmp_path / "scratch").mkdir()
    got, _ = learners_of(subs, tmp_path)
    assert got["tidy"].found["allreduce"].path == subs / "tidy" / AR
    assert got["tidy"].found["tp"].problem == ("missing", "not handed in: no 06_tensor_parallel/tp.py in the folder")
    assert got["nested"].found["tp"].note == "`exercises/06_tensor_parallel/tp.py` (in a sub-folder)"
    assert got["flat"].found["allreduce"].note == "`allreduce.py` (outside 05_allreduce/)"
    assert got["flat"].found["tp"].path == subs / "flat" / "Tp (1).py"
    assert "under another name" in got["flat"].found["tp"].note
    assert got["both"].found["allreduce"].path == subs / "both" / AR
    assert "also there, not graded: `old/allreduce.py`" in got["both"].found["allreduce"].note
    nb = got["nb"].found["allreduce"]
    assert nb.path is None and nb.problem[0] == "missing"
    assert "allreduce.ipynb, which is not a .py file" in nb.problem[1]


def test_what_cannot_be_graded_says_why(tmp_path):
    subs, outside = tmp_path / "subs", tmp_path / "outside"
    write(outside / "tp.py")
    write(subs / "x" / AR, "def f(:\n    pass\n")
    (subs / "x" / TP).parent.mkdir(parents=True)
    os.symlink(outside / "tp.py", subs / "x" / TP)
    write(subs / "inside" / "real.py", "y = 2\n")
    (subs / "inside" / "05_allreduce").mkdir()
    os.symlink(subs / "inside" / "real.py", subs / "inside" / AR)      # a link inside the folder is fine
    os.symlink(outside, subs / "linked")
    (tmp_path / "scratch").mkdir()
    got, _ = learners_of(subs, tmp_path)
    assert got["x"].found["allreduce"].problem == ("fail", "not valid Python: line 1: invalid syntax\n    def f(:")
    assert got["x"].found["tp"].problem[0] == "fail" and "symbolic link" in got["x"].found["tp"].problem[1]
    assert got["inside"].found["allreduce"].path == subs / "inside" / "real.py"
    for ex in ("allreduce", "tp"):
        assert got["linked"].found[ex].problem[0] == "fail"
        assert "outside SUBMISSIONS_DIR" in got["linked"].found[ex].problem[1]


def test_precheck_messages(tmp_path):
    assert precheck(write(tmp_path / "ok.py", "x = 1\n")) is None
    (tmp_path / "bin.py").write_bytes(b"\x00\xff" * 100)
    assert "not UTF-8" in precheck(tmp_path / "bin.py")
    assert "notebook" in precheck(write(tmp_path / "nb.py", '{"cells": [], "nbformat": 4}'))
    (tmp_path / "big.py").write_bytes(b"#" * (grading.MAX_FILE + 1))
    assert "MB" in precheck(tmp_path / "big.py")
    assert precheck(write(tmp_path / "bad.py", "x = (\n")).startswith("not valid Python: line 1")


def test_single_files_zips_and_junk_at_the_top(tmp_path):
    subs = tmp_path / "subs"
    write(subs / "ann_allreduce.py", "def ring_allreduce(t, group=None):\n    pass\n")
    write(subs / "ben.py", "class ColumnParallelLinear:\n    pass\n")
    write(subs / "cid.py", "print('what is this?')\n")
    write(subs / "dee" / AR)
    with zipfile.ZipFile(subs / "dee.zip", "w") as z:            # same name as a folder
        z.writestr("dee/" + TP, "y = 1\n")
        z.writestr("../../escaped.py", "z = 1\n")
        z.writestr("/abs.py", "z = 1\n")
    (subs / "bad.zip").write_bytes(b"not a zip")
    write(subs / "__MACOSX" / "._x")
    write(subs / ".DS_Store")
    (tmp_path / "scratch").mkdir()
    got, ignored = learners_of(subs, tmp_path)
    assert sorted(got) == ["ann_allreduce", "bad", "ben", "cid", "dee", "dee.zip"]
    assert got["ann_allreduce"].found["allreduce"].path == subs / "ann_allreduce.py"
    assert got["ann_allreduce"].found["tp"].problem[0] == "missing"
    assert got["ben"].found["tp"].path and "by what it defines" in got["ben"].notes[0]
    assert all(f.problem[0] == "missing" for f in got["cid"].found.values())
    assert "could not be told" in got["cid"].notes[0]
    assert got["dee.zip"].found["tp"].path.read_text() == "y = 1\n" and "unpacked from" in got["dee.zip"].notes[0]
    assert not list(tmp_path.rglob("escaped.py")) and not Path("/abs.py").exists()
    assert got["bad"].found["allreduce"].problem[0] == "fail" and "could not be unpacked" in got["bad"].notes[0]
    assert ignored == ["`.DS_Store` (not a submission)", "`__MACOSX` (not a submission)"]


def test_reports_survive_odd_names(tmp_path):
    names = ["-rf", "Zoë O'Brien", "a|b", "x\ny", "*bold* `code` # h", "j.doe"]
    rows = [{"learner": n, "exercise": "tp", "item": "f", "result": "fail", "message": "line 1\n| line 2"}
            for n in names]
    rows.append({"learner": "-rf", "exercise": "allreduce", "item": "file", "result": "missing", "message": "no"})
    write_reports(tmp_path, rows, [], ["allreduce", "tp"], "# t", [], {})
    back = read_rows(tmp_path / "grades.csv")
    assert sorted(map(tuple, (r.values() for r in back))) == sorted(map(tuple, (r.values() for r in rows)))
    md = (tmp_path / "grades.md").read_text(encoding="utf-8")
    table = [line for line in md.splitlines() if line.startswith("| ") and "learner" not in line][:len(names)]
    assert all(line.replace("\\|", "").count("|") == 4 for line in table), table   # 3 columns, no stray bars
    assert "| -rf | missing | **fail** 0/1 |" in md
    assert "## x<br>y" in md and "a\\|b" in md and "\\*bold\\* \\`code\\` \\# h" in md


# ---------------------------------------------------------------- the command

def course(*args, **kw):
    return subprocess.run([*COURSE, *map(str, args)], capture_output=True, text=True, timeout=kw.pop("timeout", 600),
                          cwd=kw.pop("cwd", ROOT), **kw)


def test_grade_refuses_what_it_cannot_do(tmp_path):
    p = course("grade", tmp_path / "nope", "--out", tmp_path / "o")
    assert p.returncode == 2 and "is not a folder" in p.stderr and p.stderr.startswith("course grade: ")
    subs = tmp_path / "subs"
    (subs / "a").mkdir(parents=True)
    p = course("grade", subs, "--out", subs / "grades")
    assert p.returncode == 2 and "never writes into" in p.stderr and p.stderr.startswith("course grade: ")
    write(tmp_path / "o" / "grades.csv", "learner,exercise,item,result,message\n")
    p = course("grade", subs, "--out", tmp_path / "o")
    assert p.returncode == 2 and "--resume" in p.stderr and p.stderr.startswith("course grade: ")


def tree_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for top, dirs, files in os.walk(folder, followlinks=False):
        dirs.sort()
        for name in sorted(dirs + files):
            p = Path(top) / name
            h.update(str(p.relative_to(folder)).encode("utf-8", "surrogateescape"))
            if p.is_symlink():
                h.update(os.readlink(p).encode())
            elif p.is_file():
                h.update(p.read_bytes())
                h.update(str(p.stat().st_mode).encode())
    return h.hexdigest()


def sandbox_processes(under: Path) -> list[str]:
    """Processes of a grading check that are still alive: their command line or folder is a sandbox's, under
    ``under`` (the TMPDIR given to the grader: other tests and other graders on the machine are not counted)."""
    return processes_under(under, any_of=("course_lib.grading.sandbox", "course-grade-work-"))


def private_tmp(tmp_path: Path) -> tuple[Path, dict]:
    """A TMPDIR for one grader run (its sandboxes go there), and the environment that gives it."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return tmp, dict(os.environ, TMPDIR=str(tmp))


@pytest.mark.slow
def test_interrupted_run_keeps_what_is_done_and_resume_finishes(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    write(subs / "a-broken" / AR, "def ring_allreduce(:\n")
    write(subs / "b-empty" / "notes.txt", "nothing\n")
    write(subs / "c-hangs" / AR, "import time\nwhile True:\n    time.sleep(1)\n" + starter(AR))
    tmp, env = private_tmp(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests" / "grading_class")])
    # the hanging check cannot end by itself while the test looks (issue 12: under load it had ended before
    # SIGINT came, stopped by the all-reduce checker's 10 s import watchdog): run_file_check runs the file
    # as 2 ranks with no watchdog, and both its deadline and the grader's are 600 s
    checker = ["--checker", "run_file_check"]
    proc = subprocess.Popen([*COURSE, "grade", str(subs), "--out", str(out), "--exercise", "allreduce",
                             "--check-timeout", "600", "--timeout", "600", *checker], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        seen = False
        deadline = time.monotonic() + 300     # a generous bound on a loaded machine, not a timing claim
        while not seen and time.monotonic() < deadline and proc.poll() is None:
            # the first two learners need no checker: their rows are in, and c-hangs's check is running
            seen = (out / "grades.csv").exists() and len(read_rows(out / "grades.csv")) == 2 \
                and bool(sandbox_processes(tmp))
            time.sleep(0.5)
        assert seen, f"the hanging check was never seen running (exit {proc.poll()})"
        time.sleep(2)
        assert sandbox_processes(tmp), "the hanging check ended by itself before SIGINT"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stdout + stderr
    assert "--resume" in stderr
    rows = read_rows(out / "grades.csv")
    assert [(r["learner"], r["result"]) for r in rows] == [("a-broken", "fail"), ("b-empty", "missing")]
    assert not gone_within(lambda: sandbox_processes(tmp))

    p = course("grade", subs, "--out", out, "--exercise", "allreduce", "--resume", "--check-timeout", "5",
               "--timeout", "600", *checker, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 checks to run, 2 already in" in p.stdout
    rows = read_rows(out / "grades.csv")
    assert [(r["learner"], r["item"], r["result"]) for r in rows] == [
        ("a-broken", "file", "fail"), ("b-empty", "file", "missing"), ("c-hangs", "deadline", "fail")]
    assert "did not finish within 5 s" in rows[2]["message"]


@pytest.mark.slow
def test_a_made_up_class(tmp_path):
    """Eleven learners: complete, partial, starter, broken, hanging, hostile, forking, odd entries."""
    subs = make_class(tmp_path / "class" / "submissions", tmp_path / "class" / "outside")
    out = tmp_path / "grades"
    digest = tree_digest(subs)
    tmp, env = private_tmp(tmp_path)
    start = time.monotonic()
    p = course("grade", subs, "--out", out, "--jobs", 2, "--check-timeout", 150, "--max-processes", 256,
               "--exercise", "allreduce", "--exercise", "tp", "--format", "gradescope", "--format", "lms",
               timeout=900, env=env)
    took = time.monotonic() - start
    md = (out / "grades.md").read_text(encoding="utf-8")
    print(p.stdout, p.stderr, md, f"\ngraded in {took:.1f} s with --jobs 2", sep="\n")
    assert p.returncode == 0, p.stdout + p.stderr
    assert tree_digest(subs) == digest, "the submissions changed"
    assert not list(tmp_path.rglob("graded.txt")) and not list(tmp_path.rglob("escape.py"))
    assert not sandbox_processes(tmp)
    assert "\n\nIsolation: " in md      # the header names the isolation in force (cgroup v1, v2, ...)

    rows = read_rows(out / "grades.csv")
    by = {}
    for r in rows:
        by.setdefault((r["learner"], r["exercise"]), []).append(r)
    learners = {"alice", "bob (late)", "Zoë.Durand", "-rf", "henry", "mallory", "forky", "frank_allreduce",
                "grace", "empty", "eve"}
    assert {k[0] for k in by} == learners
    assert set(by) == {(name, ex) for name in learners for ex in ("allreduce", "tp")}, "a row for every pair"

    def results(learner, ex):
        return [r["result"] for r in by[learner, ex]]

    def only(learner, ex):
        (row,) = by[learner, ex]
        return row["item"], row["result"], row["message"]

    # complete work passes, every verdict of both checkers
    assert len(results("alice", "allreduce")) >= 3 and set(results("alice", "allreduce")) == {"pass"}
    assert len(results("alice", "tp")) >= 3 and set(results("alice", "tp")) == {"pass"}
    # the starter fails with a message on each verdict, wherever it lies
    for learner, ex in (("bob (late)", "tp"), ("Zoë.Durand", "allreduce"), ("frank_allreduce", "allreduce")):
        assert "fail" in results(learner, ex) and "pass" not in results(learner, ex), (learner, ex)
        assert all(r["message"] for r in by[learner, ex])
    # what was not handed in is a missing row that says so
    for learner, ex in (("bob (late)", "allreduce"), ("Zoë.Durand", "tp"), ("henry", "tp"), ("forky", "tp"),
                        ("empty", "allreduce"), ("empty", "tp"), ("frank_allreduce", "tp")):
        item, result, message = only(learner, ex)
        assert (item, result) == ("file", "missing") and "not handed in" in message, (learner, ex)
    assert only("grace", "allreduce")[1] == "missing" and "allreduce.ipynb" in only("grace", "allreduce")[2]
    # broken files are failures with the reason, without running anything
    assert only("-rf", "allreduce")[:2] == ("file", "fail") and "not valid Python: line" in only("-rf", "allreduce")[2]
    assert only("-rf", "tp")[:2] == ("file", "fail") and "not UTF-8" in only("-rf", "tp")[2]
    # symbolic links out of the class are not followed
    assert only("mallory", "tp")[1] == "fail" and "symbolic link" in only("mallory", "tp")[2]
    assert only("eve", "allreduce")[1] == only("eve", "tp")[1] == "fail"
    # the hanging file is stopped: by the checker's own deadline for loading a file, else by the grader's
    item, result, message = only("henry", "allreduce")
    assert result == "fail" and ("did not finish within 150 s" in message or "took more than" in message), message
    # the hostile and the forking files get verdicts, and none passes
    for learner in ("mallory", "forky"):
        assert by[learner, "allreduce"] and "pass" not in results(learner, "allreduce"), learner
        assert all(r["message"] for r in by[learner, "allreduce"])
    # the fork bomb is judged on the exercise's three functions, whichever limit stopped it (reports.fold_general)
    assert [r["item"] for r in by["forky", "allreduce"]] == ["naive_allreduce", "ring_allreduce", "tree_allreduce"]

    # the Markdown report: one table for the class, one section per learner with what was found
    for line in ("| alice | pass ", "| henry | **fail** 0/1 | missing |", "| empty | missing | missing |",
                 "| -rf | **fail** 0/1 | **fail** 0/1 |"):
        assert any(row.startswith(line) for row in md.splitlines()), line
    for heading in learners:
        assert f"## {grading.md_name(heading)}\n" in md, heading
    assert "`exercises/05_allreduce/allreduce.py` (in a sub-folder)" in md
    assert "a single file `frank_allreduce.py` at the top of SUBMISSIONS_DIR, graded as allreduce" in md
    assert "unpacked from `grace.zip`" in md and "`notes.txt`" in md
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        assert next(csv.reader(f)) == ["learner", "exercise", "item", "result", "message"]
    logs = list((out / "logs").rglob("*.log"))
    assert logs and max(p.stat().st_size for p in logs) < 64 * 1024

    # the fork bomb's feedback names the limit that stopped it, and what it means for the learner's code
    forky = (out / "feedback" / "forky.md").read_text(encoding="utf-8")
    assert "Stopped by the grader's process limit: a check may have at most 256 processes" in forky, forky
    # scores: a row per learner, each exercise one point; the exports carry the same numbers
    with open(out / "scores.csv", newline="", encoding="utf-8") as f:
        scores = {r["learner"]: r for r in csv.DictReader(f)}
    assert set(scores) == learners and all(r["graded_at"] for r in scores.values())
    assert [scores["alice"][k] for k in ("allreduce", "tp", "total", "max")] == ["1.0", "1.0", "2.0", "2"]
    assert all(scores[n]["total"] == "0.0" for n in learners - {"alice"}), scores
    with open(out / "lms.csv", newline="", encoding="utf-8") as f:
        lms = list(csv.reader(f))
    assert lms[0] == ["id", "learner", "allreduce", "tp", "total"] and len(lms) == 1 + len(learners)
    schema = json.loads((ROOT / "tests" / "grading_class" / "gradescope_results.schema.json").read_text())
    results = list((out / "gradescope").glob("*/results.json"))
    assert len(results) == len(learners)
    for path in results:
        data = json.loads(path.read_text(encoding="utf-8"))
        jsonschema.validate(data, schema)
        assert data["score"] == float(scores[data["extra_data"]["learner"]]["total"]), path


@pytest.mark.slow
def test_strict_launchers_reaches_the_ddp_checker(tmp_path):
    """``course grade --strict-launchers``: a script written for srun alone fails Step 6 and is told why (without
    the flag it passes: tests/ddp_faulty's srun_only case)."""
    folder = tmp_path / "subs" / "ann" / "02_ddp"
    folder.mkdir(parents=True)
    (folder / "mnist_classify_ddp.py").write_text((ROOT / "tests" / "ddp_faulty" / "srun_only.py").read_text())
    p = course("grade", tmp_path / "subs", "--out", tmp_path / "out", "--exercise", "ddp", "--strict-launchers",
               timeout=900)
    rows = {r["item"]: r for r in read_rows(tmp_path / "out" / "grades.csv")}
    shown = p.stdout[-3000:] + p.stderr[-2000:]
    assert rows["Step 1"]["result"] == "pass", shown
    assert rows["Step 6"]["result"] == "fail" and "--strict-launchers" in rows["Step 6"]["message"], shown
