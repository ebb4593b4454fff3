"""The one-GPU items of the GPU self-check (issue 54): NCCL with one rank is chosen on one GPU and says what one
GPU cannot show; its worker's logic runs on CPU (gloo) as one real rank."""
from __future__ import annotations

from course_lib.selftest.comm import ONE_RANK, nccl_one_rank
from course_lib.selftest.items import BY_NAME
from course_lib.selftest.probe import Probe
from course_lib.selftest.runs import PASS, Context


def machine(gpus=1, **kw) -> Probe:
    base = dict(torch="2.11.0+cu130", cuda=gpus > 0, cuda_version="13.0", gpus=gpus, names=["H100"] * gpus,
                bf16=True, nccl=True, nccl_version="2.27.7", nvidia_smi="/usr/bin/nvidia-smi")
    return Probe(**{**base, **kw})


def test_one_gpu_chooses_the_one_rank_nccl_items_and_labels_them():
    for name in ("nccl-1rank", "ddp-nccl"):
        assert BY_NAME[name].needs(machine(1)) == "", name
        assert "no traffic between GPUs" in BY_NAME[name].what, name
        assert BY_NAME[name].needs(machine(0)).startswith("no CUDA GPU")
    assert BY_NAME["allreduce-nccl"].needs(machine(1)).startswith("1 GPU(s) here; this needs 2")


def test_the_one_rank_nccl_worker_runs_as_one_rank(tmp_path, monkeypatch):
    """The worker's logic, gloo on CPU (COURSE_SELFTEST_CPU=1), launched as the item launches it."""
    monkeypatch.setenv("COURSE_SELFTEST_CPU", "1")
    out = nccl_one_rank(Context(machine(1), tmp_path / "nccl-1rank", 120))
    assert out.status == PASS, out.detail
    assert "backend=gloo ranks=1 device=cpu" in out.detail and "allreduce=1 (want 1)" in out.detail
    assert ONE_RANK in out.detail and out.figures == {"ranks": 1}
    assert "nccl_one ok" in (tmp_path / "nccl-1rank" / "ranks.log").read_text()


def test_without_nccl_the_one_rank_items_say_so():
    assert BY_NAME["nccl-1rank"].needs(machine(1, nccl=False)) == "this torch has no NCCL"
