"""Trace one step on N ranks where the site runs them (``course_lib.runs``: a deadline, nothing left running)."""
import tempfile
from pathlib import Path

from course_lib import runs
from course_lib.core.paths import out_dir
from course_lib.runtime.warm import DDP_IMPORTS
from course_lib.trace.timeline import Timeline, from_chrome_trace


class TraceError(RuntimeError):
    """The traced step did not run: what the ranks said."""


def profile_step(nprocs: int = 2, bucket_cap_mb: float | None = None, batch_size: int = 64, out=None,
                 timeout: float = 180, env: dict | None = None) -> list[Timeline]:
    """One traced step of the CNN on ``nprocs`` ranks (1: serial); the ranks' timelines, rank 0 first.

    ``bucket_cap_mb=None`` leaves DDP's default: a first bucket of 1 MiB, then 25 MiB; a number given applies to
    every bucket, the first included (torch/nn/parallel/distributed.py, ``_BucketConfig``). The traces land in
    ``out`` (default: the workspace's ``out/trace/W<nprocs>-cap<bucket_cap_mb>``).
    """
    outs = None if out is None else {bucket_cap_mb: out}
    return profile_steps(nprocs, [bucket_cap_mb], batch_size, outs, timeout, env)[bucket_cap_mb]


def profile_steps(nprocs: int, caps, batch_size: int = 64, outs: dict | None = None, timeout: float = 180,
                  env: dict | None = None) -> dict:
    """``profile_step`` for each bucket cap in ``caps``, all in one launch of the ranks: {cap: timelines}.

    Each cap gets a fresh model and DDP wrapper in the same processes, so start-up is paid once. ``outs`` maps a
    cap to its folder (default: the workspace's ``out/trace/W<nprocs>-cap<cap>``).
    """
    outs = dict(outs or {})
    pairs = []
    for cap in caps:
        folder = Path(outs.get(cap) or out_dir() / "trace" / f"W{nprocs}-cap{'default' if cap is None else cap}")
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("trace-rank*.json"):
            old.unlink()
        outs[cap] = folder
        pairs += ["--trace", str(folder), "default" if cap is None else str(cap)]
    with runs.session(env, DDP_IMPORTS):   # here: ranks forked from a server that imported torch and DDP's imports once
        result = runs.launch(["-m", "course_lib.trace.step", *pairs, "--batch-size", str(batch_size)],
                             nprocs=nprocs, timeout=timeout, env=env, on_line=None, cwd=tempfile.gettempdir())
    if not result.ok:
        raise TraceError("the traced step failed: " + result.summary())
    return {cap: [from_chrome_trace(outs[cap] / f"trace-rank{r}.json", r) for r in range(nprocs)] for cap in caps}


def summary(timelines: list[Timeline]) -> str:
    """A line per rank: step time, all-reduce time and buckets, overlap, exposed wait."""
    lines = []
    for tl in timelines:
        ph = "  ".join(f"{p} {b - a:6.1f}" for p, (a, b) in tl.phases.items())
        lines.append(f"rank {tl.rank}: step {tl.step_ms:6.1f} ms ({ph})" + (
            f" | {len(tl.allreduce)} all-reduce(s) {tl.allreduce_ms:6.1f} ms, {tl.overlap:4.0%} during backward "
            f"compute, {tl.exposed_ms:5.1f} ms after it" if tl.allreduce else ""))
    return "\n".join(lines)
