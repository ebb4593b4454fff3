"""Notebook 10's side of the timing run (bench.py): launch it with a deadline, read its markers, and show the step
times of the learner's four variants and torch's DDP as a table and a plot, next to the alpha-beta model of
notebooks 04/05 (course_lib.allreduce.costmodel) fitted to all-reduces timed in the same run."""
from collections import defaultdict
from pathlib import Path

from course_lib import runs
from course_lib.allreduce import costmodel
from course_lib.owndp.cases import reference_buckets
from course_lib.trace import timeline
from course_lib.zero.lab import launch

ORDER = ("compute only", "naive", "flat", "overlapped", "bucketed", "torch DDP")
QUICK = {"steps": 5, "warmup": 2, "width": 256, "layers": 4, "bucket_mb": 0.125}
FULL = {"steps": 20, "warmup": 3, "width": 1024, "layers": 6, "bucket_mb": 4.0}


def timing(path, world=2, quick=False, timeout=300):
    """{"world", "config", "ms": {variant: (step ms, finish ms)}, "errors": {variant: msg}, "allreduce": [(bytes,
    ms)], "torch buckets": [bytes], "timelines": {variant: [Timeline per rank]}, "summary"}: times are the mean
    over the ranks of each rank's median step."""
    config = QUICK if quick else FULL
    args = [str(path)] + [a for k, v in config.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    with runs.workdir("own-ddp-trace-") as traces:
        res, events = launch("course_lib.owndp.bench", args + ["--trace", traces], world, timeout)
        found = timelines(traces)
    per = defaultdict(list)
    out = {"world": world, "config": config, "ms": {}, "errors": {}, "allreduce": [], "torch buckets": [],
           "timelines": found, "summary": res.summary()}
    for e in events:
        if e["ev"] == "time":
            per[e["variant"]].append((e["step_ms"], e["finish_ms"]))
        elif e["ev"] == "error":
            out["errors"].setdefault(e["variant"], e["message"])
        elif e["ev"] == "buckets":
            out["torch buckets"] = e["bytes"]
        elif e["ev"] == "allreduce":
            per[("allreduce", e["bytes"])].append((e["ms"], 0))
    for key, vals in per.items():
        mean = tuple(sum(v[i] for v in vals) / len(vals) for i in (0, 1))
        if isinstance(key, tuple):
            out["allreduce"].append((key[1], mean[0]))
        else:
            out["ms"][key] = mean
    if not res.ok:
        out["errors"].setdefault("run", res.summary())
    return out


def _param_bytes(config):
    w = config["width"]
    return [4 * w * w, 4 * w] * config["layers"]      # float32 weight and bias of each layer, in order


def _messages(run):
    """{variant: bytes of each all-reduce of its step}."""
    sizes = _param_bytes(run["config"])
    return {"compute only": [], "naive": sizes, "flat": [sum(sizes)], "overlapped": sizes,
            "bucketed": reference_buckets(sizes, run["config"]["bucket_mb"] * 2 ** 20, itemsize=1),
            "torch DDP": run["torch buckets"]}


def model_ms(run):
    """{variant: ms} that the alpha-beta model gives for the step's all-reduces, if none overlapped anything;
    alpha and beta fitted (least squares) to the all-reduces timed in the same run."""
    rows = [{"algo": "gloo", "ranks": run["world"], "bytes": b, "seconds": ms / 1000} for b, ms in run["allreduce"]]
    if len(rows) < 2:
        return {}, None
    alpha, beta = costmodel.fit(rows, "gloo")
    cost = {v: 1000 * sum(costmodel.predict("gloo", run["world"], n, alpha, beta) for n in m)
            for v, m in _messages(run).items() if m}
    return cost, (alpha, beta)


def rows(run):
    """[(variant, all-reduces, step ms, in finish ms, exposed communication ms, share of the step, model ms)]."""
    compute = run["ms"].get("compute only", (float("nan"), 0))[0]
    cost, _ = model_ms(run)
    count = {v: len(m) for v, m in _messages(run).items()}
    out = []
    for v in ORDER:
        if v in run["ms"]:
            step, fin = run["ms"][v]
            exposed = max(0.0, step - compute)
            out.append((v, count[v], step, fin, exposed, exposed / step, cost.get(v, 0.0)))
    return out


def table(run) -> str:
    _, fitted = model_ms(run)
    c = run["config"]
    head = (f"W={run['world']}, gloo on CPU, MLP {c['layers']} x ({c['width']} x {c['width']}), float32, "
            f"{sum(_param_bytes(c)) / 2 ** 20:.1f} MiB of gradients, buckets of {c['bucket_mb']} MiB")
    lines = [head, f"{'variant':<13}{'all-reduces':>12}{'step ms':>9}{'finish ms':>10}{'comm ms':>9}"
                   f"{'comm share':>11}{'model ms':>10}"]
    for v, n, step, fin, exposed, share, cost in rows(run):
        lines.append(f"{v:<13}{n:>12}{step:>9.1f}{fin:>10.1f}{exposed:>9.1f}{share:>11.0%}{cost:>10.1f}")
    if fitted:
        lines.append(f"alpha-beta fit to this run's all-reduces: alpha = {fitted[0] * 1e6:.0f} us, "
                     f"1/beta = {1 / fitted[1] / 2 ** 30 if fitted[1] else float('inf'):.2f} GiB/s")
    for v, msg in run["errors"].items():
        lines.append(f"{v} did not run: {msg}")
    return "\n".join(lines)


def plot(run):
    """Bars: each variant's step, split into the compute a step needs and the communication left exposed."""
    import matplotlib.pyplot as plt
    data = rows(run)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = [r[0] for r in data]
    ax.bar(names, [r[2] - r[4] for r in data], label="compute (the 'compute only' step)")
    ax.bar(names, [r[4] for r in data], bottom=[r[2] - r[4] for r in data], label="communication left exposed")
    ax.scatter(names, [r[2] - r[4] + r[6] for r in data], marker="_", s=400, color="k",
               label="compute + alpha-beta model of its all-reduces")
    ax.set_ylabel("ms per step (median)")
    ax.set_title(f"One training step on {run['world']} ranks")
    ax.set_ylim(0, 1.35 * max((r[2] for r in data), default=1))   # room for the legend above the bars
    ax.legend(fontsize=8, loc="upper left", ncol=2)
    fig.tight_layout()
    return fig


def timelines(trace_dir):
    """{variant: [Timeline per rank]} of the steps ``timing`` profiled into ``trace_dir``."""
    out = {}
    for variant in ORDER:
        files = sorted((Path(trace_dir) / variant.replace(" ", "_")).glob("trace-rank*.json"))
        if files:
            out[variant] = [timeline.from_chrome_trace(f) for f in files]
    return out


def overlap_line(name, tl):
    return (f"{name}: all-reduce {tl.allreduce_ms:.1f} ms, {tl.overlap:.0%} of it during backward compute, "
            f"{tl.exposed_ms:.1f} ms after it")


def plot_timelines(by_variant):
    """Rank 0's traced step of each variant, one row each: backward compute against the all-reduces."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(by_variant), 1, figsize=(9, 1.3 * len(by_variant) + 0.8), sharex=True,
                             squeeze=False)
    for i, (ax, (name, tls)) in enumerate(zip(axes[:, 0], by_variant.items())):
        timeline.plot(tls[:1], ax=ax, legend=i == len(by_variant) - 1)
        if i < len(by_variant) - 1:
            ax.set_xlabel("")
        ax.set_title(overlap_line(name, tls[0]), fontsize=9)
    fig.tight_layout()
    return fig
