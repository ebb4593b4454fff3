"""Items that communicate on GPUs: the NCCL all-reduce baseline, the NCCL_ALGO ring/tree experiment of
notebook 05, and the solution's tensor parallelism over NCCL."""
from __future__ import annotations

import re

from course_lib.selftest.runs import FAIL, PASS, TP, Context, Outcome, source
from course_lib.selftest.train import launch_logged

SIZES = ("1M", "16M", "256M")
# nccl_experiment.result_line: "NCCL_ALGO=(NCCL chooses) W=2    1 MiB:      9.8 us  busbw  100.00 GB/s"
# (the algorithm may have spaces; with W=1 the line ends "busbw n/a (...)")
RESULT = re.compile(r"NCCL_ALGO=(.+?) W=(\d+)\s+(\d+ \w+):\s+([\d.]+) us\s+busbw\s+(?:([\d.]+) GB/s|n/a)")
BUSBW_NEEDS = "bus bandwidth needs 2+ ranks: with W=1 nothing crosses between GPUs (algbw x 2(W-1)/W = 0)"
ONE_RANK = "one rank: no traffic between GPUs (bandwidth and a hang between ranks untested)"


def parse_results(text: str) -> dict:
    """{size: (microseconds, busbw GB/s or None)} from the lines nccl_experiment's rank 0 printed."""
    return {m.group(3): (float(m.group(4)), float(m.group(5)) if m.group(5) else None)
            for m in RESULT.finditer(text)}


def _experiment(ctx: Context, algo: str | None):
    """(Outcome or None, {size: (us, busbw)}) of one run of course_lib.allreduce.nccl_experiment."""
    env = {"NCCL_ALGO": algo, "NCCL_DEBUG": "INFO"} if algo else {}
    res = launch_logged(ctx, ["-m", "course_lib.allreduce.nccl_experiment", "--sizes", *SIZES], ctx.probe.gpus, env)
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
    from course_lib.selftest.link import limit

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


def tp_ranks(gpus: int) -> int:
    """The world size of the TP item: the largest power of two <= the GPU count (the MLP splits 256 ways)."""
    w = 1
    while w * 2 <= gpus:
        w *= 2
    return w


def tp_nccl(ctx: Context) -> Outcome:
    w = tp_ranks(ctx.probe.gpus)
    res = launch_logged(ctx, ["-m", "course_lib.selftest.tp_nccl", source(TP)], w)
    line = next((x for x in res.output(0).splitlines() if x.startswith("tp_nccl ")), "")
    if res.ok and " ok " in line:
        return Outcome(PASS, line, {"ranks": w})
    return Outcome(FAIL, line or res.summary())


def nccl_one_rank(ctx: Context) -> Outcome:
    """The item: NCCL's group, all-reduce, broadcast and barrier with one rank (course_lib.selftest.nccl_one);
    NCCL_DEBUG=INFO, its lines in ranks.log (the NCCL version and transport it chose)."""
    res = launch_logged(ctx, ["-m", "course_lib.selftest.nccl_one"], 1, {"NCCL_DEBUG": "INFO"})
    line = next((x for x in res.output(0).splitlines() if x.startswith("nccl_one ")), "")
    if res.ok and line.startswith("nccl_one ok "):
        return Outcome(PASS, f"{line[len('nccl_one ok '):]}; {ONE_RANK}", {"ranks": 1})
    return Outcome(FAIL, line or res.summary())
