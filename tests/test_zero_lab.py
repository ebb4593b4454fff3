"""Notebook 09's runs (course_lib.zero.demo via lab): gradient accumulation with no_sync counted, and DDP, ZeRO-1/2
(the reference solution) and FSDP2 side by side with the bytes per rank. Real gloo ranks, real DDP and FSDP2."""
import pytest
from conftest import live_processes

from course_lib.zero import lab

SOLUTION = "solutions/09_zero/zero.py"


@pytest.mark.slow
def test_no_sync_gives_the_large_batch_step_with_fewer_all_reduces(run_mark):
    rows = lab.accumulation(world=2, micro=4, batch=8)
    print(lab.accumulation_table(rows))
    large, quiet, loud = rows["large batch"], rows["no_sync"], rows["every micro-batch"]
    assert quiet["allreduces"] == large["allreduces"] >= 1
    assert loud["allreduces"] == 4 * large["allreduces"]
    assert quiet["diff"] < 1e-12 and loud["diff"] < 1e-12     # float64: the same step up to rounding
    assert not live_processes("course_lib.zero.demo", run_mark, environ=True)


@pytest.mark.slow
def test_zero_and_fsdp2_train_like_ddp_with_a_share_of_the_memory(root, run_mark):
    run = lab.sharded(root / SOLUTION, world=2, steps=3)
    print(lab.memory_table([run]))
    assert not run["errors"], run["errors"]
    diffs = lab.loss_differences(run)
    assert set(diffs) == {"ZeRO-1", "ZeRO-2", "FSDP2"} and max(diffs.values()) < 1e-5, diffs
    mem = {m: per_rank[0] for m, per_rank in run["memory"].items()}
    ddp = mem["DDP"]
    for method in ("ZeRO-1", "ZeRO-2", "FSDP2"):
        assert abs(mem[method]["state"] / ddp["state"] - 0.5) < 0.01, (method, mem)
    assert mem["ZeRO-2"]["grads"] < 0.51 * ddp["grads"] < mem["ZeRO-1"]["grads"]
    assert mem["FSDP2"]["params"] < 0.51 * ddp["params"] and mem["ZeRO-2"]["params"] == ddp["params"]
    # beyond p.grad and the state, the solution's ZeRO holds its shard's copy of the parameters: 1/W of them
    assert all(abs(mem[m]["other"] / ddp["params"] - 0.5) < 0.01 for m in ("ZeRO-1", "ZeRO-2")), mem
    assert not live_processes("course_lib.zero.demo", run_mark, environ=True)


@pytest.mark.slow
def test_the_side_by_side_shows_a_missing_divide_and_a_gradient_kept_elsewhere(root, tmp_path, run_mark):
    """SGD, not Adam (whose normalised step hides a gradient W times too large: 1e-6 from DDP's losses), and the
    memory of every tensor ZeRO keeps alive, not only p.grad (a full gradient in an attribute shows as "other")."""
    from zero_faulty.cases import CASES
    edits = [e for c in CASES if c.name in ("sums_not_averages", "stage2_grads_in_attribute") for e in c.edits]
    text = (root / SOLUTION).read_text()
    for old, new in edits:
        text = text.replace(old, new)
    (tmp_path / "zero.py").write_text(text)
    run = lab.sharded(tmp_path / "zero.py", world=2, steps=3)
    print(lab.memory_table([run]))
    diffs = lab.loss_differences(run)
    assert diffs["FSDP2"] < 1e-5 and min(diffs["ZeRO-1"], diffs["ZeRO-2"]) > 1e-2, diffs
    ddp = run["memory"]["DDP"][0]
    assert run["memory"]["ZeRO-2"][0]["other"] >= 0.5 * ddp["params"] + ddp["grads"] - 64, run["memory"]
    assert not live_processes("course_lib.zero.demo", run_mark, environ=True)
