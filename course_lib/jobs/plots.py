"""A job's CPU and GPU use over its run, drawn from the logs its monitoring wrote (course_lib.jobs.monitor)."""
from pathlib import Path

from course_lib.jobs import monitor


def usage(run_dir) -> tuple[dict, list[str]]:
    """({"cpu": (t, %CPU), "gpu": {index: (t, sm %)}}, one sentence per log that is missing or empty)."""
    run_dir = Path(getattr(run_dir, "run_dir", run_dir))   # a Job or its folder
    series: dict = {}
    notes = []
    top = monitor.top_log(run_dir)
    frames = monitor.parse_top(top.read_text(errors="replace")) if top else []
    if frames:
        series["cpu"] = monitor.cpu_series(frames)
    elif top:
        first = top.read_text(errors="replace").strip().splitlines()[:1]
        notes.append(f"{top.name} has no top frames" + (f": {first[0]}" if first else " (empty: the job ended "
                                                         "before the first sample)"))
    else:
        notes.append("no CPU log: the job ran without monitor=True (no *.top.log in its folder)")
    gpu = monitor.gpu_log(run_dir)
    if not top and not gpu:
        return series, notes
    rows = monitor.parse_dmon(gpu.read_text(errors="replace")) if gpu else []
    if rows:
        series["gpu"] = monitor.gpu_series(rows, "sm")
    elif gpu:
        first = gpu.read_text(errors="replace").strip().splitlines()[:1]
        notes.append(f"{gpu.name} has no dmon samples" + (f": {first[0]}" if first else ""))
    else:
        notes.append("no GPU log: this job ran on CPU (nvidia-smi was not there to start)")
    return series, notes


def plot_usage(run_dir, ax=None):
    """CPU % (all processes in the log, per core: 200 = two cores) and each GPU's SM % over the job's time.

    Returns the figure, or None (after printing why) when there is nothing to draw; missing logs are one
    printed sentence each, never an exception.
    """
    series, notes = usage(run_dir)
    for note in notes:
        print(note)
    if not series:
        return None
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3))
    if "cpu" in series:
        t, cpu = series["cpu"]
        ax.plot(t, cpu, marker="o", ms=3, label="CPU (top %CPU, summed)")
    for index, (t, sm) in sorted(series.get("gpu", {}).items()):
        ax.plot(t, sm, marker="s", ms=3, label=f"GPU {index} (dmon sm %)")
    ax.set(xlabel="seconds since the first sample", ylabel="% (CPU: 100 per busy core)",
           title="the job's own monitoring")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return ax.figure
