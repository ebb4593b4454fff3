"""dp=2 x cp=2 on 4 real gloo ranks trains the attention model exactly as one process does, and notebook 11's
measurements (saved bytes, payload per step) equal their formulas, on real ranks."""
import pytest

from course_lib.cp import lab
from course_lib.cp.train import parse_args, parse_output, train_serial
from course_lib.runtime.launch import launch

STEPS = 8


@pytest.mark.slow
def test_dp2_cp2_loss_curve_equals_serial(root):
    cp_file = str(root / "solutions" / "11_context_parallel" / "cp.py")
    run = launch(["-m", "course_lib.cp.train", "--cp-file", cp_file, "--cp", "2", "--dp", "2", "--steps", str(STEPS)],
                 nprocs=4, timeout=300, on_line=None, warm=True)
    assert run.ok, run.summary()
    losses = parse_output(run.output(0).splitlines())
    serial = train_serial(parse_args(["--serial", "--steps", str(STEPS)]))
    assert len(losses) == len(serial) == STEPS
    assert serial[-1] < 0.8 * serial[0], "the serial run should learn something in a few steps"
    for step, (a, b) in enumerate(zip(losses, serial), 1):
        assert abs(a - b) < 1e-10, f"step {step}: dp x cp loss {a!r} != serial {b!r}"


@pytest.mark.slow
def test_starter_training_stops_with_the_message(root):
    cp_file = str(root / "exercises" / "11_context_parallel" / "cp.py")
    run = launch(["-m", "course_lib.cp.train", "--cp-file", cp_file, "--steps", "2"], nprocs=4, timeout=300,
                 on_line=None, warm=True)
    assert not run.ok and not run.timed_out, run.summary()
    assert "NotImplementedError" in run.output()


@pytest.mark.slow
def test_measured_memory_and_bytes_equal_the_formulas():
    run = launch(["-m", "course_lib.cp.lab", "--seq-lens", "32,64"], nprocs=4, timeout=300, on_line=None, warm=True)
    assert run.ok, run.summary()
    rows = lab.parse_output(run.output(0).splitlines())
    assert sorted({(r["cp"], r["seq_len"]) for r in rows}) == [(c, s) for c in (1, 2, 4) for s in (32, 64)]
    assert len(rows) == 2 * (1 + 2 + 4)          # every rank of every cp group
    for r in rows:
        assert r["saved"] == sum(r["formula_memory"].values()), r
        assert r["payload"] == r["formula_bytes"], r
    # the per-token part falls as 1/cp; the gathered K and V do not fall at all
    one, four = (lab.formula_memory(64, c) for c in (1, 4))
    assert four["tokens"] * 4 == one["tokens"] and four["gathered"] == one["gathered"]


def test_causal_work_plain_and_balanced():
    assert lab.causal_pairs(1024, 4, balanced=False) == [32896, 98432, 163968, 229504]
    assert set(lab.causal_pairs(1024, 4, balanced=True)) == {131200}
