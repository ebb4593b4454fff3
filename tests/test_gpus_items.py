"""The one-GPU items of the GPU self-check (issue 54): NCCL with one rank is chosen on one GPU and says what one
GPU cannot show; its worker's logic runs on CPU (gloo) as one real rank."""
from __future__ import annotations

import time

from course_lib.selftest.comm import ONE_RANK, nccl_one_rank
from course_lib.selftest.items import BY_NAME
from course_lib.selftest.probe import Probe
from course_lib.selftest.runs import FAIL, NOT_POSSIBLE, NOT_RUN, PASS, Context, Outcome


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


# ------------------------------------------------------------------------------------------- on a GPU machine
def test_on_a_gpu_machine_an_item_one_gpu_can_run_is_a_fail_when_not_possible(tmp_path):
    from course_lib.selftest.gpu import run_item

    r = run_item(BY_NAME["serial-bf16"], machine(1, bf16=False), tmp_path)
    assert r["status"] == FAIL and "not possible on this machine with 1 GPU(s): this GPU has no bf16" in r["detail"]
    assert run_item(BY_NAME["job-monitor"], machine(1, nvidia_smi=""), tmp_path)["status"] == FAIL
    assert run_item(BY_NAME["allreduce-nccl"], machine(1), tmp_path)["status"] == NOT_POSSIBLE   # needs 2 GPUs
    assert run_item(BY_NAME["serial-bf16"], machine(0), tmp_path)["status"] == NOT_POSSIBLE     # no GPU here


def test_a_gpu_machine_with_an_item_not_possible_exits_non_zero(tmp_path, monkeypatch):
    from course_lib.selftest import gpu
    from course_lib.selftest.items import Item, nvidia_smi

    monkeypatch.setattr("course_lib.selftest.gpu.probe_within", lambda: machine(1, nvidia_smi=""))
    passes = Item("passes", "passes", lambda p: "", lambda ctx: Outcome(PASS, "ok"))
    smi = Item("smi", "needs nvidia-smi", nvidia_smi, lambda ctx: Outcome(PASS, "ok"))
    assert gpu.check([passes], tmp_path / "a") == 0
    assert gpu.check([passes, smi], tmp_path / "b") == 1
    monkeypatch.setattr("course_lib.selftest.gpu.probe_within", lambda: machine(0, nvidia_smi=""))
    assert gpu.check([passes, smi], tmp_path / "c") == 0      # no GPU: NOT POSSIBLE HERE, as before


# ------------------------------------------------------------------------------------------- the budget
def _runs_to_its_deadline(ctx):
    time.sleep(ctx.timeout)
    return Outcome(FAIL, f"deadline of {ctx.timeout:.0f} s reached (killed)")


def test_a_budget_cut_is_not_run_and_a_deadline_of_its_own_is_a_fail(tmp_path):
    from course_lib.selftest.gpu import run_item
    from course_lib.selftest.items import Item

    slow = Item("slow", "runs to its deadline", lambda p: "", _runs_to_its_deadline, timeout=300, estimate=1)
    r = run_item(slow, machine(1), tmp_path, left=1.5)
    assert r["status"] == NOT_RUN and "budget: stopped at its deadline of 2 s, cut by --budget from 300 s" in \
        r["detail"], r
    own = Item("own", "runs to its deadline", lambda p: "", _runs_to_its_deadline, timeout=1.5, estimate=1)
    assert run_item(own, machine(1), tmp_path, left=100)["status"] == FAIL
    assert run_item(own, machine(1), tmp_path)["status"] == FAIL


def test_an_item_that_needs_more_than_the_budget_left_is_not_started(tmp_path):
    """job-monitor with 40 s left: its job needs about 30 s and the monitor 30 s more; it was cancelled and FAILed."""
    from course_lib.selftest.gpu import run_item

    start = time.monotonic()
    r = run_item(BY_NAME["job-monitor"], machine(1), tmp_path, left=40)
    assert r["status"] == NOT_RUN and "a deadline of at least 60 s, 40 s left" in r["detail"], r
    assert time.monotonic() - start < 1 and not (tmp_path / "job-monitor").exists()


