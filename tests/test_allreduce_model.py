"""The alpha-beta model, the busbw definition, the benchmark's table and ratio, and the pictures' schedules;
one real quick benchmark run (gloo processes) and one on a file whose ring hangs."""
import csv
import math
import re
import subprocess
import sys

import pytest
from allreduce_faulty.cases import CASES
from conftest import ROOT

from course_lib.allreduce import bench
from course_lib.allreduce import costmodel as model
from course_lib.allreduce import plots as viz


def test_coefficients_follow_thakur_et_al():
    assert model.coefficients("ring", 4) == (6, 1.5)          # 2(W-1) alpha + 2(W-1)/W n beta
    assert model.coefficients("naive", 4) == (6, 6)           # 2(W-1) (alpha + n beta)
    assert model.coefficients("tree", 5) == (6, 6)            # 2 ceil(log2 5) = 6
    assert model.coefficients("gloo", 8) == model.coefficients("ring", 8)
    with pytest.raises(ValueError):
        model.coefficients("butterfly", 4)


def test_busbw_is_algbw_times_2_w_minus_1_over_w():
    assert model.algbw(1e9, 0.5) == 2e9
    assert model.busbw(1e9, 0.5, 4) == pytest.approx(2e9 * 2 * 3 / 4)
    assert model.busbw(1e9, 0.5, 2) == pytest.approx(2e9)


def test_fit_recovers_known_alpha_beta():
    alpha, beta = 50e-6, 1 / 2e9
    rows = [{"algo": "ring", "ranks": w, "bytes": n, "seconds": model.predict("ring", w, n, alpha, beta)}
            for w in (2, 4) for n in (4096, 2**20, 2**26)]
    a, b = model.fit(rows, "ring")
    assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(beta, rel=1e-6)


def test_ring_wins_large_tree_wins_small_in_the_model():
    alpha, beta = 5e-6, 1 / 25e9
    assert model.predict("tree", 64, 1024, alpha, beta) < model.predict("ring", 64, 1024, alpha, beta)
    assert model.predict("ring", 64, 2**28, alpha, beta) < model.predict("tree", 64, 2**28, alpha, beta)


def simulate_rounds(world: int, reduce_rounds, bcast_rounds):
    """What each rank holds (a set of contributions) after the rounds."""
    held = [frozenset([r]) for r in range(world)]
    for rnd in reduce_rounds:
        for src, dst in rnd:
            held[dst] = held[dst] | held[src]
    for rnd in bcast_rounds:
        for src, dst in rnd:
            held[dst] = held[src]
    return held


@pytest.mark.parametrize("world", range(1, 9))
def test_schedules_leave_the_sum_everywhere(world):
    final = viz.ring_states(world)[-1][0]
    assert all(len(cell) == world for row in final for cell in row)
    assert len(viz.ring_states(world)) == 2 * (world - 1) + 1
    for rounds in (viz.tree_rounds(world), viz.naive_rounds(world)):
        assert all(len(h) == world for h in simulate_rounds(world, *rounds))
    assert len(viz.tree_rounds(world)[0]) == (math.ceil(math.log2(world)) if world > 1 else 0)


def test_parse_size():
    assert bench.parse_size("4K") == 4096 and bench.parse_size("64MiB") == 64 * 2**20
    assert bench.parse_size("1000") == 1000
    with pytest.raises(ValueError, match="not a size"):
        bench.parse_size("lots")


def test_ratio_and_table_from_rows():
    res = bench.BenchResult(rows=[
        {"ranks": 2, "bytes": 16 * 2**20, "algo": a, "iters": 3, "seconds": s, "algbw": 0, "busbw": bw,
         "model_seconds": None}
        for a, s, bw in (("ring", 0.02, 0.8e9), ("gloo", 0.016, 1.0e9))])
    assert res.ratios() == [{"ranks": 2, "bytes": 16 * 2**20, "ratio": pytest.approx(0.8)}]
    assert "W=2   16 MiB: 0.80" in res.ratio_text() and "goal met" in res.ratio_text()
    assert "16 MiB ring" in res.table()


@pytest.mark.slow
def test_quick_benchmark_writes_table_ratio_and_csv(tmp_path):
    out = tmp_path / "ar.csv"
    proc = subprocess.run([sys.executable, "-m", "course_lib.cli", "bench", "allreduce", "--quick", "--quiet",
                           "--sizes", "4K", "16M", "--csv", str(out), "--plot", str(tmp_path / "ar.png")],
                          capture_output=True, text=True, timeout=400, cwd=ROOT)
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0
    assert re.search(r"W=2\s+16 MiB: \d+\.\d\d", proc.stdout), "the ring/gloo ratio line is missing"
    rows = list(csv.DictReader(out.open()))
    assert {r["algo"] for r in rows} == {"naive", "ring", "tree", "gloo"}
    assert all(float(r["busbw"]) > 0 and float(r["model_seconds"]) > 0 for r in rows)
    assert (tmp_path / "ar.png").stat().st_size > 0


@pytest.mark.slow
def test_benchmark_skips_a_ring_that_hangs(tmp_path):
    hangs = next(c for c in CASES if c.name == "ring_send_before_recv")
    path = hangs.write(ROOT / "solutions" / "05_allreduce" / "allreduce.py", ROOT / "tests" / "allreduce_faulty",
                       tmp_path)
    res = bench.run_allreduce(path, ranks=(2,), sizes=(4096,), algos=("ring", "gloo"), quick=True, echo=None,
                              sanity_timeout=5)
    assert "ring" in res.skipped and "hung" in res.skipped["ring"]
    assert {r["algo"] for r in res.rows} == {"gloo"}


def test_the_nccl_job_script_takes_its_port_from_the_job_id():
    """Notebook 03's lesson: a fixed MASTER_PORT (29500) clashes with a second job on the same node."""
    from course_lib.allreduce.nccl_experiment import job_script

    script = job_script()
    assert "export MASTER_PORT=$(( 10000 + SLURM_JOB_ID % 20000 ))" in script and "29500" not in script


def test_ddp_sends_the_course_cnn_in_two_buckets():
    """04's prediction charges a latency per bucket: DDP's defaults (1 MiB first, then 25 MiB) make two for the CNN,
    fc1's weight with fc2 in the first (closed once past 1 MiB), the convolutions in the second."""
    from course_lib.model import Net

    sizes = model.ddp_bucket_bytes(Net())
    assert sizes == [4724264, 75264] and sum(sizes) == 4 * sum(p.numel() for p in Net().parameters())
    assert len(model.ddp_bucket_bytes(Net(), bucket_cap_mb=0.01)) > 2
