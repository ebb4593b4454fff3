"""Items that train: the serial solution on ``cuda`` (fp32, bf16, fp16 + GradScaler, torch.compile), DDP on NCCL
over every GPU, and ``course check ddp`` of the solution with GPUs."""
import re

from course_lib.metrics import parse_epoch_lines
from course_lib.selftest.runs import DDP, FAIL, PASS, SERIAL, Context, Outcome, python, run_command, run_ranks, source

EPOCHS = 3                  # the last epoch is timed: the first pays for CUDA start-up (and compilation)
TRAIN_ARGS = ["--epochs", str(EPOCHS), "--batch-size", "128", "--dataset", "auto", "--log-interval", "1000"]
MIN_ACC = 0.5               # well above chance (0.1): training went somewhere
DEVICE = re.compile(r"device=(\S+) dataset=(\S+)")


def judge_epochs(text: str, devices: list[str], want: str) -> Outcome | None:
    """FAIL when the run trained on the wrong device, printed too few epochs, or did not learn; else None."""
    if not devices or any(not d.startswith(want) for d in devices):
        return Outcome(FAIL, f"trained on {devices or 'no device line'}, not on {want}")
    epochs = parse_epoch_lines(text)
    if len(epochs) != EPOCHS:
        return Outcome(FAIL, f"{len(epochs)} epoch lines, {EPOCHS} expected")
    if not epochs[-1].get("test_acc", 0) >= MIN_ACC:
        return Outcome(FAIL, f"test accuracy {epochs[-1].get('test_acc')} after {EPOCHS} epochs (chance: 0.1)")
    return None


def _figures(text: str) -> dict:
    last = parse_epoch_lines(text)[-1]
    return {"images_per_s": round(float(last["images_per_s"]), 1), "test_acc": last["test_acc"]}


def serial(extra: list[str], env: dict | None = None):
    """The item: the serial solution on cuda with ``extra`` arguments (``--amp bf16``, ``--compile``, ...) and
    ``env`` (``NVIDIA_TF32_OVERRIDE=0``). It proves the path runs and learns; the throughput item measures speed
    (the digits set is too small for that)."""
    def run(ctx: Context) -> Outcome:
        ran = run_command(python(source(SERIAL), *TRAIN_ARGS, *extra), ctx.folder / "train.log", ctx.timeout,
                          cwd=ctx.folder, env=env)
        if not ran.ok:
            return Outcome(FAIL, ran.why())
        found = DEVICE.findall(ran.text)
        bad = judge_epochs(ran.text, [d for d, _ in found], "cuda")
        if bad:
            return bad
        fig = _figures(ran.text)
        return Outcome(PASS, f"{found[0][1]} on {found[0][0]}: last epoch {fig['images_per_s']:.0f} images/s, "
                             f"test accuracy {fig['test_acc']:.3f}", fig)
    return run


def ddp_nccl(ctx: Context) -> Outcome:
    w = ctx.probe.gpus
    res = run_ranks(ctx, [source(DDP), *TRAIN_ARGS], w)
    if not res.ok:
        return Outcome(FAIL, res.summary())
    devices = [m.group(1) for r in range(w) for m in [DEVICE.search(res.output(r))] if m]
    bad = judge_epochs(res.output(0), devices, "cuda")
    if bad:
        return bad
    if sorted(devices) != [f"cuda:{r}" for r in range(w)]:
        return Outcome(FAIL, f"the ranks used {devices}: each rank must have its own GPU")
    fig = {**_figures(res.output(0)), "ranks": w}
    alone = "; one rank: DDP's all-reduce has no peer, no traffic between GPUs" if w == 1 else ""
    return Outcome(PASS, f"{w} rank(s) on {', '.join(devices)} (NCCL): last epoch {fig['images_per_s']:.0f} "
                         f"images/s in all, test accuracy {fig['test_acc']:.3f}{alone}", fig)


def check_ddp(ctx: Context) -> Outcome:
    """The DDP checker on the solution: with 2+ GPUs its Step 4 must judge GPU placement, not say 'on CPU'."""
    per_run = max(60.0, ctx.timeout / 4)   # srun, then torchrun, then 3 ranks, each with this deadline
    ran = run_command(python("-m", "course_lib", "check", "ddp", source(DDP), "--timeout", f"{per_run:.0f}"),
                      ctx.folder / "check.log", ctx.timeout, cwd=ctx.folder)
    if not ran.ok:
        return Outcome(FAIL, ran.why())
    if "own GPU (" not in ran.text:
        return Outcome(FAIL, "the checker passed but did not judge GPU placement (Step 4 ran on CPU):\n"
                             + ran.tail())
    step4 = next((x.strip() for x in ran.text.splitlines() if "own GPU (" in x), "")
    return Outcome(PASS, f"all steps pass; {step4[:200]}")
