"""The serial baseline script: trains, prints parseable lines, saves a loadable checkpoint, fails clearly."""
import importlib.util
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

from course_lib.metrics import parse_epoch_lines
from course_lib.model import Net

SCRIPT = ROOT / "solutions" / "01_serial" / "mnist_classify.py"
# Measured on this machine kind (torch 2.13 CPU, digits, 1 epoch, batch 64): test_acc 0.783, 0.788, 0.791
# for seeds 1, 2, 3. Pinned with margin; a broken training loop stays near 0.1.
MIN_ACC_1_EPOCH = 0.70


def run(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def load_script_module():
    spec = importlib.util.spec_from_file_location("mnist_classify", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_one_epoch_on_digits_learns_and_saves_a_plain_checkpoint(tmp_path):
    proc = run("--dataset", "digits", "--epochs", "1", "--save-model", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [record] = parse_epoch_lines(proc.stdout)
    assert record["epoch"] == 1
    assert record["test_acc"] > MIN_ACC_1_EPOCH, record
    assert record["images_per_s"] > 0 and record["images_per_s"] == record["images_per_s_rank"]
    assert 0 < record["train_loss"] < 2.3
    state = torch.load(tmp_path / "mnist_cnn.pt", weights_only=True)
    Net().load_state_dict(state, strict=True)          # no "module." prefix, nothing missing


@pytest.mark.slow   # a run of the training script in its own process: make test, not test-fast
def test_corrupt_data_stops_with_one_line(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for stems in (("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                  ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")):
        for stem in stems:
            (raw / stem).write_bytes(b"\x00\x00\x08\x03" + b"\x00" * 20)
    proc = run("--dataset", "mnist", "--data-dir", str(tmp_path), "--epochs", "1")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("data error:") and "train-images-idx3-ubyte" in lines[0]


@pytest.mark.parametrize("options", [["--amp", "bf16"], ["--num-workers", "1"]], ids=["bf16", "workers"])
@pytest.mark.slow   # a run of the training script in its own process: make test, not test-fast
def test_tuning_options_run(tmp_path, options):
    proc = run("--dataset", "digits", "--epochs", "1", "--dry-run", *options, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(parse_epoch_lines(proc.stdout)) == 1


def test_cli_defaults_match_the_pytorch_example(monkeypatch):
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    args = load_script_module().parse_args([])
    assert (args.batch_size, args.test_batch_size, args.lr, args.gamma, args.seed, args.log_interval) == \
        (64, 1000, 1.0, 0.7, 1, 10)
    assert args.num_workers == 0 and args.dataset == "auto" and not args.save_model
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "6")
    assert load_script_module().parse_args([]).num_workers == 6


SCALER_PROBE = """
import runpy, sys, torch
made = []
class Counting(torch.amp.GradScaler):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        made.append(self)
torch.amp.GradScaler = Counting
sys.argv = [sys.argv[1], *sys.argv[2:]]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print("SCALERS", [s.is_enabled() for s in made])
"""


@pytest.mark.slow
@pytest.mark.parametrize("amp, scaled", [("fp16", True), ("bf16", False)])
def test_fp16_trains_with_a_grad_scaler_and_bf16_without(amp, scaled, tmp_path):
    """fp16 needs loss scaling (5 exponent bits: small gradients underflow); bf16 keeps float32's range."""
    proc = subprocess.run([sys.executable, "-c", SCALER_PROBE, str(SCRIPT), "--dataset", "digits", "--epochs", "1",
                           "--amp", amp, "--dry-run"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"SCALERS [{scaled}]" in proc.stdout, proc.stdout[-500:]
    [record] = parse_epoch_lines(proc.stdout)
    assert record["train_loss"] == record["train_loss"], "the loss is NaN"
