"""dp=2 x tp=2 on 4 real gloo ranks trains the MLP exactly as the serial run does (float64)."""
import pytest

from course_lib.runtime.launch import launch
from course_lib.tp.train import parse_args, parse_output, train_serial

STEPS = 15


@pytest.mark.slow
def test_dp2_tp2_loss_curve_equals_serial(root):
    tp_file = str(root / "solutions" / "06_tensor_parallel" / "tp.py")
    run = launch(["-m", "course_lib.tp.train", "--tp-file", tp_file, "--tp", "2", "--dp", "2", "--steps", str(STEPS)],
                 nprocs=4, timeout=300, on_line=None, warm=True)   # forked after one import of torch, not four
    assert run.ok, run.summary()
    losses, memory = parse_output(run.output(0).splitlines())
    serial = train_serial(parse_args(["--serial", "--steps", str(STEPS)]))
    assert len(losses) == len(serial) == STEPS
    assert serial[-1] < serial[0] - 0.5, "the serial run should learn something in a few steps"
    for step, (a, b) in enumerate(zip(losses, serial), 1):
        assert abs(a - b) < 1e-10, f"step {step}: dp x tp loss {a!r} != serial {b!r}"
    # fc1 (784 -> 128) and fc2's weight are split over tp=2; fc2's bias (10) is whole on every rank
    h = 128
    assert memory["serial_params"] == 784 * h + h + h * 10 + 10
    assert memory["params_per_rank"] == (784 * h + h + h * 10) // 2 + 10
    assert memory["bytes_per_rank"] == 8 * memory["params_per_rank"]   # float64


@pytest.mark.slow
def test_starter_training_stops_with_the_message(root):
    tp_file = str(root / "exercises" / "06_tensor_parallel" / "tp.py")
    run = launch(["-m", "course_lib.tp.train", "--tp-file", tp_file, "--steps", "2"], nprocs=4, timeout=300,
                 on_line=None, warm=True)
    assert not run.ok and not run.timed_out, run.summary()
    assert "NotImplementedError" in run.output()
