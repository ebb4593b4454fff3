"""`tools/bench_checks.py --deadlock`: each checker's deadlocked submission exists and the table says what it measured
(the runs themselves are the benchmark: `tools/bench_checks.py --deadlock` prints the figures)."""
import math

from tools import bench_checks


def test_each_deadlock_submission_is_written_from_the_tests_faulty_cases(tmp_path):
    for name in bench_checks.DEADLOCKS:
        path, options = bench_checks.deadlock_submission(name, tmp_path / name)
        assert path.exists() and path.read_text() != ""
        assert set(options) <= set(bench_checks.KEPT_OPTIONS)     # the checker's own deadlines, not the tests'


def test_the_deadlock_table_gives_both_times_over_the_import():
    r = {"checker": "tp", "case": "init_groups_rank0_only", "wall_s": 9.0, "ratio": 4.5, "hang_s": 3.0,
         "reported": True, "rank_lines": 1}
    assert bench_checks.deadlock_row(r, 2.0).split() == ["tp", "init_groups_rank0_only", "9.0", "4.5", "3.0", "1.5",
                                                         "1", "hang", "reported"]
    missed = dict(r, hang_s=math.nan, reported=False)
    assert bench_checks.deadlock_row(missed, 2.0).endswith("NOT reported as a hang")
    assert "torch import in a fresh interpreter: 2.00 s" in bench_checks.deadlock_header(2.0)


def test_the_maintainers_benchmarks_run_from_tools_and_not_from_the_learners_cli():
    import subprocess
    import sys

    from conftest import ROOT
    for tool in ("bench_checks", "bench_room"):
        p = subprocess.run([sys.executable, str(ROOT / "tools" / f"{tool}.py"), "--help"], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0 and "usage: tools/" in p.stdout, p.stdout + p.stderr
    p = subprocess.run([sys.executable, "-m", "course_lib.cli", "bench", "--help"], capture_output=True, text=True,
                       timeout=120)
    # the topics it offers (its help also holds bench.py's docstring, which says the others are in tools/)
    topics = p.stdout[p.stdout.index("positional arguments:"):]
    assert p.returncode == 0 and "allreduce" in topics and "room" not in topics and "checks" not in topics, \
        p.stdout
