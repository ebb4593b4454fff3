"""The throughput item: images/s of the course's CNN per numeric format, on a workload big enough to show it.

60,000 synthetic MNIST-sized images made on the GPU (the digits set keeps a GPU busy for milliseconds: it would
time Python, not the GPU), one timed epoch per variant (docs/gpu-check.md). Worker:
``python -m course_lib.selftest.speed [--variants ...] [--min-seconds S]``.
"""
import argparse
import os
import re
import sys
import time

from course_lib.selftest.runs import FAIL, PASS, Context, Outcome, python, run_command

VARIANTS = ("fp32-strict", "fp32", "tf32", "bf16", "fp16", "compile")
TF32 = {"fp32-strict": (False, False), "tf32": (True, True)}   # (cuDNN conv, matmul); others: PyTorch's default
DEFAULT_TF32 = (True, False)
IMAGES, BATCH, WARMUP = 60_000, 256, 10
CPU_FLAG = "COURSE_SELFTEST_CPU"
LINE = re.compile(r"speed variant=(\S+) device=(\S+) images_per_s=([\d.]+) epoch_s=([\d.]+) "
                  r"compile_s=([\d.]+) tf32_conv=(\d) tf32_matmul=(\d) loss=(\S+) out_dtype=(\w+) graphs=(\d+)")
# what shows that autocast engaged: the dtype a Linear layer computes in (the model's own output is fp32 either
# way: autocast runs log_softmax in fp32)
DTYPE = {"bf16": "bfloat16", "fp16": "float16"}


def _one(variant: str, x, y, device, batch: int, warmup: int = WARMUP, min_seconds: float = 0.0) -> str:
    import torch
    import torch.nn.functional as F
    from torch._dynamo.utils import counters

    from course_lib.model import Net

    conv, matmul = TF32.get(variant, DEFAULT_TF32)
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = conv, matmul
    torch.manual_seed(0)
    model = Net().to(device)
    step_model = torch.compile(model) if variant == "compile" else model
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(variant)
    scaler = torch.amp.GradScaler(device.type, enabled=variant == "fp16")
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)

    def step(i):
        xb, yb = x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            loss = F.nll_loss(step_model(xb), yb)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    steps = len(x) // batch
    graphs_before = counters["stats"]["unique_graphs"]
    start = time.perf_counter()
    for i in range(warmup):              # the first steps: cuDNN autotuning, and for compile the compilation
        step(i % steps)
    sync()
    warm_s = time.perf_counter() - start
    start, epochs = time.perf_counter(), 0
    while epochs == 0 or time.perf_counter() - start < min_seconds:
        for i in range(steps):
            loss = step(i)
        sync()
        epochs += 1
    epoch_s = (time.perf_counter() - start) / epochs
    graphs = counters["stats"]["unique_graphs"] - graphs_before     # the graphs torch.compile made
    seen = []     # the dtype the last Linear computes in, one eager forward under the variant's autocast
    hook = model.fc2.register_forward_hook(lambda _m, _i, out: seen.append(str(out.dtype).removeprefix("torch.")))
    with torch.no_grad(), torch.autocast(device.type, dtype=amp, enabled=amp is not None):
        model(x[:8])
    hook.remove()
    return (f"speed variant={variant} device={device} images_per_s={steps * batch / epoch_s:.1f} "
            f"epoch_s={epoch_s:.3f} compile_s={warm_s if variant == 'compile' else 0:.2f} tf32_conv={int(conv)} "
            f"tf32_matmul={int(matmul)} loss={loss.item():.4f} out_dtype={seen[0]} "
            f"graphs={graphs}")


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--min-seconds", type=float, default=0.0, help="repeat each timed epoch until this long")
    args = p.parse_args(argv)
    device = torch.device("cpu" if os.environ.get(CPU_FLAG) == "1" else "cuda")
    print(f"device={device} dataset=synthetic train={IMAGES} test=0", flush=True)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(IMAGES, 1, 28, 28, device=device, generator=gen)   # made on the device: no copy timed
    y = torch.randint(0, 10, (IMAGES,), device=device, generator=gen)
    for variant in args.variants:
        if variant == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            print(f"speed variant=bf16 not possible: {torch.cuda.get_device_name()} has no bf16", flush=True)
            continue
        print(_one(variant, x, y, device, BATCH, min_seconds=args.min_seconds), flush=True)
    return 0


def judge(text: str, want: str = "cuda", variants=VARIANTS) -> Outcome:
    """PASS when every variant printed its line on ``want`` with a finite loss; figures: images/s, the speedup of
    each over fp32-strict, compile seconds."""
    rows = {m.group(1): m for m in LINE.finditer(text)}
    missing = [v for v in variants if v not in rows and f"variant={v} not possible" not in text]
    if missing:
        return Outcome(FAIL, f"no result for {', '.join(missing)}; last lines:\n" + "\n".join(text.splitlines()[-6:]))
    off = [f"{v} on {m.group(2)}" for v, m in rows.items() if not m.group(2).startswith(want)]
    if off:
        return Outcome(FAIL, f"ran on the wrong device: {', '.join(off)} (want {want})")
    bad = [v for v, m in rows.items() if m.group(8) in ("nan", "inf", "-inf")]
    if bad:
        return Outcome(FAIL, f"the loss is not finite for {', '.join(bad)}")
    off = [f"{v} computed in {m.group(9)}" for v, m in rows.items() if m.group(9) != DTYPE.get(v, "float32")]
    if off:
        return Outcome(FAIL, f"autocast did not do what the variant says: {', '.join(off)} (the last Linear)")
    if "compile" in rows and int(rows["compile"].group(10)) < 1:
        return Outcome(FAIL, "compile: torch.compile made no graph (it ran eager)")
    base = float(rows["fp32-strict"].group(3))
    figures = {f"{v}_images_per_s": float(m.group(3)) for v, m in rows.items()}
    figures.update({f"{v}_speedup": round(float(m.group(3)) / base, 2) for v, m in rows.items() if v != "fp32-strict"})
    if "compile" in rows:
        figures["compile_s"] = float(rows["compile"].group(5))
        figures["compile_graphs"] = int(rows["compile"].group(10))
    shown = ", ".join(f"{v} {float(m.group(3)):.0f}/s"
                      + ("" if v == "fp32-strict" else f" (x{figures[v + '_speedup']})") for v, m in rows.items())
    extra = "".join(f"; {v} autocast computed in {DTYPE[v]}" for v in rows if v in DTYPE)
    extra += (f"; compilation {figures['compile_s']:.1f} s apart, {figures['compile_graphs']} graph(s)"
              if "compile_s" in figures else "")
    return Outcome(PASS, f"{IMAGES:,} synthetic images on {rows['fp32-strict'].group(2)}: {shown}{extra}", figures)


def throughput(ctx: Context) -> Outcome:
    ran = run_command(python("-m", "course_lib.selftest.speed"), ctx.folder / "speed.log", ctx.timeout,
                      cwd=ctx.folder)
    if not ran.ok:
        return Outcome(FAIL, ran.why())
    return judge(ran.text)


if __name__ == "__main__":
    sys.exit(main())