# ------------------------------------------------------------------------------------------- AMP and compile engaged
def test_autocast_and_compile_must_show_they_engaged():
    """bf16 runs for real on CPU (autocast on CPU takes bf16): its Linear computes in bfloat16; a line where
    autocast left fp32, or where compile made no graph, is a FAIL."""
    import torch

    from course_lib.selftest import speed

    x, y = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
    lines = [speed._one(v, x, y, torch.device("cpu"), 16, warmup=1) for v in ("fp32-strict", "bf16")]
    assert "out_dtype=float32 graphs=0" in lines[0] and "out_dtype=bfloat16 graphs=0" in lines[1], lines
    out = speed.judge("\n".join(lines), "cpu", ("fp32-strict", "bf16"))
    assert out.status == PASS and "bf16 autocast computed in bfloat16" in out.detail, out.detail
    eager = lines[1].replace("out_dtype=bfloat16", "out_dtype=float32")
    assert "autocast did not do what the variant says: bf16 computed in float32" in \
        speed.judge("\n".join([lines[0], eager]), "cpu", ("fp32-strict", "bf16")).detail
    compiled = lines[0].replace("variant=fp32-strict", "variant=compile")
    assert "torch.compile made no graph" in speed.judge("\n".join([lines[0], compiled]), "cpu",
                                                        ("fp32-strict", "compile")).detail
    made = compiled.replace("graphs=0", "graphs=2")
    judged = speed.judge("\n".join([lines[0], made]), "cpu", ("fp32-strict", "compile"))
    assert judged.status == PASS and judged.figures["compile_graphs"] == 2, judged.detail


def test_the_probe_has_a_deadline(monkeypatch):
    """A driver that hangs on the first CUDA call must not hang the check: the probe answers within its deadline."""
    from course_lib.selftest import probe

    monkeypatch.setattr(probe, "probe", lambda: time.sleep(30))
    start = time.monotonic()
    hung = probe.probe_within(0.5)
    assert time.monotonic() - start < 5
    assert hung.torch == "" and "no answer from torch (import torch, torch.cuda) within 0.5 s" in hung.error
    assert BY_NAME["serial-fp32"].needs(hung) == hung.error and hung.summary() == hung.error
    monkeypatch.setattr(probe, "probe", lambda: 1 / 0)
    assert probe.probe_within(5).error == "probe failed: ZeroDivisionError: division by zero"


# ------------------------------------------------------------------------------------------- busbw against the link
NVLINK = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)
\t Link 0: 26.562 GB/s
\t Link 1: 26.562 GB/s
\t Link 2: <inactive>
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1)
\t Link 0: 26.562 GB/s
"""


def test_busbw_is_held_against_the_links_limit():
    from course_lib.selftest.comm import against, nvlink_gbps, pcie_gbps

    assert nvlink_gbps(NVLINK) == 53.1 and nvlink_gbps("") == 0
    assert pcie_gbps("5, 16\n") == 63.0 and pcie_gbps("4, 16") == 31.5 and pcie_gbps("[N/A], 16") == 0
    rows = {"1 MiB": (30.0, 10.0), "256 MiB": (900.0, 42.5)}
    figures = {}
    assert against(rows, 53.1, "NVLink, 53 GB/s per direction", figures) == \
        "256 MiB: 80 % of the link (NVLink, 53 GB/s per direction)"
    assert figures == {"link_limit_GBps": 53.1, "busbw_of_link_pct": 80.0}
    assert against(rows, 0.0, "the link's limit is unknown", {}) == "the link's limit is unknown"


def test_a_monitor_left_as_a_zombie_counts_as_stopped():
    """A VM whose PID 1 does not reap: the trap's killed dmon stays a zombie; it is not a monitor still running
    (jobnb._stop_monitor asks runtime.proc.wait_gone about the monitor's processes)."""
    import subprocess

    import psutil

    from course_lib.runtime.proc import wait_gone

    quick = subprocess.Popen(["true"], start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _status(quick.pid) != "zombie":
        time.sleep(0.05)
    try:
        assert _status(quick.pid) == "zombie" and not wait_gone([psutil.Process(quick.pid)], 0)
    finally:
        quick.wait()
    alive = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert wait_gone([psutil.Process(alive.pid)], 0) == [alive.pid]
    finally:
        alive.kill()
        alive.wait()


def _status(pid: int) -> str:
    import psutil

    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"
