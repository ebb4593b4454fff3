"""Check a DDP training script step by step: ``course check ddp PATH``.

The learner's script runs as real ranks (srun-style, the real torchrun and more ranks, side by side), each under
``course_lib.ddp.probe``, which watches torch from outside the learner's code and leaves one JSON record per rank.
It runs in a temporary folder (nothing of the learner's is touched) with ``--dataset digits --epochs 2
--save-model`` on a small subset of the data. From the records, one verdict per step:

1. process group: initialised on every rank, the right world size, distinct ranks
2. gradients averaged: the parameters are the same on every rank after training, and something
   (DistributedDataParallel over every rank, or the learner's own all_reduce, whose step used the mean of the
   ranks' gradients, not their sum: ``averaging``) averaged the gradients
3. data: disjoint shards that cover the data set each epoch, a new order each epoch (set_epoch)
4. device: the inputs on the model's device; each rank on its own GPU (verifiable only with GPUs)
5. checkpoint: written by rank 0 only, loads with ``strict=True`` into the plain ``Net``
6. launch: which launch styles work (srun's SLURM_* variables, torchrun's RANK/...), a clean shutdown, no barrier
   at every step (barriers only to time);
   a script for one launcher passes under the launcher it reads (``strict_launchers=True``: both required)

The extra ranks run as that many nodes of one rank each, and three short launches simulate a cluster on CPU
(``cluster``). The extra ranks and the two torchrun launches start once the ranks of a 2-rank launch have formed
one group: nothing is judged on them otherwise. A crash, a deadlock or a syntax error gets a verdict at the step it
stops (``failures``); every process is gone when ``check`` returns.
"""
import hashlib
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.core.report import Report
from course_lib.ddp import cluster, traffic
from course_lib.ddp.cluster import launch_all, launch_one
from course_lib.ddp.datajudge import train_loader
from course_lib.ddp.failures import describe_failure, waiting_in_init
from course_lib.ddp.launchers import step6
from course_lib.ddp.runs import Run, grouped, start_env, works
from course_lib.ddp.steps import asked_wrong, step1, step2, step3, step4, step5
from course_lib.runtime import warm
from course_lib.runtime.gpus import count as local_gpus

GPU_RANKS = cluster.GPU_NODES * cluster.GPU_PER_NODE
_CACHE: dict = {}
# what every rank imports, imported once by the fork server instead: what DDP imports, the probe's modules (the digits
# subset is made as datahooks is imported; the probe's read_json brings 16 modules of the runtime: 0.014 CPU-s a rank
# when each rank imported them) and what a training script imports of the course
PRELOAD = (*warm.DDP_IMPORTS, "course_lib.ddp.hooks", "course_lib.ddp.datahooks", "course_lib.ddp.simulate",
           "course_lib.checking.deadlock", "course_lib.runtime.job", "faulthandler", "course_lib.model",
           "course_lib.metrics")


def check(path: str, timeout: float = 120, styles=("srun", "torchrun"), more_ranks: int | None = 3,
          steps=None, cache: bool = True, stall: float | None = None, strict_launchers: bool = False,
          simulate: bool = True) -> Report:
    """Run the learner's DDP script and return one verdict per step (``steps``: only those, e.g. ``[3]``).

    ``timeout`` is the deadline of each multi-process run; a rank that waits longer than ``stall`` seconds in
    a collective counts as deadlocked (default: a quarter of ``timeout``, between 10 and 30 s). ``styles``: the
    launch styles to try (the first that works is the one Steps 1-5 are judged on); ``more_ranks``: also run
    with that many ranks (None: no). A repeated call on an unchanged file returns the cached verdicts
    (``cache=False``: run again). ``strict_launchers``: Step 6 requires every launch style in ``styles`` to work.
    ``simulate``: also the launches that simulate 2 nodes x 2 GPUs, ``srun torchrun`` and torchrun on 2 nodes.
    """
    script = Path(path).resolve()
    key = ((str(script), hashlib.sha256(script.read_bytes()).hexdigest(), timeout, tuple(styles), more_ranks, stall,
            strict_launchers, simulate) if script.is_file() else None)
    if cache and key in _CACHE:
        full, ran_at = _CACHE[key]
        return shown(full, path, steps, ran_at)
    start, full = time.monotonic(), Report("ddp", str(path))
    if key is None:
        for s in range(1, 7):
            full.add(f"Step {s}", False, f"no such file: {path}")
        return shown(full, path, steps)
    # one fork server for every launch; the runs' records are read in judge
    with warm.session(start_env(local_gpus() >= 2), PRELOAD), \
            tempfile.TemporaryDirectory(prefix="course-check-ddp-") as tmp:
        seen = _launch(script, Path(tmp), timeout, tuple(styles), more_ranks, stall, simulate)
        seen.strict = strict_launchers
        judge(full, seen)
    full.seconds = time.monotonic() - start
    _CACHE[key] = full, time.time()
    return shown(full, path, steps)


