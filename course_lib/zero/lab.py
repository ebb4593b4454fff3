"""Notebook 09's side of the runs in demo.py: launch them (with a deadline), read their markers, show the results."""
from course_lib import runs
from course_lib.core import rankkit
from course_lib.runtime.warm import DDP_IMPORTS

KIB = 1024
DEMO = "course_lib.zero.demo"


def launch(module, args, nprocs, timeout):
    """``python -m MODULE ARGS`` as ``nprocs`` ranks: (its result, every rank's markers)."""
    # here: ranks forked from a server that imported torch and what DDP imports once, kept for the next run
    with runs.session(preload=DDP_IMPORTS):
        res = runs.launch(["-m", module, *args], nprocs=nprocs, timeout=timeout, on_line=None, grace=3.0)
    return res, [e for r in res.ranks for e in map(rankkit.parse, r.lines) if e]


def accumulation(world=2, micro=4, batch=16, timeout=180):
    """{way: {"allreduces", "numbers", "diff"}} for one step three ways; raises with the ranks' output if it failed."""
    res, events = launch(DEMO, ["accum", "--micro", str(micro), "--batch", str(batch)], world, timeout)
    rows = {e["way"]: e for e in events if e["ev"] == "accum"}
    if not res.ok or len(rows) != 3:
        raise RuntimeError("the accumulation run failed:\n" + res.summary())
    return rows


def accumulation_table(rows) -> str:
    lines = [f"{'one step as':<20} {'all-reduces':>11} {'numbers sent into all-reduce':>29} "
             f"{'max |param - large batch|':>26}"]
    for way, r in rows.items():
        lines.append(f"{way:<20} {r['allreduces']:>11} {r['numbers']:>29,} {r['diff']:>26.1e}")
    return "\n".join(lines)


def sharded(zero_file, world, steps, collectives="mine", timeout=240):
    """Train DDP, ZeRO-1, ZeRO-2 (the learner's file) and FSDP2 on ``world`` ranks.

    Returns {"losses": {method: [...]}, "memory": {method: {rank: {params, grads, state}}}, "errors": {method: msg},
    "summary": the launch's one-line outcome}.
    """
    res, events = launch(DEMO, ["sharded", "--zero-file", str(zero_file), "--steps", str(steps),
                                "--collectives", collectives], world, timeout)
    out = {"world": world, "losses": {}, "memory": {}, "errors": {}, "summary": res.summary()}
    for e in events:
        if e["ev"] == "loss":
            out["losses"][e["method"]] = e["losses"]
        elif e["ev"] == "memory":
            out["memory"].setdefault(e["method"], {})[e["rank"]] = {k: e.get(k, 0) for k in
                                                                    ("params", "grads", "state", "other")}
        elif e["ev"] == "error":
            out["errors"].setdefault(e["method"], f"rank {e['rank']}: {e['message']}")
    if not res.ok:
        out["errors"].setdefault("run", res.summary())
    return out


def loss_differences(run) -> dict:
    """{method: largest |loss - DDP's loss| over the steps}."""
    ddp = run["losses"].get("DDP")
    if not ddp:
        return {}
    return {m: max(abs(a - b) for a, b in zip(ls, ddp)) for m, ls in run["losses"].items() if m != "DDP"}


def memory_rows(runs):
    """[(W, method, params KiB, grads KiB, state KiB, other KiB, state / DDP's state)] from rank 0 of each run."""
    rows = []
    for run in runs:
        ddp = run["memory"].get("DDP", {}).get(0)
        for method, per_rank in run["memory"].items():
            m = per_rank.get(0)
            if m:
                ratio = m["state"] / ddp["state"] if ddp else float("nan")
                rows.append((run["world"], method, m["params"] / KIB, m["grads"] / KIB, m["state"] / KIB,
                             m["other"] / KIB, ratio))
    return rows


def memory_table(runs) -> str:
    lines = [f"{'W':>2} {'method':<7} {'params KiB':>10} {'grads KiB':>10} {'optimizer state KiB':>20} "
             f"{'other KiB':>10} {'state / DDP':>11}"]
    for w, method, p, g, s, o, ratio in memory_rows(runs):
        lines.append(f"{w:>2} {method:<7} {p:>10.0f} {g:>10.0f} {s:>20.0f} {o:>10.0f} {ratio:>11.2f}")
    return "\n".join(lines)


def plot_memory(runs):
    """Stacked bars per method and W: parameters, gradients, optimizer state and other tensors held on rank 0."""
    import matplotlib.pyplot as plt
    rows = memory_rows(runs)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    labels = [f"{m}\nW={w}" for w, m, *_ in rows]
    bottom = [0.0] * len(rows)
    for i, (name, colour) in enumerate((("parameters", "#4c72b0"), ("gradients", "#dd8452"),
                                        ("optimizer state", "#55a868"), ("other (ZeRO's shard copy, ...)", "#8172b2"))):
        values = [r[2 + i] for r in rows]
        ax.bar(labels, values, bottom=bottom, label=name, color=colour)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("KiB on rank 0 after a step")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_losses(run):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3))
    styles = {"DDP": dict(color="k", lw=4, alpha=0.25), "ZeRO-1": dict(marker="o", ls=""),
              "ZeRO-2": dict(marker="x", ls=""), "FSDP2": dict(marker="+", ls="", ms=10)}
    for method, losses in run["losses"].items():
        ax.plot(range(1, len(losses) + 1), losses, label=method, **styles.get(method, {}))
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(f"W={run['world']}")
    ax.legend()
    fig.tight_layout()
    return fig
