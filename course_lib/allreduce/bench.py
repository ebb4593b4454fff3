"""``course bench allreduce``: the learner's naive, ring and tree against gloo's all_reduce in the same run, per W
and message size, as algbw and busbw (nccl-tests), with the alpha-beta fit (costmodel) and the ring/gloo busbw ratio
from 16 MiB up. Figures depend on what else the machine runs: on a shared machine say so when you quote them.
"""
import csv
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.cli import comma_items
from course_lib.core.rankkit import parse
from course_lib.registry import reference

ALGOS = ("naive", "ring", "tree", "gloo")
DEFAULT_SIZES = tuple(4 * 2**10 * 4**i for i in range(8))       # 4 KiB, 16 KiB, ..., 64 MiB
QUICK_SIZES = (4 * 2**10, 256 * 2**10, 4 * 2**20, 16 * 2**20)
RATIO_FROM = 16 * 2**20          # the goal: ring reaches 0.7 of gloo's busbw from 16 MiB up
GOAL = 0.7
WORKER = "course_lib.allreduce.bench_worker"
WORKER_ENV = {"OMP_NUM_THREADS": "1"}   # one thread per rank: the ranks share the cores
SOLUTION = reference("allreduce")


def parse_size(text: str) -> int:
    """'4K', '4KiB', '16M', '1G' or a number of bytes -> bytes (powers of two)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(i?B)?\s*", text, re.I)
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 4096, 4K, 16M, 64MiB)")
    return int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2).upper()]


def human(nbytes: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size and nbytes % size == 0:
            return f"{nbytes // size} {unit}"
    return f"{nbytes} B"


@dataclass
class BenchResult:
    rows: list[dict] = field(default_factory=list)        # ranks, bytes, algo, iters, seconds, algbw, busbw, model
    fits: dict = field(default_factory=dict)              # algo -> (alpha, beta)
    skipped: dict = field(default_factory=dict)           # algo -> why
    notes: list[str] = field(default_factory=list)

    def table(self) -> str:
        lines = [f"{'W':>2} {'size':>8} {'algorithm':<9} {'iters':>5} {'time (ms)':>10} {'algbw GB/s':>10} "
                 f"{'busbw GB/s':>10} {'model (ms)':>10}"]
        for r in self.rows:
            model = f"{r['model_seconds'] * 1e3:10.3f}" if r.get("model_seconds") is not None else f"{'-':>10}"
            lines.append(f"{r['ranks']:>2} {human(r['bytes']):>8} {r['algo']:<9} {r['iters']:>5} "
                         f"{r['seconds'] * 1e3:10.3f} {r['algbw'] / 1e9:10.3f} {r['busbw'] / 1e9:10.3f} {model}")
        return "\n".join(lines)

    def fit_table(self) -> str:
        lines = ["alpha-beta fit (T = a(W) alpha + b(W) n beta; Thakur, Rabenseifner & Gropp 2005):"]
        for algo, (alpha, beta) in self.fits.items():
            bw = f"{1 / beta / 1e9:.2f} GB/s" if beta > 0 else "inf"
            lines.append(f"  {algo:<6} alpha = {alpha * 1e6:8.1f} us   1/beta = {bw}")
        return "\n".join(lines)

    def ratios(self) -> list[dict]:
        """ring busbw / gloo busbw for each W and size >= 16 MiB."""
        out = []
        by = {(r["ranks"], r["bytes"], r["algo"]): r for r in self.rows}
        for (w, n, algo), r in sorted(by.items()):
            if algo == "ring" and n >= RATIO_FROM and (w, n, "gloo") in by:
                out.append({"ranks": w, "bytes": n, "ratio": r["busbw"] / by[(w, n, "gloo")]["busbw"]})
        return out

    def ratio_text(self) -> str:
        ratios = self.ratios()
        if not ratios:
            why = ("ring_allreduce was skipped, see below" if "ring" in self.skipped
                   else f"needs ring and gloo at {human(RATIO_FROM)} or more")
            return f"ring/gloo busbw: not measured ({why})"
        lines = [f"ring/gloo busbw at >= {human(RATIO_FROM)} (goal >= {GOAL}):"]
        for r in ratios:
            lines.append(f"  W={r['ranks']} {human(r['bytes']):>8}: {r['ratio']:.2f}")
        worst = min(r["ratio"] for r in ratios)
        lines.append(f"  lowest {worst:.2f}: goal {'met' if worst >= GOAL else 'NOT met'}")
        return "\n".join(lines)

    def text(self) -> str:
        parts = [self.table(), "", self.fit_table(), "", self.ratio_text()]
        parts += [f"skipped {a}: {why}" for a, why in self.skipped.items()] + self.notes
        return "\n".join(parts)

    def write_csv(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        cols = ["ranks", "bytes", "algo", "iters", "reps", "seconds", "algbw", "busbw", "model_seconds"]
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            w.writerows(self.rows)
        return path

    def plot(self, path=None):
        """Measured time (markers) against the fitted model (lines), one panel per W."""
        import matplotlib
        if path is not None:
            matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
        worlds = sorted({r["ranks"] for r in self.rows})
        fig, axes = plt.subplots(1, max(1, len(worlds)), figsize=(5.5 * max(1, len(worlds)), 4), squeeze=False)
        for ax, w in zip(axes[0], worlds):
            for i, algo in enumerate(ALGOS):
                mine = sorted((r for r in self.rows if r["ranks"] == w and r["algo"] == algo), key=lambda r: r["bytes"])
                if not mine:
                    continue
                colour = f"C{i}"
                x = [r["bytes"] for r in mine]
                ax.plot(x, [r["seconds"] * 1e3 for r in mine], "o", color=colour, label=f"{algo} measured")
                if all(r.get("model_seconds") is not None for r in mine):
                    ax.plot(x, [r["model_seconds"] * 1e3 for r in mine], "-", color=colour, alpha=0.6,
                            label=f"{algo} model")
            ax.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="time per all-reduce (ms)",
                   title=f"W = {w}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=110)
            plt.close(fig)
        return fig


def run_allreduce(path=SOLUTION, ranks=(2, 4), sizes=DEFAULT_SIZES, algos=ALGOS, quick=False, timeout: float = 600,
                  echo=print, sanity_timeout: float = 20, engine: str | None = None) -> BenchResult:
    """Time ``algos`` for each W and size where the site runs ranks (course_lib.runs), or on ``engine`` (notebook 04
    compares the fit with step times of Slurm jobs, so it measures in a Slurm job too); fit the model. An algorithm
    that hangs ``sanity_timeout`` s on a small tensor first is left out."""
    from course_lib import runs
    from course_lib.allreduce import costmodel as model
    result = BenchResult()
    for world in ranks:
        todo = list(algos)
        while todo:
            events = []

            def on_line(rank, line, events=events):
                ev = parse(line)
                if ev is not None:
                    events.append(ev)
                elif echo is not None and rank >= 0:
                    echo(f"[rank {rank}] {line}")

            with runs.session(WORKER_ENV, engine=engine):   # here: ranks forked from a server that imported torch once
                res = runs.launch(["-m", WORKER, os.path.abspath(path), "--sizes", ",".join(map(str, sizes)),
                                   "--algos", ",".join(todo), "--sanity-timeout", str(sanity_timeout)]
                                  + (["--quick"] if quick else []),
                                  nprocs=world, timeout=timeout, on_line=on_line, env=WORKER_ENV, engine=engine)
            for ev in events:
                if ev["ev"] == "skip":
                    result.skipped[ev["algo"]] = ev["why"]
                elif ev["ev"] == "stuck":
                    result.skipped[ev["fn"]] = (f"hung on a 1,009-element test ({ev.get('where') or 'no line'}); "
                                                "run `course check allreduce` on the file")
                elif ev["ev"] == "time":
                    ev["algbw"] = model.algbw(ev["bytes"], ev["seconds"])
                    ev["busbw"] = model.busbw(ev["bytes"], ev["seconds"], ev["ranks"])
                    result.rows.append(ev)
                    if echo is not None:
                        echo(f"W={world} {human(ev['bytes']):>8} {ev['algo']:<6} {ev['seconds'] * 1e3:9.3f} ms  "
                             f"busbw {ev['busbw'] / 1e9:6.3f} GB/s")
            done = any(ev["ev"] == "done" for ev in events)
            stuck = [ev["fn"] for ev in events if ev["ev"] == "stuck"]
            if done or not stuck:
                if not done:
                    result.notes.append(f"W={world}: the benchmark did not finish: {res.summary()}")
                break
            todo = [a for a in todo if a not in stuck]      # go on without the algorithm that hung
    for r in result.rows:
        r.pop("ev", None)
    for algo in [a for a in ALGOS if any(r["algo"] == a for r in result.rows)]:
        try:
            result.fits[algo] = model.fit(result.rows, algo)
        except ValueError as e:
            result.notes.append(f"no fit for {algo}: {e}")
    for r in result.rows:
        fit = result.fits.get(r["algo"])
        r["model_seconds"] = model.predict(r["algo"], r["ranks"], r["bytes"], *fit) if fit else None
    return result


def add_arguments(p):
    """The options of ``course bench allreduce`` (course_lib.bench dispatches the topics)."""
    p.add_argument("path", nargs="?", default=str(SOLUTION),
                   help="the allreduce.py to time (default: the reference solution)")
    p.add_argument("--ranks", action=comma_items(int), nargs="+", default=None, metavar="W[,W...]",
                   help="world sizes (default 2,4; --quick: 2)")
    p.add_argument("--sizes", action=comma_items(), nargs="+", default=None, metavar="SIZE[,SIZE...]",
                   help="message sizes, e.g. 4K,64K,1M,16M,64M (default 4 KiB .. 64 MiB, x4 steps)")
    p.add_argument("--algos", action=comma_items(choices=ALGOS), nargs="+", default=None, metavar="ALGO[,ALGO...]",
                   help=f"the algorithms to time ({','.join(ALGOS)}; default: all)")
    p.add_argument("--quick", action="store_true", help="few sizes and calls, W=2: a first look, CI")
    p.add_argument("--csv", help="write the measurements as CSV here")
    p.add_argument("--plot", help="write the measured-vs-model figure (PNG) here")
    p.add_argument("--timeout", type=float, default=900,
                   help="deadline in seconds of each multi-process run (one per world size)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def _error(message: str) -> int:
    print(f"course bench: {message}", file=sys.stderr)
    return 2


def run(args) -> int:
    """``course bench allreduce``: exit 0 measured, 1 a function of the file was left out (it failed the quick test or
    hung), 2 bad input or nothing measured (errors on stderr)."""
    default = QUICK_SIZES if args.quick else DEFAULT_SIZES
    try:
        sizes = [parse_size(s) for s in args.sizes] if args.sizes else list(default)
    except ValueError as e:
        return _error(str(e))
    ranks = args.ranks or ([2] if args.quick else [2, 4])
    if any(w < 2 for w in ranks):
        return _error("--ranks: an all-reduce benchmark needs at least 2 ranks")
    if not Path(args.path).is_file():
        return _error(f"no such file: {args.path} (give the path of an allreduce.py)")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"all-reduce benchmark: W={ranks}, sizes {human(min(sizes))} .. {human(max(sizes))}, float32, "
          f"gloo on {os.cpu_count()} CPU cores (load average {load:.1f}), file {args.path}")
    result = run_allreduce(args.path, ranks, sizes, tuple(args.algos or ALGOS), args.quick, args.timeout,
                           echo=None if args.quiet else print)
    print()
    print(result.text())
    if args.csv:
        print(f"wrote {result.write_csv(args.csv)}")
    if args.plot and result.rows:
        result.plot(args.plot)
        print(f"wrote {args.plot}")
    left_out = [a for a in args.algos or ALGOS if a in result.skipped]
    if left_out:
        print(f"course bench: left out: {', '.join(left_out)} (see 'skipped' above)", file=sys.stderr)
        return 1
    return 0 if result.rows else _error("nothing was measured: " + ("; ".join(result.notes) or "no rows"))