def shown(full: Report, path, steps=None, ran_at: float | None = None) -> Report:
    """``full``'s verdicts of ``steps`` (None: all), as the report of ``path``; ``ran_at``: they are the reused
    verdicts of the run at that time (``Reused``). ``check_slurm`` shows a job's verdicts with it too."""
    verdicts = full.verdicts
    if steps is not None:
        wanted = {f"Step {int(s)}" for s in ([steps] if isinstance(steps, int) else steps)}
        verdicts = [v for v in verdicts if v.item in wanted]
    if ran_at is None:
        return Report(full.exercise, str(path), verdicts, full.seconds)
    return Reused(full.exercise, str(path), verdicts, full.seconds, ran_at=ran_at)


@dataclass
class Reused(Report):
    """The verdicts of an earlier run of the unchanged file: said so, instead of its time as if it ran again."""
    ran_at: float = 0.0

    def _reused(self) -> str:
        return (f"the verdicts of the run at {time.strftime('%H:%M:%S', time.localtime(self.ran_at))} "
                f"({self.seconds:.1f} s), reused: the file has not changed since")

    def text(self) -> str:
        lines = super().text().splitlines()
        lines[-1] = f"{self.tally()}: {self._reused()}"
        return "\n".join(lines)

    __str__ = text

    def _repr_html_(self) -> str:
        return super()._repr_html_().replace(f" in {self.seconds:.1f} s</p>", f": {self._reused()}</p>", 1)


@dataclass
class Seen:
    """What the launches of one check showed: the records a judge turns into verdicts."""
    script: Path
    runs: dict                      # style -> the 2-rank Run under it
    primary: Run                    # the run Steps 1-5 are judged on
    more: Run | None                # the extra ranks, where they ran and the primary run works
    sims: dict = field(default_factory=dict)   # the simulated launches: "srun-torchrun", "nodes", "gpus"
    strict: bool = False            # Step 6 requires every launch style to work


def _launch(script: Path, root: Path, timeout: float, styles: tuple, more_ranks, stall, simulate: bool) -> Seen:
    """Every launch of the check, in ``root``: 2 ranks under each style, the extra ranks, the simulated cluster."""
    first, later = _jobs(styles, more_ranks, simulate)
    done = launch_all(first, script, root, timeout, stall, later, lambda: any(grouped(root, s) for s in styles))
    runs: dict = {}
    for style in styles:
        runs[style] = done[(cluster.PLAIN, style, 2)]
        failure = describe_failure(runs[style], script)
        if runs[style].result.timed_out or (failure and failure.message.startswith("deadlock")):
            break   # a deadlock would only repeat under the other launcher: judged as if it had not run
    primary = next((runs[s] for s in runs if works(runs[s])), None)
    # the simulated launches ran with the first style, which usually works; else again with the one that did
    style = primary.style if primary is not None else styles[0]
    sims = {sim.name: run for (sim, _, _), run in done.items() if sim.name}
    for sim, _, n in first + later:
        if sim.name in ("nodes", "gpus") and (sim, style, n) not in done:
            sims[sim.name] = (launch_one(sim, style, n, script, root, timeout, stall) if primary is not None
                              else None)
    if primary is None:
        primary = next((runs[s] for s in runs if runs[s].result.ok and runs[s].finished()), None) or runs[styles[0]]
    more = sims.get("nodes") if works(primary) else None
    return Seen(script, runs, primary, more, sims)


