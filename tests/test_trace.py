"""The profiler view (course_lib/trace): one traced DDP step on real gloo ranks, read back from Chrome traces.

What the tests hold to is DDP's design (torch/nn/parallel/distributed.py, reducer.cpp), not timings: a bucket's
all-reduce is launched from the autograd hook of its last gradient, so with one bucket (bucket_cap_mb=25, given, holds
the whole 1.2 M-parameter CNN, 4.8 MB) it waits for the end of backward; DDP's default caps the first bucket at
1 MiB (_BucketConfig in torch/nn/parallel/distributed.py), so the first all-reduce starts while backward still
computes.
"""
import json
import textwrap

import pytest

from course_lib.runtime.launch import launch
from course_lib.trace import run, timeline
from course_lib.trace.timeline import Timeline


def test_overlap_and_exposed_time_of_made_up_intervals():
    tl = Timeline(0, {"forward": (0, 10), "backward": (10, 30), "optimizer": (30, 31)},
                  compute=[(10, 15), (14, 20), (22, 26)], allreduce=[(18, 24), (25, 29)])
    assert tl.allreduce_ms == 10
    assert tl.overlap == pytest.approx((2 + 2 + 1) / 10)     # 18-20, 22-24, 25-26
    assert tl.exposed_ms == 3                                 # 26-29
    assert tl.step_ms == 31
    assert Timeline(1, compute=[(0, 5)]).overlap == 0.0


def test_a_trace_that_is_not_a_course_step_is_named(tmp_path):
    path = tmp_path / "trace-rank0.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 0, "dur": 5, "tid": 1}]}))
    with pytest.raises(ValueError, match="no forward, backward, optimizer event"):
        timeline.from_chrome_trace(path)


@pytest.mark.slow
def test_one_bucket_waits_for_backward_and_the_default_first_bucket_overlaps_it(tmp_path):
    # both settings in one launch of the ranks (profile_steps), each with its own model and DDP wrapper
    by_cap = run.profile_steps(2, [25, None], outs={25: tmp_path / "cap25", None: tmp_path / "default"})
    whole, small = by_cap[25], by_cap[None]
    assert (tmp_path / "cap25" / "trace-rank1.json").is_file() and (tmp_path / "default" / "trace-rank0.json").is_file()
    report = "bucket_cap_mb=25:\n" + run.summary(whole) + "\nDDP's default:\n" + run.summary(small)
    print("\n" + report)
    for tl in whole:
        assert len(tl.allreduce) == 1, report
        # launched from the hook of the last gradient: after the last backward computation began
        assert tl.allreduce[0][0] >= max(a for a, _ in tl.compute), report
    for tl in small:
        assert len(tl.allreduce) >= 2, report
        assert min(a for a, _ in tl.allreduce) < max(b for _, b in tl.compute), report   # starts during backward
        assert tl.overlap > 0, report


SAME_AS_DEFAULT = textwrap.dedent("""
    import torch, torch.distributed as dist, torch.nn.functional as F
    from course_lib.core.rankkit import rank_env
    from course_lib.model import Net
    from course_lib.trace.step import average_keeping_work
    env = rank_env()
    dist.init_process_group("gloo", rank=env.rank, world_size=env.world_size)
    grads, works = [], []
    for hooked in (False, True):
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(Net(), bucket_cap_mb=1)
        if hooked:
            model.register_comm_hook(works, average_keeping_work)
        torch.manual_seed(1 + env.rank)          # each rank its own batches: the average is not a copy
        for _ in range(2):                        # DDP rebuilds its buckets after the first backward
            F.nll_loss(model(torch.randn(8, 1, 28, 28)), torch.randint(0, 10, (8,))).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for work in works:
        work.wait()
    same = all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(*grads))
    print(f"works {len(works)} same {same}", flush=True)
    del model, works    # a DDP model goes before its process group (notebook 02's Step 6)
    dist.destroy_process_group()
""")


@pytest.mark.slow
def test_the_traced_steps_hook_averages_as_ddps_default_and_keeps_each_work(tmp_path):
    # the hook (trace/step.py) keeps the Work of each bucket's all-reduce so the profiler can wait for them; the
    # gradients it gives must be DDP's own (two backward passes, each at least one bucket, so at least two Works)
    script = tmp_path / "same_as_default.py"
    script.write_text(SAME_AS_DEFAULT)
    res = launch([str(script)], nprocs=2, timeout=120, on_line=None, cwd=tmp_path)
    assert res.ok, res.summary()
    for r in range(2):
        line = next((x for x in res.ranks[r].lines if x.startswith("works ")), "")
        assert line.endswith("same True") and int(line.split()[1]) >= 2, res.summary()


@pytest.mark.slow
def test_the_serial_step_has_phases_and_no_all_reduce(tmp_path):
    (tl,) = run.profile_step(1, out=tmp_path)
    assert not tl.allreduce and tl.compute
    a, b = tl.phases["backward"]
    assert 0 < a < b <= tl.step_ms
    assert (tmp_path / "trace-rank0.json").stat().st_size > 1000


def test_the_legend_names_an_all_reduce_only_where_one_is_drawn():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = {"forward": (0, 10), "backward": (10, 30), "optimizer": (30, 31)}
    serial = Timeline(0, phases, compute=[(12, 28)])
    ddp = Timeline(0, phases, compute=[(12, 28)], allreduce=[(20, 33)])
    for tl, wanted in ((serial, False), (ddp, True)):
        ax = timeline.plot([tl])
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        plt.close(ax.figure)
        assert ("all-reduce" in labels) == wanted, labels
        assert "backward compute" in labels
