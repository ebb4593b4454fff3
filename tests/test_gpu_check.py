"""The GPU self-check (``make gpu-check``): on this CPU machine every item is NOT POSSIBLE HERE, with a reason,
and the command exits 0 with a valid report; the item logic is tested with made-up machines (a fake Probe)
and made-up outputs; the TP worker runs for real on CPU over gloo (its GPU path is the same code on NCCL)."""
import json
import shutil
import subprocess
import sys
import time

import pytest
from conftest import ROOT, live_processes

from course_lib.selftest import gpu, report
from course_lib.selftest.items import BY_NAME, ITEMS, Item
from course_lib.selftest.monitor import monitor_block, parse_dmon, summarize
from course_lib.selftest.probe import Probe
from course_lib.selftest.runs import FAIL, NOT_POSSIBLE, PASS, Outcome
from course_lib.selftest.train import EPOCHS, judge_epochs


def machine(gpus=1, **kw) -> Probe:
    base = dict(torch="2.11.0+cu130", cuda=gpus > 0, cuda_version="13.0", gpus=gpus, names=["H100"] * gpus,
                bf16=True, nccl=True, nccl_version="2.27.7", nvidia_smi="/usr/bin/nvidia-smi")
    return Probe(**{**base, **kw})


def not_possible(probe: Probe) -> dict:
    return {i.name: i.needs(probe) for i in ITEMS if i.needs(probe)}


