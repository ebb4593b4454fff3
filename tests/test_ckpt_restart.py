"""Notebook 08's experiment, the issue's test: rank 1 of a 2-rank DDP training is killed mid-epoch (SIGKILL), the
real `torchrun --max-restarts 1` restarts both ranks, they resume from the solution's snapshot, and the loss curve
equals an uninterrupted run's, step for step (course_lib.ckpt.curves.TOLERANCE; it comes out bit for bit here).
"""
import re

import pytest
from conftest import ROOT, live_processes

from course_lib.ckpt import curves, train
from course_lib.ckpt import resume as ckpt_check

SOLUTION = ROOT / "solutions" / "08_checkpoint" / "snapshot.py"


@pytest.mark.slow
def test_killed_rank_resumes_under_torchrun_and_the_curve_equals_the_uninterrupted_one(run_mark):
    reference = ckpt_check.reference_curve(timeout=240)
    run = curves.run(SOLUTION, epochs=3, every=3, kill_at=14, restarts=1, timeout=240)
    assert run.result.ok, run.result.summary() + "\n" + "\n".join(run.lines[-30:])
    assert run.result.returncode == 0
    first, second = run.attempts
    assert (first.number, second.number) == (0, 1)
    assert first.killed == (1, 14), "\n".join(run.lines[-30:])
    # the kill is real: torchrun's agent saw rank 1's process end by signal 9, not exit with an error of its own
    agent = [line for line in run.lines if line.startswith("[torchrun]")]
    assert any(re.search(r"local_rank: 1 .*failed \(exitcode: -9\)|exitcode *: -9", line) for line in agent), \
        "rank 1 did not die by SIGKILL; torchrun said:\n" + "\n".join(agent[-15:])
    assert first.snapshots[-1] == (2, 3) and second.resumed == (2, 3)      # after step 11 of 24
    assert sorted(second.losses) == list(range(12, 25))                     # steps 12, 13 done twice
    assert all(first.losses[s] == second.losses[s] for s in (12, 13))
    equal, message = curves.compare(reference, run.losses)
    assert equal, message
    print(f"\n[ckpt torchrun] {message}; {run.result.elapsed:.1f} s")
    assert not live_processes("course_lib.ckpt.train", run_mark, environ=True)


def test_skip_sampler_goes_on_where_the_epoch_stopped():
    from torch.utils.data.distributed import DistributedSampler
    sampler = DistributedSampler(range(40), num_replicas=2, rank=1, seed=1)
    sampler.set_epoch(2)
    whole = list(sampler)
    assert list(train.SkipSampler(sampler, 6)) == whole[6:] and len(train.SkipSampler(sampler, 6)) == 14


def test_compare_names_the_first_differing_step_and_missing_steps():
    ref = {1: 2.0, 2: 1.5, 3: 1.0}
    assert curves.compare(ref, dict(ref))[0]
    ok, msg = curves.compare(ref, {1: 2.0, 2: 1.5, 3: 1.1})
    assert not ok and "from step 3 on" in msg
    ok, msg = curves.compare(ref, {1: 2.0, 2: 1.5})
    assert not ok and "step 3 was never trained" in msg