def _jobs(styles: tuple, more_ranks, simulate: bool) -> tuple[list, list]:
    """The launches to start at once (the GPU layout: Step 4 whatever else the script does), and those to start once
    the ranks of a 2-rank launch are in one group (``runs.grouped``): only a script that gets so far is judged on
    them."""
    first = [(cluster.PLAIN, style, 2) for style in styles]
    first += [(cluster.GPUS, styles[0], GPU_RANKS)] if simulate else []
    nodes = cluster.Sim("nodes", layout=(more_ranks, 1))   # the extra ranks, as that many nodes of one rank each
    later = [(nodes, styles[0], more_ranks)] if more_ranks and more_ranks != 2 else []
    if simulate and "torchrun" in styles:
        later += [(cluster.SRUN_TORCHRUN, "torchrun", 2), (cluster.TORCHRUN_NODES, "torchrun", GPU_RANKS)]
    return first, later


def judge(report: Report, seen: Seen) -> None:
    """One verdict per step from what the launches showed (a failure is placed at the step it stopped in)."""
    script, runs, primary, more, sims = seen.script, seen.runs, seen.primary, seen.more, seen.sims
    judged = {1: step1(primary), 2: step2(primary, more), 3: step3(primary, more),
              4: step4(primary, cluster.devices(sims.get("gpus"))), 5: step5(primary)}
    m = step1(more) if more is not None and not works(more) else None
    _fail(judged, 1, m and not m[0] and (False, f"with {more.nprocs} ranks: {m[1]}"))
    for name in ("gpus", "torchrun-nodes"):   # what only a second node shows (world size = GPU count, LOCAL_*)
        wrong = asked_wrong(sims.get(name))
        _fail(judged, 1, wrong and (False, f"on {cluster.layout_text(sims[name])}: {wrong[1]}"))
    # what the simulated nodes and launchers show
    _fail(judged, 1, cluster.srun_torchrun(sims.get("srun-torchrun"), runs.get("torchrun"))
          or cluster.master_addr([r for r in (primary, more) if r is not None]))
    _fail(judged, 2, cluster.subgroup([more, sims.get("gpus")]))
    _fail(judged, 5, cluster.writers(more, primary))
    failed = next((s for s in (1, 2) if judged[s] and not judged[s][0]), None)
    note = cluster.not_followed(sims.get("gpus"), script, fix_first=failed)
    if judged[4] and note:
        judged[4] = (judged[4][0], judged[4][1] + note)
    failure = describe_failure(primary, script)
    if failure is not None and failure.step == 6:   # it failed in destroy_process_group: Steps 1-5 ran to their end
        judged[5] = step5(primary, left_the_group=True)
    target = _place_failure(judged, failure, primary) if failure is not None else None
    also = ("`srun torchrun`",) if sims.get("srun-torchrun") and works(sims["srun-torchrun"]) else ()
    judged[6] = step6(runs, primary, more, script, failure, target, seen.strict, also)
    if primary.finished():   # barriers at every step: the notebook's Step 6 keeps them for timing
        _fail(judged, 6, traffic.barriers([train_loader(primary.rec(r)) for r in range(primary.nprocs)]))
    for s in range(1, 7):
        ok, message = judged[s]
        report.add(f"Step {s}", ok, message)


def _fail(judged: dict, step: int, verdict) -> None:
    """A failure found on another launch replaces ``step``'s pass (not an earlier failure: that one is the first)."""
    if verdict and judged[step] and judged[step][0]:
        judged[step] = verdict


def _place_failure(judged: dict, failure, primary: Run) -> int:
    """Put a crash or deadlock at the step it happened in; the steps after it were not seen. Returns that step."""
    if judged[1] is None and failure.message.startswith("deadlock"):
        failure.message += waiting_in_init(primary)
    # the step the probe saw it happen in; else the first step the run did not get far enough to judge
    target = failure.step
    if target is None or (judged.get(target) is not None and judged[target][0]):   # Step 6 is judged after
        target = next((s for s in range(1, 6) if judged[s] is None), 6)
    if target < 6 and (judged[target] is None or judged[target][0]):
        judged[target] = (False, failure.message)
    crash = failure.message.splitlines()[0]   # rank, line and error, at every step it hid
    for s in range(1, 6):
        if judged[s] is None:
            # a step before the one it is filed at may be where the mistake is (DDP's device_ids in Step 2, filed
            # at Step 4): its row carries the hint too
            judged[s] = (False, f"not checked: the run stopped before this step could be seen: {crash}"
                                + (failure.hint if s < target else ""))
    return target
