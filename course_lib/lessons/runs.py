"""Is a finished job the run a lesson assumes? A reveal or a measured lesson asks first, and says what ran instead.

Notebooks 03 and 04 run the learner's own ``exercises/02_ddp`` script. Before notebook 02 is finished that script
trains every "rank" alone on the whole data set (no process group, no DistributedSampler): equal losses on every
rank, no speedup. A lesson drawn from such a run teaches the opposite of the truth, so it is not drawn.
"""
import re

WHAT_TO_DO = ('finish notebook 02 (Step 1, the process group; Step 3, the DistributedSampler) and run these cells '
              'again, or set TREE = "solutions" in the parameters cell to see this lesson on the reference script')
DEVICE = re.compile(r"\bdevice=(\S+)")


def shares(job) -> list[float]:
    """images_per_s / images_per_s_rank of each epoch line: the number of ranks the data was split over."""
    return [r["images_per_s"] / r["images_per_s_rank"] for r in job.metrics(rank=None) if r.get("images_per_s_rank")]


def ddp_problem(job, ranks: int) -> str | None:
    """None when ``job`` completed with ``ranks`` ranks that each trained 1/ranks of the data (on a GPU where the
    job asked for GPUs); otherwise one sentence on what ran instead."""
    if job is None:
        return "the job was not submitted"
    if job.state != "COMPLETED":
        return f"the job ended {job.state}, not COMPLETED (its summary above says why)"
    seen = sorted({r["rank"] for r in job.metrics(rank=None)})
    if seen != list(range(ranks)):
        return f"epoch lines came from ranks {seen}, not from ranks 0..{ranks - 1}"
    split = shares(job)
    if ranks > 1 and not (split and all(abs(x - ranks) <= 0.25 * ranks for x in split)):
        return (f"each of the {ranks} processes trained on the whole data set by itself (images_per_s / "
                f"images_per_s_rank = {split[0] if split else float('nan'):.2f}, not {ranks}): {ranks} serial runs "
                "side by side, not one DDP run")
    devices = set(DEVICE.findall(job.log()))
    if getattr(job.spec, "gpus_per_node", 0) and not any(d.startswith("cuda") for d in devices):
        return f"the job asked for GPUs but trained on {', '.join(sorted(devices)) or 'an unknown device'}"
    return None


def caveat(problem: str) -> str:
    """The message a lesson prints in place of its conclusion."""
    return f"This is not the run the lesson assumes: {problem}. To see the lesson, {WHAT_TO_DO}."