# ------------------------------------------------------------------------------------------- on this machine
@pytest.mark.slow
def test_make_gpu_check_on_cpu_reports_every_item_not_possible(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: the items would run (docs/gpu-check.md)")
    if not shutil.which("make"):
        pytest.skip("no make on PATH")
    out = tmp_path / "report"
    p = subprocess.run(["make", "-s", "gpu-check", f"GPU_CHECK_PYTHON={sys.executable}",
                        f"GPU_CHECK_ARGS=--out {out}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads((out / "report.json").read_text())
    assert [r["name"] for r in data["items"]] == [i.name for i in ITEMS]
    assert all(r["status"] == NOT_POSSIBLE and "no CUDA GPU" in r["detail"] for r in data["items"]), data["items"]
    assert data["ok"] and data["counts"] == {PASS: 0, FAIL: 0, NOT_POSSIBLE: len(ITEMS)}
    assert data["probe"]["cuda"] is False and data["probe"]["torch"] == torch.__version__
    md = (out / "report.md").read_text()
    assert f"**0 PASS, 0 FAIL, {len(ITEMS)} NOT POSSIBLE HERE**" in md
    assert all(f"| {i.name} | {NOT_POSSIBLE} |" in md for i in ITEMS)
    assert f"0 PASS, 0 FAIL, {len(ITEMS)} NOT POSSIBLE HERE" in p.stdout


def test_bad_input_is_one_clear_message(capsys):
    from course_lib.cli import main

    assert main(["selftest"]) == 2
    assert "--gpu" in capsys.readouterr().err
    assert main(["selftest", "--gpu", "--only", "serial-fp32,nope"]) == 2
    err = capsys.readouterr().err
    assert "no such item: nope" in err and "ddp-nccl" in err
    assert main(["selftest", "--list", "--only", "tp-nccl,serial-fp32"]) == 0
    assert capsys.readouterr().out.split()[0] == "serial-fp32"   # run order, not the order asked


# ------------------------------------------------------------------------------------------- needs
def test_a_cpu_machine_can_run_nothing_and_says_why():
    reasons = not_possible(machine(0))
    assert set(reasons) == set(BY_NAME)
    assert all("no CUDA GPU" in why for why in reasons.values())
    assert set(not_possible(Probe())) == set(BY_NAME)    # torch missing altogether
    assert "torch does not import" in BY_NAME["serial-fp32"].needs(Probe())


def test_one_gpu_runs_all_but_the_multi_gpu_items():
    reasons = not_possible(machine(1))
    assert set(reasons) == {"check-ddp-gpu", "nccl-algo", "tp-nccl"}
    assert all(why.startswith("1 GPU(s) here; this needs 2") for why in reasons.values())
    assert not_possible(machine(2)) == {}
    assert not_possible(machine(8)) == {}


def test_missing_bf16_nvidia_smi_or_nccl_is_named():
    assert not_possible(machine(1, bf16=False)).get("serial-bf16", "").startswith("this GPU has no bf16")
    assert "nvidia-smi is not on PATH" in not_possible(machine(2, nvidia_smi=""))["job-monitor"]
    no_nccl = not_possible(machine(2, nccl=False))
    assert {"ddp-nccl", "allreduce-nccl", "nccl-algo", "tp-nccl", "check-ddp-gpu"} <= set(no_nccl)
    assert "serial-fp32" not in no_nccl


# ------------------------------------------------------------------------------------------- running items
def test_an_item_that_raises_is_a_fail_and_the_rest_still_run(tmp_path):
    def broken(ctx):
        raise RuntimeError("CUDA error: no kernel image is available")

    items = [Item("broken", "raises", lambda p: "", broken),
             Item("fine", "passes", lambda p: "", lambda ctx: Outcome(PASS, "ok", {"images_per_s": 1.5})),
             Item("absent", "cannot", lambda p: "no Slurm here", broken)]
    assert gpu.check(items, tmp_path) == 1
    data = json.loads((tmp_path / "report.json").read_text())
    status = {r["name"]: (r["status"], r["detail"]) for r in data["items"]}
    assert status["broken"][0] == FAIL and "RuntimeError: CUDA error: no kernel image" in status["broken"][1]
    assert status["fine"] == (PASS, "ok") and status["absent"] == (NOT_POSSIBLE, "no Slurm here")
    md = (tmp_path / "report.md").read_text()
    assert "## Failures" in md and "### broken" in md and "images_per_s = 1.5" in md


def test_an_item_leaves_no_process_behind(tmp_path):
    marker = f"selftest-leftover-{time.monotonic_ns()}"

    def leaves_a_child(ctx):
        subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(300)", marker])
        return Outcome(PASS, "started a child and forgot it")

    r = gpu.run_item(Item("leaky", "leaks", lambda p: "", leaves_a_child), machine(1), tmp_path)
    assert r["status"] == PASS
    deadline = time.monotonic() + 30
    while live_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not live_processes(marker)


def test_markdown_report_escapes_table_cells():
    data = report.as_json({}, [{"name": "x", "what": "a | b", "status": FAIL, "detail": "line one\nline two",
                                "figures": {}, "seconds": 1.0}], "now", 2.0)
    md = report.as_markdown(data, "machine")
    assert "| x | FAIL | 1 | a \\| b | line one |" in md
    assert "line one\nline two" in md   # the whole error under Failures
    assert not data["ok"]


# ------------------------------------------------------------------------------------------- judging outputs
def epochs_text(device="cuda", acc=0.9, n=EPOCHS):
    lines = [f"device={device} dataset=digits train=1437 test=360"]
    lines += [f"epoch={e} train_loss=0.5 test_loss=0.3 test_acc={acc} images_per_s={1000 * e}.0 "
              f"images_per_s_rank={1000 * e}.0 epoch_s=1.0" for e in range(1, n + 1)]
    return "\n".join(lines)


def test_training_output_is_judged():
    assert judge_epochs(epochs_text(), ["cuda"], "cuda") is None
    assert "not on cuda" in judge_epochs(epochs_text("cpu"), ["cpu"], "cuda").detail
    assert "no device line" in judge_epochs("", [], "cuda").detail
    assert f"2 epoch lines, {EPOCHS} expected" in judge_epochs(epochs_text(n=2), ["cuda"], "cuda").detail
    assert "test accuracy 0.1" in judge_epochs(epochs_text(acc=0.1), ["cuda"], "cuda").detail


def test_the_serial_item_fails_when_the_script_trains_on_cpu(tmp_path, monkeypatch):
    from course_lib.selftest import train
    from course_lib.selftest.runs import Context, Ran

    monkeypatch.setattr(train, "run_command", lambda *a, **k: Ran(0, 1.0, epochs_text("cpu")))
    out = train.serial([])(Context(machine(1), tmp_path, 10))
    assert out.status == FAIL and "not on cuda" in out.detail
    monkeypatch.setattr(train, "run_command", lambda *a, **k: Ran(0, 1.0, epochs_text("cuda")))
    out = train.serial([])(Context(machine(1), tmp_path, 10))
    assert out.status == PASS and out.figures["images_per_s"] == 1000.0 * EPOCHS
    monkeypatch.setattr(train, "run_command", lambda *a, **k: Ran(None, 10.0, "Train Epoch: 1"))
    out = train.serial([])(Context(machine(1), tmp_path, 10))
    assert out.status == FAIL and "deadline of 10 s reached" in out.detail


DMON = """\
# gpu     sm    mem    enc    dec    jpg    ofa     fb   bar1   ccpm
# Idx      %      %      %      %      %      %     MB     MB     MB
    0      0      0      0      0      0      0    512      2      0
    0     87     35      0      0      -      -   2310      5      0
nvidia-smi: some warning
# gpu     sm    mem    enc    dec    jpg    ofa     fb   bar1   ccpm
# Idx      %      %      %      %      %      %     MB     MB     MB
    0     64     20      0      0      -      -   2310      5      0
"""


def test_dmon_log_is_parsed():
    rows = parse_dmon(DMON)
    assert len(rows) == 3 and rows[1]["sm"] == 87.0 and rows[1]["jpg"] is None
    assert summarize(rows) == {"dmon_samples": 3, "peak_sm_pct": 87.0, "peak_fb_mb": 2310.0}
    assert parse_dmon("Failed to initialize NVML: Driver/library version mismatch\n") == []


def test_the_templates_monitoring_block_is_found():
    from course_lib import jobs

    def rendered(monitor):
        spec = jobs.JobSpec(name="g", script="train.py", gpus_per_node=1, monitor=monitor)
        return jobs.script(spec, site="generic", engine_name="local")

    block = monitor_block(rendered(True))
    assert block.startswith('MONITOR_PIDS=""') and "nvidia-smi dmon" in block
    assert block.rstrip().splitlines()[-1].startswith("trap ")
    assert monitor_block(rendered(False)) == ""


# ------------------------------------------------------------------------------------------- the TP worker
@pytest.mark.slow
@pytest.mark.parametrize("broken", [False, True], ids=["solution", "no-g-reduction"])
def test_tp_worker_compares_the_solution_with_the_serial_mlp(tmp_path, broken):
    from course_lib.core.launch import launch

    tp = ROOT / "solutions" / "06_tensor_parallel" / "tp.py"
    if broken:   # a TP file whose row-parallel layer forgets g: each rank keeps its partial sum
        text = tp.read_text().replace("y = reduce_from_parallel_region(partial, self.group)", "y = partial")
        assert "y = partial" in text
        tp = tmp_path / "tp.py"
        tp.write_text(text)
    res = launch(["-m", "course_lib.selftest.tp_nccl", str(tp)], nprocs=2, timeout=240, on_line=None,
                 env={"COURSE_SELFTEST_CPU": "1", "PYTHONPATH": str(ROOT)})
    line = next((x for x in res.output(0).splitlines() if x.startswith("tp_gloo ")), "")
    if broken:
        assert "WRONG" in line and res.ranks[0].returncode == 1, res.summary()
    else:
        assert res.ok and "tp_gloo ok ranks=2" in line, res.summary()


FAKE_DMON = """#!/bin/bash
# stands in for `nvidia-smi dmon -s um -d 5`: the header, then one sample a second until killed
echo "# gpu     sm    mem    enc    dec    jpg    ofa     fb   bar1   ccpm"
echo "# Idx      %      %      %      %      %      %     MB     MB     MB"
while true; do echo "    0     42      3      0      0      -      -    512      2      0"; sleep 1; done
"""


def test_the_templates_monitoring_lines_run_and_stop_by_their_trap(tmp_path, monkeypatch):
    """The block the template writes, run in bash as a job script runs it, with a stand-in nvidia-smi: it
    writes <job name>-<job id>.gpu.log, and the trap stops dmon when the script ends."""
    from course_lib import jobs
    from course_lib.selftest import jobnb

    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(FAKE_DMON)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{__import__('os').environ['PATH']}")
    spec = jobs.JobSpec(name="g", script="train.py", gpus_per_node=1, monitor=True)
    block = monitor_block(jobs.script(spec, site="generic", engine_name="local"))
    work = tmp_path / "work"
    work.mkdir()
    mon = jobnb._start_monitor(block, work, "77")
    log = work / f"{jobnb.JOB_NAME}-77.gpu.log"
    deadline = time.monotonic() + 60
    while len(parse_dmon(log.read_text() if log.exists() else "")) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert jobnb._stop_monitor(mon, work), "the monitoring block did not end when told to"
    assert summarize(parse_dmon(log.read_text()))["peak_sm_pct"] == 42.0
    assert not live_processes(str(fake))


def test_the_wheel_list_is_pinned_once_each_and_the_script_parses():
    lines = [x.strip() for x in (ROOT / "scripts" / "gpu-wheels.txt").read_text().splitlines()]
    reqs = [x for x in lines if x and not x.startswith("#")]
    names = [x.split("==")[0].lower() for x in reqs]
    assert all(x.count("==") == 1 for x in reqs), [x for x in reqs if x.count("==") != 1]
    assert len(set(names)) == len(names), "a package listed twice: two versions stop the whole install"
    assert {"papermill", "nbclient", "nbformat", "ipykernel", "jupyter-client", "pyzmq"} <= set(names)
    assert not {"torch", "numpy", "matplotlib", "jinja2", "scikit-learn"} & set(names), "the GPU machine has these"
    p = subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu-wheels.sh")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
