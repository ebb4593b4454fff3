"""`course check pp`: the solution passes, the starter fails per function saying what to write, each faulty
submission is named with its mistake, and nothing is left running.

The faulty submissions are in tests/pp_faulty/cases.py (declared as tests/faulty.py describes). Every run is real:
gloo processes on 2 and 4 ranks, one pipeline stage each.

Each file is checked alone, not in one ``check_many`` launch as zero's and owndp's are: pp launches afresh after
every failure that may leave messages in flight (FRESH_AFTER_FAILURE), and check_many then checks every file of its
launch again, each alone.
"""
import pytest
from conftest import ROOT
from faulty import assert_every_case_applies, ids
from pp_faulty.cases import CASES, RIGHT

from course_lib.pp import cases as pp_check
from course_lib.pp import pipe as pp

SOLUTION = ROOT / "solutions" / "12_pipeline" / "pp.py"
EXERCISE = ROOT / "exercises" / "12_pipeline" / "pp.py"
FOLDER = ROOT / "tests" / "pp_faulty"


@pytest.mark.slow
def test_solution_passes_every_function():
    report = pp_check.check(str(SOLUTION))
    assert report.passed, report.text()
    assert [v.item for v in report.verdicts] == list(pp_check.ITEMS)
    assert "p=2, 4" in report.verdicts[-1].message, report.text()


@pytest.mark.slow
def test_starter_fails_every_function_saying_it_is_not_written():
    report = pp_check.check(str(EXERCISE), world_sizes=(2,))
    got = {v.item: v for v in report.verdicts}
    assert set(got) == set(pp_check.ITEMS), report.text()
    assert all(v.result == "fail" and "not written yet" in v.message for v in got.values()), report.text()
    assert "built on communicate, forward_step, backward_step: fix those first" in got["afab"].message
    # the stub's own words say what to write
    assert "dist.batch_isend_irecv" in got["communicate"].message, report.text()
    assert "warmup = min(pipe.stages - pipe.stage - 1, pipe.m)" in got["one_f_one_b"].message, report.text()


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_faulty_named_with_reason_and_nothing_survives(tmp_path, case):
    case.assert_checked(pp_check.check, SOLUTION, FOLDER, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("case", RIGHT, ids=ids(RIGHT))
def test_right_variant_passes(tmp_path, case):
    report = pp_check.check(str(case.write(SOLUTION, FOLDER, tmp_path)), **case.options)
    assert report.passed, f"{case.name}: {case.why}\n{report.text()}"


def test_every_case_applies():
    assert_every_case_applies(CASES + RIGHT, SOLUTION, FOLDER)


def test_reference_equals_the_sum_of_micro_batches():
    """The serial reference the checker compares with: the whole batch's gradient is the sum over micro-batches
    of each one's gradient of loss / m (what a pipeline accumulates), and its loss the mean of theirs."""
    import torch
    model = pp.make_model(4, 6)
    xs, ys = pp.make_batch(3, 2, 6)
    ref = pp.reference(model, 2, xs, ys)
    total = [torch.zeros_like(p) for p in model.parameters()]
    losses = []
    for x, y in zip(xs, ys):
        loss = pp.mse(model(x), y) / 3
        losses.append(float(loss.detach()))
        for t, g in zip(total, torch.autograd.grad(loss, list(model.parameters()))):
            t += g
    flat = [g for stage in ref.grads for g in stage]
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(flat, total))
    assert abs(sum(losses) - ref.loss) < 1e-12


def test_layers_split_evenly_in_order():
    assert [list(r) for r in pp.split_layers(5, 2)] == [[0, 1, 2], [3, 4]]
    assert [len(r) for r in pp.split_layers(8, 4)] == [2, 2, 2, 2]
