"""Scores, exports and causes: scores.csv (skipped checks count for nothing), --roster, --route, Gradescope's
results.json (validated against a schema of Gradescope's documented fields), the LMS CSV, the autograder bundle in
a stand-in /autograder, and feedback that names the limit that stopped a check."""
import csv
import json
import os
import re
import subprocess
import sys
import zipfile

import jsonschema
import pytest
from conftest import ROOT

from course_lib.grading import Limits, Outcome, write_reports
from course_lib.grading.causes import FILE_SIZE, MEMORY, PROCESSES, annotate, limits_hit
from course_lib.grading.reports import Outputs, outcome_rows, summary_cell
from course_lib.grading.routes import ROUTES, route_exercises
from course_lib.grading.scores import RosterError, read_roster, table
from course_lib.registry import EXERCISES

SCHEMA = json.loads((ROOT / "tests" / "grading_class" / "gradescope_results.schema.json").read_text())
COURSE = [sys.executable, "-m", "course_lib.cli"]


def row(learner, ex, item, result, message="m"):
    return {"learner": learner, "exercise": ex, "item": item, "result": result, "message": message}


ROWS = [row("ann", "sbatch", "partition", "pass"), row("ann", "sbatch", "runs under Slurm", "skipped", "no Slurm"),
        row("ann", "sbatch", "ranks", "fail", "two ranks, not four"),
        row("ann", "allreduce", "ring_allreduce", "pass"), row("ann", "allreduce", "tree_allreduce", "pass"),
        row("bob", "sbatch", "runs under Slurm", "skipped", "no Slurm"),
        row("bob", "allreduce", "file", "missing", "not handed in")]


def test_skipped_checks_count_for_nothing_and_a_roster_learner_without_work_gets_zero():
    lines = {r["learner"]: r for r in table(ROWS, ["sbatch", "allreduce"], {"ann": "s1", "cid": "s3"})}
    assert lines["ann"]["sbatch"] == 0.5 and lines["ann"]["allreduce"] == 1.0      # 1 of 2 judged, not 1 of 3
    assert (lines["ann"]["total"], lines["ann"]["max"], lines["ann"]["id"]) == (1.5, 2, "s1")
    assert lines["bob"]["sbatch"] == "" and lines["bob"]["max"] == 1               # nothing judged: no score
    assert (lines["cid"]["sbatch"], lines["cid"]["allreduce"], lines["cid"]["max"]) == (0.0, 0.0, 2)
    ann = [r for r in ROWS if r["learner"] == "ann" and r["exercise"] == "sbatch"]
    assert summary_cell(ann) == "**fail** 1/2, 1 not run"
    assert summary_cell(ann[:2]) == "pass 1/1, 1 not run"
    assert summary_cell(ROWS[5:6]) == "not run 1"


def test_reports_keep_grades_csv_and_add_scores_and_exports(tmp_path):
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    write_reports(out, ROWS, [], ["sbatch", "allreduce"], "# t", [], {"ann": "Check times: sbatch 1.0 s."},
                  Outputs(("gradescope", "lms"), {"ann": "s1"}, {"ann": "2026-11-26T10:00:00Z"}))
    with open(out / "grades.csv", newline="") as f:
        got = list(csv.DictReader(f))
    assert list(got[0]) == ["learner", "exercise", "item", "result", "message"]
    assert [r["result"] for r in got if r["learner"] == "ann"] == ["pass", "skipped", "fail", "pass", "pass"]
    with open(out / "scores.csv", newline="") as f:
        scores = list(csv.DictReader(f))
    assert list(scores[0]) == ["learner", "id", "sbatch", "allreduce", "total", "max", "graded_at"]
    assert scores[0] == {"learner": "ann", "id": "s1", "sbatch": "0.5", "allreduce": "1.0", "total": "1.5",
                         "max": "2", "graded_at": "2026-11-26T10:00:00Z"}
    with open(out / "lms.csv", newline="") as f:
        assert list(csv.reader(f)) == [["id", "learner", "sbatch", "allreduce", "total"],
                                       ["s1", "ann", "0.5", "1.0", "1.5"], ["bob", "bob", "", "0.0", "0.0"]]
    assert "**NOT RUN** runs under Slurm" in (out / "feedback" / "ann.md").read_text()

    results = json.loads((out / "gradescope" / "ann" / "results.json").read_text())
    jsonschema.validate(results, SCHEMA)
    assert results["score"] == 1.5 and results["extra_data"]["id"] == "s1"
    visible = [t for t in results["tests"] if t["visibility"] == "visible"]
    assert [t["name"] for t in visible] == ["sbatch: partition", "sbatch: runs under Slurm", "sbatch: ranks",
                                            "allreduce: ring_allreduce", "allreduce: tree_allreduce"]
    assert [t.get("status") for t in visible] == ["passed", None, "failed", "passed", "passed"]
    assert visible[1]["max_score"] == 0 and visible[1]["output"].startswith("NOT RUN")
    assert sum(t["score"] for t in results["tests"]) == pytest.approx(1.5)
    hidden = [t for t in results["tests"] if t["visibility"] == "hidden"]
    assert len(hidden) == 2 and all(t["max_score"] == 0 for t in hidden)
    assert "Check times" in hidden[0]["output"] and not any("Check times" in t["output"] for t in visible)


