"""Read a rank's Chrome trace back: the step's phases, the backward compute, the all-reduce buckets, the overlap.

Times are in milliseconds from the start of the traced step. What counts as:
- **compute** in backward: on CPU, the autograd engine's ``evaluate_function`` events of the main thread (each one
  runs the backward of one operator); on a GPU, the kernels that are not NCCL's;
- **communication**: gloo's ``gloo:all_reduce`` events (they run on gloo's own threads), or NCCL's all-reduce kernels.
``overlap`` is the share of all-reduce time during which backward compute ran at the same moment; ``exposed`` is the
all-reduce time left after backward's last computation, which the step waits for before the optimizer.
"""
import json
from dataclasses import dataclass, field
from pathlib import Path

PHASES = ("forward", "backward", "optimizer")
Interval = tuple[float, float]


def _union(intervals) -> list[Interval]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _length(intervals) -> float:
    return sum(b - a for a, b in _union(intervals))


def _intersection(xs, ys) -> float:
    """Total length of the time covered by both lists of intervals."""
    xs, ys, total, i, j = _union(xs), _union(ys), 0.0, 0, 0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def _is_allreduce(name: str) -> bool:
    low = name.lower()
    return low in ("gloo:all_reduce", "nccl:all_reduce") or (low.startswith("nccl") and "allreduce" in low
                                                             and "kernel" in low)


@dataclass
class Timeline:
    rank: int
    phases: dict[str, Interval] = field(default_factory=dict)
    compute: list[Interval] = field(default_factory=list)       # backward computation
    allreduce: list[Interval] = field(default_factory=list)     # one per bucket

    @property
    def allreduce_ms(self) -> float:
        return _length(self.allreduce)

    @property
    def overlap(self) -> float:
        """Share of the all-reduce time that ran while backward computed (0 with no all-reduce)."""
        total = self.allreduce_ms
        return _intersection(self.allreduce, self.compute) / total if total else 0.0

    @property
    def exposed_ms(self) -> float:
        """All-reduce time after backward's last computation: what the step waits for."""
        end = max((b for _, b in self.compute), default=0.0)
        return _length([(max(a, end), b) for a, b in self.allreduce if b > end])

    @property
    def step_ms(self) -> float:
        return max((b for _, b in self.phases.values()), default=0.0) - min(
            (a for a, _ in self.phases.values()), default=0.0)


def from_chrome_trace(path, rank: int | None = None) -> Timeline:
    """The timeline of one rank's ``trace-rank<R>.json`` (written by ``course_lib.trace.step``)."""
    path = Path(path)
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    if rank is None:
        rank = int(path.stem.rsplit("rank", 1)[-1])
    phase = {e["name"]: e for e in events if e["name"] in PHASES}
    missing = [p for p in PHASES if p not in phase]
    if missing:
        raise ValueError(f"{path.name} has no {', '.join(missing)} event: not a trace of course_lib.trace.step")
    t0, main_tid = phase["forward"]["ts"], phase["forward"]["tid"]
    ms = lambda e: ((e["ts"] - t0) / 1000, (e["ts"] + e["dur"] - t0) / 1000)   # noqa: E731
    back = ms(phase["backward"])
    gpu = any(e.get("cat") == "kernel" for e in events)
    if gpu:
        compute = [ms(e) for e in events if e.get("cat") == "kernel" and "nccl" not in e["name"].lower()]
    else:
        compute = [ms(e) for e in events if e["tid"] == main_tid
                   and e["name"].startswith("autograd::engine::evaluate_function")]
    compute = [(a, b) for a, b in compute if a < back[1] + 1e-9 and b > back[0]] if not gpu else compute
    return Timeline(rank, {p: ms(phase[p]) for p in PHASES}, compute,
                    [ms(e) for e in events if _is_allreduce(e["name"])])


def plot(timelines, ax=None, title: str = "", legend: bool = True):
    """One row per rank: phases as a thin band, backward compute and all-reduce buckets as bars."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.9 + 0.8 * len(timelines)))
    colours = {"forward": "#9ecae1", "backward": "#fdae6b", "optimizer": "#a1d99b"}
    for row, tl in enumerate(timelines):
        y = 2 * row
        for name, (a, b) in tl.phases.items():
            ax.broken_barh([(a, b - a)], (y + 1.25, 0.3), color=colours[name])
        ax.broken_barh([(a, b - a) for a, b in _union(tl.compute)], (y + 0.65, 0.5), color="#e6550d")
        ax.broken_barh([(a, b - a) for a, b in tl.allreduce], (y, 0.5), color="#3182bd")
    # every lane named; a step without all-reduces (one process) has no all-reduce lane, not an empty one
    has_allreduce = any(tl.allreduce for tl in timelines)
    lanes = [(0.9, "backward compute"), (1.4, "phases")] + ([(0.25, "all-reduce")] if has_allreduce else [])
    ax.set_yticks([2 * r + dy for r in range(len(timelines)) for dy, _ in lanes],
                  [f"rank {tl.rank} {name}" for tl in timelines for _, name in lanes], fontsize=8)
    if not has_allreduce:
        ax.set_ylim(0.55, 2 * len(timelines) - 0.35)
    ax.set_xlabel("ms since the step began")
    if title:
        ax.set_title(title)
    if not legend:
        return ax
    # only what is drawn: a one-process step has no all-reduce
    shown = {**colours, "backward compute": "#e6550d", **({"all-reduce": "#3182bd"} if has_allreduce else {})}
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in shown.values()]
    ax.legend(handles, list(shown), ncol=len(shown), fontsize=8, loc="upper center",
              bbox_to_anchor=(0.5, -0.35 if len(timelines) < 3 else -0.2))
    return ax
