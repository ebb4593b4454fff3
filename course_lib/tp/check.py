"""Checker for the tensor-parallel exercise: ``course check tp PATH``.

How it compares with serial: for every layer the worker builds the serial ``nn.Linear`` (float64, fixed
seed), copies this rank's shard into the learner's layer following the layout of DESIGN.md
(column-parallel: rows ``[out/tp, in]``; row-parallel: columns ``[out, in/tp]``, whole bias), then
compares forward outputs, input grads and weight grads with the serial layer's (within 1e-10).

Three runs, each in its own processes so that nothing the learner wrote can hang this one:

- ``rank_groups`` in one process (pure Python) against ``reference_rank_groups`` below;
- the operators and layers on 2 ranks (tp=2) and on 4 ranks (tp=4, then two tp=2 groups inside the
  4 ranks, which shows whether ``group=`` is honoured), gloo on CPU, via ``course_lib.core.launch.launch``.

The worker (``course_lib.tp.worker``) prints rankkit markers: ``start``/``end`` around each case and one
``verdict`` per case and rank. A case that does not finish within ``case_timeout`` stops its rank;
the checker reports that case as stuck (with the ranks) and launches again from the next case.
"""
from __future__ import annotations

import sys
import time
from collections import defaultdict

from course_lib.core import rankkit
from course_lib.core.report import MISSING, Report, Verdict

ITEMS = ("copy_to_parallel_region", "reduce_from_parallel_region", "ColumnParallelLinear", "RowParallelLinear",
         "ParallelMLP", "ParallelSelfAttention", "rank_groups", "init_rank_groups")
SETTING_TEXT = {"tp2": "tp=2", "tp4": "tp=4", "tp2of4": "tp=2 groups inside 4 ranks, group= given",
                "grid4": "4 ranks, tp=2 x dp=2"}

LAYERS = ("copy_to_parallel_region", "reduce_from_parallel_region", "ColumnParallelLinear", "RowParallelLinear")
BUILT_FROM = {"ColumnParallelLinear": LAYERS[:1], "RowParallelLinear": LAYERS[1:2], "ParallelMLP": LAYERS,
              "ParallelSelfAttention": LAYERS, "init_rank_groups": ("rank_groups",)}

# What a stuck case usually means, in the learner's terms.
HANG_HINTS = {
    "init_rank_groups": "every rank must call dist.new_group for EVERY group, in the same order, "
                        "even for the groups it is not a member of",
}
DEFAULT_HANG_HINT = ("a collective that not every rank of the group calls waits forever; check that every rank "
                     "runs the same all-reduce / all-gather (no `if rank == 0:` around one) and that each "
                     "uses the group it was given")


