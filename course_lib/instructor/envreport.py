"""What this machine offers the course: torch, devices, backend, Slurm or local, data.

``course show env`` prints it; notebook 00 shows the same table.
"""
import os
import platform
import sys


def collect() -> dict:
    """The facts, as a dict of short strings (so a notebook can show them as a table)."""
    import torch
    import torch.distributed as dist

    from course_lib import data, jobs

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    backends = [b for b, ok in (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available()),
                                ("mpi", dist.is_mpi_available())) if ok]
    engine, why = jobs.engine()
    dataset, folder = data.resolve("auto", quiet=True)
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu cores": str(os.cpu_count()),
        "gpus": ", ".join(f"{i}: {n}" for i, n in enumerate(gpus)) or "none (CPU only)",
        "backend": _backend(len(gpus), "nccl" in backends),
        "backends built in": ", ".join(backends) or "none",
        "jobs run with": f"{'Slurm' if engine == 'slurm' else 'local processes'} ({why})",
        "in a Slurm job": os.environ.get("SLURM_JOB_ID", "no"),
        "site profile": os.environ.get("COURSE_SITE", "none (COURSE_SITE unset)"),
        "data dir": str(data.default_data_dir()),
        "--dataset auto": f"{dataset} ({folder})" if folder else f"{dataset} (bundled with scikit-learn)",
    }


def _backend(gpus: int, nccl: bool) -> str:
    """The backend of the course's 2-rank runs here: NCCL needs a GPU per rank (it refuses two on one GPU)."""
    if gpus >= 2 and nccl:
        return "nccl (a GPU per rank)"
    if gpus == 1:
        return "gloo (CPU): one GPU, and NCCL needs one per rank, so the 2-rank runs hide it"
    return "gloo (CPU)"


# run from the folder that holds course_lib (``-c`` puts it on sys.path), so the ranks import this course_lib
ALL_REDUCE = """
import torch, torch.distributed as dist
from course_lib.core.rankkit import rank_env
me = rank_env()
dist.init_process_group("gloo", rank=me.rank, world_size=me.world_size)
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("sum", int(t.item()))
dist.destroy_process_group()
"""


def self_check(ranks: int = 2, timeout: float = 60):
    """Is this machine ready for the course? torch, data, and ``ranks`` local processes doing an all-reduce."""
    import time

    from course_lib import data
    from course_lib.core.paths import PACKAGE_PARENT
    from course_lib.core.report import Report
    from course_lib.runtime.launch import launch

    report, start = Report("setup", "this machine"), time.monotonic()
    try:
        import torch
        report.add("torch", True, f"torch {torch.__version__}")
    except ImportError as e:
        report.add("torch", False, f"{e}: install the course with `make lab` (or `make lab SITE_TORCH=1`)")
        return report
    try:
        train, test = data.load_dataset("auto", quiet=True)
        report.add("data", True, f"{train.name}: {len(train)} training and {len(test)} test images")
    except data.DataError as e:
        report.add("data", False, str(e))
    res = launch(["-c", ALL_REDUCE], ranks, timeout=timeout, on_line=None, cwd=PACKAGE_PARENT)
    expected = ranks * (ranks + 1) // 2
    sums = [line for r in res.ranks for line in r.lines if line.startswith("sum")]
    ok = res.ok and sums == [f"sum {expected}"] * ranks
    report.add(f"{ranks} ranks (gloo)", ok, f"all_reduce of 1..{ranks} gave {expected} on every rank in "
               f"{res.elapsed:.1f} s" if ok else res.summary())
    report.seconds = time.monotonic() - start
    return report


def add_arguments(p):
    pass


def run(args) -> int:
    try:
        facts = collect()
    except (ValueError, RuntimeError) as e:   # COURSE_ENGINE names no engine, or asks for a Slurm not there
        print(f"course show env: {e}", file=sys.stderr)
        return 2
    width = max(map(len, facts))
    print("\n".join(f"{k:<{width}}  {v}" for k, v in facts.items()))
    return 0
