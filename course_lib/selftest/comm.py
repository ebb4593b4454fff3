"""Items that communicate on GPUs: NCCL all-reduce, NCCL_ALGO ring/tree, the solution's TP over NCCL, NCCL with one
rank, DDP on gloo with CUDA tensors. A busbw (nccl-tests: algbw x 2(W-1)/W) is held against GPU 0's link per
direction: its active NVLink links, else its PCIe gen x width (docs/gpu-check.md).
"""
import re

from course_lib.selftest.pick import smi
from course_lib.selftest.runs import FAIL, PASS, TP, Context, Outcome, run_ranks, source, worker

SIZES = ("1M", "16M", "256M")
# nccl_experiment.result_line: "NCCL_ALGO=(NCCL chooses) W=2    1 MiB:      9.8 us  busbw  100.00 GB/s"
# (the algorithm may have spaces; with W=1 the line ends "busbw n/a (...)")
RESULT = re.compile(r"NCCL_ALGO=(.+?) W=(\d+)\s+(\d+ \w+):\s+([\d.]+) us\s+busbw\s+(?:([\d.]+) GB/s|n/a)")
BUSBW_NEEDS = "bus bandwidth needs 2+ ranks: with W=1 nothing crosses between GPUs (algbw x 2(W-1)/W = 0)"
ONE_RANK = "one rank: no traffic between GPUs (bandwidth and a hang between ranks untested)"
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
LINK = re.compile(r"^\s*Link \d+: ([\d.]+) GB/s", re.M)


def parse_results(text: str) -> dict:
    """{size: (microseconds, busbw GB/s or None)} from the lines nccl_experiment's rank 0 printed."""
    return {m.group(3): (float(m.group(4)), float(m.group(5)) if m.group(5) else None)
            for m in RESULT.finditer(text)}


def _experiment(ctx: Context, algo: str | None):
    """(Outcome or None, {size: (us, busbw)}) of one run of course_lib.allreduce.nccl_experiment."""
    env = {"NCCL_ALGO": algo, "NCCL_DEBUG": "INFO"} if algo else {}
    res = run_ranks(ctx, ["-m", "course_lib.allreduce.nccl_experiment", "--sizes", *SIZES], ctx.probe.gpus, env)
    rows = parse_results(res.output(0))
    if not res.ok:
        return Outcome(FAIL, res.summary()), rows
    if len(rows) != len(SIZES):
        return Outcome(FAIL, f"{len(rows)} of {len(SIZES)} sizes measured; rank 0 said:\n"
                             + "\n".join(res.ranks[0].tail(6))), rows
    return None, rows


def _show(rows: dict) -> str:
    return "; ".join(f"{size} {us:.0f} us, busbw {bw:.1f} GB/s" for size, (us, bw) in rows.items())


def allreduce_baseline(ctx: Context) -> Outcome:
    bad, rows = _experiment(ctx, None)
    if bad:
        return bad
    figures = {f"busbw_GBps_{size.replace(' ', '')}": bw for size, (_, bw) in rows.items()}
    return Outcome(PASS, f"W={ctx.probe.gpus}, NCCL chooses: {_show(rows)}; {against(rows, *limit(), figures)}",
                   figures)


def against(rows: dict, link_gbps: float, link: str, figures: dict) -> str:
    """The largest message's busbw as a share of the link's limit (added to ``figures``), in words."""
    if not link_gbps or not rows:
        return link
    size, (_, bw) = list(rows.items())[-1]
    figures.update(link_limit_GBps=link_gbps, busbw_of_link_pct=round(100 * (bw or 0) / link_gbps, 1))
    return f"{size}: {figures['busbw_of_link_pct']:.0f} % of the link ({link})"


def nccl_algo(ctx: Context) -> Outcome:
    figures, parts = {}, []
    for algo in ("Ring", "Tree"):
        sub = Context(ctx.probe, ctx.folder / algo.lower(), ctx.timeout / 2)
        bad, rows = _experiment(sub, algo)
        if bad:
            return Outcome(FAIL, f"NCCL_ALGO={algo}: {bad.detail}")
        log = (sub.folder / "ranks.log").read_text(errors="replace")
        honoured = "NCCL_ALGO set by environment" in log
        parts.append(f"{algo}: {_show(rows)}" + ("" if honoured else " (NCCL did not log that it read NCCL_ALGO)"))
        figures.update({f"{algo.lower()}_busbw_GBps_{s.replace(' ', '')}": bw for s, (_, bw) in rows.items()})
    return Outcome(PASS, f"W={ctx.probe.gpus}: " + " | ".join(parts), figures)


def tp_nccl(ctx: Context) -> Outcome:
    w = 1 << (ctx.probe.gpus.bit_length() - 1)    # the largest power of two <= the GPUs: the MLP splits 256 ways
    line, failed = worker(ctx, "tp_nccl", w, source(TP))
    return failed or Outcome(PASS, line, {"ranks": w})


def nccl_one_rank(ctx: Context) -> Outcome:
    """The item: NCCL's group, all-reduce, broadcast and barrier with one rank (course_lib.selftest.ranks);
    NCCL_DEBUG=INFO, its lines in ranks.log (the NCCL version and transport it chose)."""
    line, failed = worker(ctx, "nccl_one", 1, env={"NCCL_DEBUG": "INFO"})
    return failed or Outcome(PASS, f"{line[len('nccl_one ok '):]}; {ONE_RANK}", {"ranks": 1})


def gloo_cuda(ctx: Context) -> Outcome:
    line, failed = worker(ctx, "gloo_cuda", 2)
    return failed or Outcome(PASS, line)


def nvlink_gbps(text: str) -> float:
    """GPU 0's active NVLink bandwidth per direction from ``nvidia-smi nvlink -s`` (0 without active links)."""
    gpu0 = re.split(r"^GPU 1:", text, flags=re.M)[0]
    return round(sum(float(x) for x in LINK.findall(gpu0)), 1)


def pcie_gbps(csv_line: str) -> float:
    """The PCIe limit per direction from ``GEN, WIDTH`` (``--query-gpu=pcie.link.gen.max,pcie.link.width.max``)."""
    try:
        gen, width = (int(x) for x in csv_line.strip().splitlines()[0].split(","))
    except (ValueError, IndexError):
        return 0.0
    return round(PCIE_LANE_GBPS.get(gen, 0.0) * width, 1)


def limit() -> tuple[float, str]:
    """(GB/s per direction, what it is) for GPU 0; (0, why) when nvidia-smi cannot tell."""
    nv = nvlink_gbps(smi("nvlink", "-s", "-i", "0", timeout=20)[0])
    if nv:
        return nv, f"NVLink, {nv:.0f} GB/s per direction (GPU 0's active links)"
    line = smi("--query-gpu=pcie.link.gen.max,pcie.link.width.max", "--format=csv,noheader", "-i", "0",
               timeout=20)[0]
    pcie = pcie_gbps(line)
    if pcie:
        gen, width = line.strip().split(",")
        return pcie, f"PCIe gen{gen.strip()} x{width.strip()}, {pcie:.0f} GB/s per direction"
    return 0.0, "the link's limit is unknown (nvidia-smi told neither NVLink nor PCIe)"
