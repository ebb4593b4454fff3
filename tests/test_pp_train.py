"""dp=2 x pp=2 on 4 real gloo ranks, 1F1B, trains exactly as the serial run does (float64), with the stages where
Megatron's order tp-cp-dp-pp puts them; and the measurement's peaks are what AFAB and 1F1B hold."""
import pytest

from course_lib.pp import timeline, train
from course_lib.runs import launch

STEPS = 8


@pytest.mark.slow
def test_dp2_pp2_loss_curve_equals_serial_and_stages_sit_by_the_order(root):
    pp_file = str(root / "solutions" / "12_pipeline" / "pp.py")
    run = launch(["-m", "course_lib.pp.train", "--pp-file", pp_file, "--steps", str(STEPS)], nprocs=4, timeout=300,
                 on_line=None, warm=True)
    assert run.ok, run.summary()
    output = "\n".join(run.output(r) for r in range(4))
    assert "rank 1: stage 0 of pp group [1, 3], dp replica 1 of dp group [0, 1]" in output
    assert "rank 2: stage 1 of pp group [0, 2], dp replica 0 of dp group [2, 3]" in output
    losses = train.parse_losses(output)
    serial = train.train_serial(train.parse_args(["--steps", str(STEPS)]))
    assert len(losses) == len(serial) == STEPS and serial[-1] < serial[0]
    for step, (a, b) in enumerate(zip(losses, serial), 1):
        assert abs(a - b) < 1e-12, f"step {step}: dp x pp loss {a!r} != serial {b!r}"


@pytest.mark.slow
def test_measured_peaks_are_afabs_m_and_1f1bs_p_minus_stage(root):
    pp_file = str(root / "solutions" / "12_pipeline" / "pp.py")
    run = launch(["-m", "course_lib.pp.measure", "--pp-file", pp_file, "--m", "2,6", "--forward-ms", "2",
                  "--backward-ms", "4"], nprocs=4, timeout=300, on_line=None, warm=True)
    assert run.ok, run.summary()
    steps = timeline.parse([run.output(r) for r in range(4)])
    assert [r["peaks"] for r in timeline.table(steps, "afab", 4)] == [[2] * 4, [6] * 4]
    assert [r["peaks"] for r in timeline.table(steps, "one_f_one_b", 4)] == [[2, 2, 2, 1], [4, 3, 2, 1]]