def test_the_schema_refuses_what_gradescope_does_not_document():
    good = {"score": 1.0, "tests": [{"name": "a", "score": 1, "max_score": 1, "visibility": "visible"}]}
    jsonschema.validate(good, SCHEMA)
    for bad in ({**good, "max_score": 2}, {"tests": [{"name": "a"}]},
                {**good, "tests": [{"name": "a", "score": 1, "visibility": "students"}]}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, SCHEMA)


def test_roster_errors_say_what_to_fix(tmp_path):
    (tmp_path / "ok.csv").write_text("learner,id,name\nann,s1,Ann A.\nbob,s2,Bob B.\n")
    assert read_roster(tmp_path / "ok.csv") == {"ann": "s1", "bob": "s2"}
    (tmp_path / "cols.csv").write_text("name,student\nann,s1\n")
    (tmp_path / "twice.csv").write_text("learner,id\nann,s1\nann,s2\n")
    for name, words in (("cols.csv", "needs the columns learner and id"), ("twice.csv", "listed twice: ann"),
                        ("nope.csv", "No such file")):
        with pytest.raises(RosterError, match=words):
            read_roster(tmp_path / name)


def test_routes_follow_the_readme_course_map():
    """Each route's notebooks in code are the ones the README's course map names (ranges and 'the half day')."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    named = {"half day": "half-day", "one day": "one-day", "one day, debugging focus": "one-day-debugging",
             "self-study": "self-study"}
    readme = {}
    for label, cells in re.findall(r"^\| (half day[^|]*|one day[^|]*|self-study) \| ([^|]+) \|", text, re.M):
        cells = re.sub(r"\([^)]*\)", "", cells)          # the minutes: "02 (75)"
        numbers = set(re.findall(r"\b(\d\d)\b(?! to)", cells))
        for a, b in re.findall(r"\b(\d\d) to (\d\d)\b", cells):
            numbers |= {f"{n:02d}" for n in range(int(a), int(b) + 1)}
        if "the half day" in cells:
            numbers |= readme["half-day"]
        readme[named[label.split(" (")[0]]] = numbers
    assert set(readme) == set(ROUTES), readme
    for route, notebooks in ROUTES.items():
        expected = set(notebooks) or readme["self-study"]
        assert readme[route] == expected, route
        assert route_exercises(route) == [n for n, e in EXERCISES.items() if e.notebook[:2] in readme[route]]
    # notebooks 01 and 04 teach the lessons step and schedule (registry entries since issue 57)
    assert route_exercises("one-day") == ["step", "ddp", "sbatch", "schedule", "allreduce", "tp"]


def test_grade_refuses_a_bad_roster_and_route_with_exercise(tmp_path):
    (tmp_path / "subs" / "ann").mkdir(parents=True)
    (tmp_path / "r.csv").write_text("who,id\n")
    p = subprocess.run([*COURSE, "grade", tmp_path / "subs", "--out", tmp_path / "o", "--roster", tmp_path / "r.csv"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2 and "needs the columns learner and id" in p.stderr
    p = subprocess.run([*COURSE, "grade", tmp_path / "subs", "--route", "one-day", "--exercise", "tp"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2 and "not allowed with" in p.stderr


def outcome(**kw):
    base = dict(verdicts=None, returncode=0, timed_out=False, seconds=1.0, output="", output_bytes=0)
    return Outcome(**{**base, **kw})


def test_the_limit_that_stopped_a_check_is_named():
    limits = Limits(max_processes=512, memory_mb=4096, max_file_mb=256, deadline=60)
    gloo = [{"item": "ring_allreduce", "result": "fail",
             "message": "W=2: the worker did not start\n  File \"/opt/venv/torch/distributed_c10d.py\"\n"
                        "RuntimeError: Resource temporarily unavailable"},
            {"item": "naive_allreduce", "result": "pass", "message": "W=1"}]
    # no cgroup (RLIMIT_NPROC): the symptom's text; a cgroup's counter says so itself, and a zero counter wins
    assert limits_hit(outcome(verdicts=gloo), gloo[0]["message"]) == [PROCESSES]
    assert limits_hit(outcome(events={"pids": 3})) == [PROCESSES]
    assert limits_hit(outcome(events={"pids": 0}), gloo[0]["message"]) == []
    assert limits_hit(outcome(events={"oom": 1}, returncode=-9)) == [MEMORY]
    assert limits_hit(outcome(output="OSError: [Errno 27] File too large")) == [FILE_SIZE]
    assert limits_hit(outcome(output="all fine")) == []
    guess = "rank 1 ended with exit code -9 (killed by a signal, or out of memory?)"     # the ddp checker's words
    assert limits_hit(outcome(events={"pids": 0, "oom": 0}), guess + "\nMemoryError") == []
    assert limits_hit(outcome(isolation="systemd scope"), "MemoryError") == [MEMORY]
    rows = annotate(gloo, outcome(verdicts=gloo), limits)
    assert rows[0]["message"].startswith("Stopped by the grader's process limit: a check may have at most 512")
    assert "What the check saw: W=2: the worker did not start" in rows[0]["message"]
    assert "/opt/venv" not in rows[0]["message"]                    # the grader's paths stay in the log
    assert rows[1] == gloo[1]
    (mem,) = outcome_rows(outcome(returncode=-9, events={"oom": 2}), limits)
    assert "memory limit: 4096 MB" in mem["message"] and "SIGKILL" in mem["message"]
    (late,) = outcome_rows(outcome(timed_out=True, returncode=-9, output="waiting\n"), limits)
    assert late["item"] == "deadline" and "did not finish within 60 s" in late["message"]
    (big,) = outcome_rows(outcome(returncode=1, output="OSError: [Errno 27] File too large"), limits)
    assert "file-size limit" in big["message"] and "256 MB" in big["message"]


@pytest.mark.slow
def test_gradescope_bundle_runs_in_a_stand_in_autograder_folder(tmp_path):
    """`course release --gradescope`, unzipped into a folder laid out as Gradescope's /autograder, graded by its own
    run_autograder with the bundle's copy of the course: the solution scores 1 of 1, a broken file 0."""
    p = subprocess.run([*COURSE, "release", "--gradescope", tmp_path / "bundle", "--exercise", "allreduce"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    with zipfile.ZipFile(tmp_path / "bundle" / "autograder.zip") as z:
        names = z.namelist()
        assert {"setup.sh", "run_autograder", "course/pyproject.toml"} <= set(names)
        assert not [n for n in names if "solutions" in n or n.startswith("course/exercises")], names
        root = tmp_path / "autograder"
        z.extractall(root / "source")
    for name in ("setup.sh", "run_autograder"):
        (root / "source" / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}    # the bundle's course_lib, not ours
    env.update(AUTOGRADER_ROOT=str(root), COURSE_PYTHON=sys.executable)
    solution = (ROOT / "solutions/05_allreduce/allreduce.py").read_text()
    for text, score in ((solution, 1.0), ("def ring_allreduce(:\n", 0.0)):
        for old in (root / "submission", root / "results"):
            if old.exists():
                subprocess.run(["rm", "-rf", str(old)], check=True)
        (root / "submission" / "05_allreduce").mkdir(parents=True)
        (root / "submission" / "05_allreduce" / "allreduce.py").write_text(text)
        (root / "submission_metadata.json").write_text(json.dumps({"users": [{"email": "ann@example.org"}]}))
        p = subprocess.run([root / "source" / "run_autograder"], capture_output=True, text=True, cwd=root, env=env,
                           timeout=600)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        results = json.loads((root / "results" / "results.json").read_text())
        jsonschema.validate(results, SCHEMA)
        assert results["score"] == score, results
        assert results["extra_data"]["learner"] == "ann@example.org"
        assert "grades of" in p.stdout.lower()          # the instructors' view on stdout


@pytest.mark.slow
def test_a_skipped_verdict_is_stored_as_skipped_and_resume_keeps_the_time(tmp_path):
    """Through the sandbox and `course grade`: the checker's SKIPPED verdict is `skipped` in grades.csv, NOT RUN in
    the feedback and out of the score; --resume keeps when the learner was graded."""
    (tmp_path / "subs" / "ann" / "05_allreduce").mkdir(parents=True)
    (tmp_path / "subs" / "ann" / "05_allreduce" / "allreduce.py").write_text("x = 1\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests" / "grading_class")]))
    args = [*COURSE, "grade", tmp_path / "subs", "--out", tmp_path / "out", "--exercise", "allreduce",
            "--checker", "skip_check"]
    p = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    with open(tmp_path / "out" / "grades.csv", newline="") as f:
        assert [(r["item"], r["result"]) for r in csv.DictReader(f)] == [("parses", "pass"),
                                                                        ("runs under Slurm", "skipped")]
    with open(tmp_path / "out" / "scores.csv", newline="") as f:
        (first,) = list(csv.DictReader(f))
    assert (first["allreduce"], first["total"], first["max"]) == ("1.0", "1.0", "1") and first["graded_at"]
    assert "**NOT RUN** runs under Slurm" in (tmp_path / "out" / "feedback" / "ann.md").read_text()
    assert "| ann | pass 1/1, 1 not run |" in (tmp_path / "out" / "grades.md").read_text()
    p = subprocess.run([*args, "--resume"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert p.returncode == 0 and "0 checks to run" in p.stdout, p.stdout + p.stderr
    with open(tmp_path / "out" / "scores.csv", newline="") as f:
        assert list(csv.DictReader(f)) == [first]


def test_a_check_broken_as_a_whole_counts_the_exercises_items_in_every_isolation():
    """The fork bomb of the made-up class, graded as root under a cgroup's pids limit (the three functions fail)
    and as a non-root user under RLIMIT_NPROC (the same, and the one-rank run fails as a whole: a fourth row). The
    rows of the check as a whole go into the items' messages: 0/3 both ways (issue 55: 0/5 against 0/3)."""
    from course_lib.grading.reports import fold_general
    from course_lib.grading.scores import item_points

    limit = "Stopped by the grader's process limit: a check may have at most 256 processes"
    items = [row("forky", "allreduce", f, "fail", f"{limit}\nWhat the check saw: not written yet")
             for f in ("naive_allreduce", "ring_allreduce", "tree_allreduce")]
    whole = row("forky", "allreduce", "check run", "fail", f"{limit}\nWhat the check saw: the check run on 1 ranks "
                "failed: rank 0 failed first (exit codes: rank 0: 1)")
    as_root, as_user = fold_general(items, "allreduce"), fold_general(items + [whole], "allreduce")
    assert [r["item"] for r in as_user] == [r["item"] for r in as_root] == [r["item"] for r in items]
    assert item_points(as_user) == item_points(as_root)
    assert all("the check as a whole: check run: What the check saw: the check run on 1 ranks failed" in r["message"]
               for r in as_user)
    # where every item passed, a failure of the check as a whole stays a row of its own (it is the only failure)
    passed = [{**r, "result": "pass", "message": "ok"} for r in items]
    assert fold_general(passed + [whole], "allreduce") == passed + [whole]
    # an exercise without declared items (its own checker) is left as it is
    assert fold_general(items + [whole], "sbatch") == items + [whole]


def test_a_check_that_died_before_any_verdict_fails_each_declared_item():
    """The fork bomb: the check's worker itself died (no verdict at all) in one CI run of four, where the others
    broke only a launch; scored on the exercise's items either way."""
    from course_lib.grading.reports import fold_general
    died = [{"item": "check", "result": "fail", "message": "the check was killed by signal SIGKILL"}]
    rows = fold_general(died, "allreduce")
    assert [r["item"] for r in rows] == ["naive_allreduce", "ring_allreduce", "tree_allreduce"], rows
    assert all(r["result"] == "fail" and "SIGKILL" in r["message"] for r in rows), rows
    assert fold_general(died, "sbatch") == died          # no declared items: as it was