# ----------------------------------------------------------------------------- reference rank grid
def reference_rank_groups(world_size, tp=1, dp=1, cp=1, pp=1, order="tp-cp-pp-dp"):
    """Megatron-LM's RankGenerator (megatron/core/parallel_state.py), written out independently.

    Each rank has a coordinate per name of ``order`` (first name fastest: stride 1); a group of kind k
    holds the ranks whose coordinates agree except along k. Names of size 1 may be missing from ``order``.
    """
    sizes = {"tp": tp, "dp": dp, "cp": cp, "pp": pp}
    names = order.lower().split("-")
    names += [n for n in sizes if n not in names]
    shape = [sizes[n] for n in names]
    stride = [1]
    for s in shape:
        stride.append(stride[-1] * s)
    assert stride[-1] == world_size, (world_size, sizes)

    def decompose(index, dims):
        out = []
        for d in dims:
            out.append(index % d)
            index //= d
        return out

    result = {}
    for kind in sizes:
        mask = [n == kind for n in names]
        masked = [(s, st) for s, st, m in zip(shape, stride, mask) if m]
        unmasked = [(s, st) for s, st, m in zip(shape, stride, mask) if not m]
        group_size = masked[0][0]
        groups = []
        for g in range(world_size // group_size):
            base = sum(i * st for i, (_, st) in zip(decompose(g, [s for s, _ in unmasked]), unmasked))
            groups.append([base + i * masked[0][1] for i in range(group_size)])
        result[kind] = groups
    return result


def rank_group_cases():
    """(world, tp, dp, cp, pp, order) combinations: small grids, every order of 4 names, dp fastest, names left out."""
    from itertools import permutations
    cases = [(1, 1, 1, 1, 1, "tp-cp-pp-dp"), (8, 4, 2, 1, 1, "tp-cp-pp-dp"), (8, 2, 4, 1, 1, "tp-cp-pp-dp"),
             (4, 2, 2, 1, 1, "tp-dp"), (4, 2, 2, 1, 1, "dp-tp"), (8, 2, 4, 1, 1, "dp-tp"),
             (6, 2, 3, 1, 1, "tp-cp-pp-dp"), (6, 3, 2, 1, 1, "dp-tp-cp-pp"), (12, 2, 3, 2, 1, "tp-cp-pp-dp"),
             (2, 1, 1, 2, 1, "tp-cp-pp-dp"), (2, 1, 1, 1, 2, "pp-tp-cp-dp"), (4, 1, 2, 1, 2, "tp-cp-dp-pp")]
    for order in permutations(["tp", "cp", "pp", "dp"]):
        cases.append((16, 2, 2, 2, 2, "-".join(order)))
        cases.append((24, 2, 3, 1, 4, "-".join(order)))
        cases.append((24, 4, 2, 3, 1, "-".join(order)))
    return cases


# ----------------------------------------------------------------------------- running the worker
def _run_worker(path, mode, nprocs, timeout, case_timeout, skip):
    """Launch the worker; returns (verdict dicts, {rank: case it was in when stopped}, LaunchResult)."""
    from course_lib.core.launch import launch
    lines: dict[int, list[str]] = defaultdict(list)
    args = ["-m", "course_lib.tp.worker", path, "--mode", mode, "--case-timeout", str(case_timeout)]
    if skip:
        args += ["--skip", ",".join(sorted(skip))]
    result = launch(args, nprocs=nprocs, timeout=timeout, on_line=lambda r, line: lines[r].append(line),
                    grace=3.0)
    verdicts, current, stuck = [], {}, {}
    for rank in range(nprocs):
        for line in lines[rank]:
            event = rankkit.parse(line)
            ev = event.pop("ev") if event else None
            if ev == "start":
                current[rank] = event["case"]
            elif ev == "end":
                current.pop(rank, None)
            elif ev == "stuck":
                stuck[rank] = event["case"]
            elif ev == "verdict":
                verdicts.append(event)
    # ranks that said they were stuck come first; else (overall deadline) wherever the ranks were
    return verdicts, (stuck or current), result, lines


def _layers(path, nprocs, timeout, case_timeout, deadline):
    """All verdicts of the layer cases on ``nprocs`` ranks, launching again after a stuck case."""
    verdicts, skip = [], set()
    for _ in range(20):   # at most one relaunch per case
        left = deadline - time.monotonic()
        if left < 5:
            verdicts.append({"case": "deadline", "item": None, "rank": 0, "ok": False,
                             "message": f"the overall deadline of {timeout:.0f} s was reached on {nprocs} ranks"})
            break
        got, current, result, lines = _run_worker(path, "layers", nprocs, left, case_timeout, skip)
        verdicts += got
        skip |= {v["case"] for v in got}
        if result.ok and not current:
            break
        if current:   # some ranks were inside a case: report it stuck and go on after it
            case = max(current.values(), key=list(current.values()).count)
            item = case.split("@")[0]
            stuck = sorted(r for r, c in current.items() if c == case)
            verdicts.append({"case": case, "item": item, "rank": stuck[0], "ok": False, "stuck": True,
                             "message": f"did not finish (ranks {stuck} still inside it after "
                                        f"{case_timeout:.0f} s): {HANG_HINTS.get(item, DEFAULT_HANG_HINT)}"})
            skip.add(case)
            continue
        # no case running, not ok: the worker itself failed (import error, crash, ...)
        verdicts.append(rankkit.worker_failed(nprocs, result, lines))
        break
    return verdicts


def check(path: str, timeout: float = 180, case_timeout: float = 30, world_sizes=(2, 4)) -> Report:
    """Check ``path`` (the learner's tp.py); ``timeout`` bounds each of the runs.

    ``world_sizes``: the numbers of ranks to run the layers on (tests use (2,) where 4 adds nothing).
    """
    from course_lib.core import warm
    with warm.session():   # one fork server for all of this check's srun-style launches
        return _check(path, timeout, case_timeout, world_sizes)


def _check(path: str, timeout: float = 180, case_timeout: float = 30, world_sizes=(2, 4)) -> Report:
    start = time.monotonic()
    report = Report("tp", path)
    got, current, result, lines = _run_worker(path, "groups", 1, timeout, case_timeout, set())
    fatal = [v for v in got if v["item"] is None]
    if fatal or not got:
        msg = fatal[0]["message"] if fatal else (("rank_groups did not finish: " if current
                                                  else "the check did not run: ") + result.summary())
        report.add("tp.py" if fatal else "rank_groups", False, msg)
        if fatal:
            report.seconds = time.monotonic() - start
            return report
    all_verdicts = list(got)
    for nprocs in world_sizes:
        all_verdicts += _layers(path, nprocs, timeout, case_timeout, time.monotonic() + timeout)
    _summarise(report, all_verdicts)
    report.seconds = time.monotonic() - start
    return report


def _summarise(report: Report, verdicts: list[dict]) -> None:
    """One verdict per item: pass only if every case on every rank passed; else the first failure's message."""
    by_item: dict[str, list[dict]] = defaultdict(list)
    general = []
    for v in verdicts:
        (by_item[v["item"]] if v["item"] else general).append(v)
    for item in ITEMS:
        vs = by_item.get(item)
        if not vs:
            continue
        missing = [v for v in vs if v.get("missing")]
        if missing:
            report.verdicts.append(Verdict(item, MISSING, missing[0]["message"]))
            continue
        bad = sorted((v for v in vs if not v["ok"]), key=lambda v: not v.get("stuck"))   # a hang first
        if not bad:
            report.add(item, True, vs[0]["message"] if item == "rank_groups" else _pass_text(item, vs))
            continue
        first = bad[0]
        setting = first["case"].split("@")[1] if "@" in first["case"] else ""
        where = f"[{SETTING_TEXT.get(setting, setting)}, rank {first['rank']}] " if setting else ""
        msg = where + first["message"]
        on_world = [v["ok"] for v in vs if "@tp4@" in v["case"]]
        if setting == "tp2of4" and on_world and all(on_world):
            msg += ("\n(it passes when the group is all ranks but not with a smaller group: pass group=... "
                    "to every collective, and use dist.get_world_size(group) / dist.get_rank(group))")
        earlier = [v.item for v in report.verdicts if v.result != "pass" and v.item in BUILT_FROM.get(item, ())]
        if earlier:
            which = "that" if len(earlier) == 1 else "those"
            msg += f"\n({item} is built from {', '.join(earlier)}: fix {which} first)"
        report.add(item, False, msg)
    for v in general:
        report.add("check run", False, v["message"])


def _pass_text(item, vs):
    settings = sorted({v["case"].split("@")[1] for v in vs if "@" in v["case"]}, key=list(SETTING_TEXT).index)
    where = "; ".join(SETTING_TEXT[s] for s in settings)
    if item == "init_rank_groups":
        return "4 ranks, tp=2 x dp=2 in two orders: each rank's groups match the grid and all-reduce within them"
    if item in ("copy_to_parallel_region", "reduce_from_parallel_region"):
        return f"forward and backward as Megatron's {'f' if item.startswith('copy') else 'g'} within 1e-10 ({where})"
    return f"forward, input grads and weight grads equal serial within 1e-10 ({where})"


if __name__ == "__main__":   # python -m course_lib.tp.check PATH
    r = check(sys.argv[1])
    print(r.text())
    sys.exit(0 if r.passed else 1)
