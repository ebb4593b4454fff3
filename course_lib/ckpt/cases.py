"""The cases of ``course check ckpt PATH`` (exercises/08_checkpoint/snapshot.py), on 2 gloo ranks (course_lib.checking
runs them), then notebook 08's experiment (resume.py): save, load into fresh objects and compare piece by piece, a
second save watched call by call, then a save that dies halfway through its first write (``crash.CrashingWrite``)
and, in a fresh launch, the restart that loads what it left. Each case builds on the one before: the first failure
ends the run. The verdicts are judged in verdicts.py.
"""
import copy
import dataclasses
import functools
import hashlib
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from course_lib import checking
from course_lib.checking.case import Case, Fail, need
from course_lib.checking.learner import error_where
from course_lib.checking.protocol import plugin
from course_lib.ckpt import audit, compare, nodes, snapfile
from course_lib.ckpt.compare import file_hash
from course_lib.ckpt.crash import CrashingWrite
from course_lib.ckpt.curves import RANK_ENV
from course_lib.ckpt.verdicts import RESAVE, SNAPSHOT, WORLD, failure, summarise
from course_lib.core.rankkit import exit_now
from course_lib.core.report import Report

FILE = LOAD_ITEM = "snapshot.py"
ITEMS = ("model", "optimizer", "scheduler", "position", "RNG states", "rank 0 writes", "atomic write", "resume")
WORLDS = (WORLD,)
GUARD = ((), "count")
ENV = RANK_ENV
STOP_AT_FAILURE = True
POSITION = (2, 5)          # saved mid-epoch: epoch 2, 5 batches done
SPEC = sys.modules[__name__]   # this module, as the harness's runner takes a cases module


def check(path: str, timeout: float = 240, resume: bool = True, call_timeout: float = 60) -> Report:
    """Check the learner's file at ``path``; ``timeout`` bounds each multi-process run, ``call_timeout`` each call
    of save_snapshot or load_snapshot; ``resume=False`` leaves out the torchrun experiment (the slow part)."""
    from course_lib.checking import runner
    from course_lib.ckpt.resume import resume_verdict
    from course_lib.runtime import warm
    start, path = time.monotonic(), str(path)
    with warm.session(RANK_ENV, warm.DDP_IMPORTS), tempfile.TemporaryDirectory(prefix="ckpt-check-") as tmp:
        # one fork server for the ranks, the reference and the torchrun runs, which imported what DDP imports once
        # (torch._dynamo: most of a rank's CPU, in each launch, when every rank imported it); the crash ends the
        # first launch, so the harness waits for the cases up to it, and the restart after it is a launch of its own
        before_crash = dataclasses.replace(plugin(SPEC), cases=lambda world: cases(world)[:-1])
        records, unloadable, general = runner.run_worlds("ckpt", before_crash, path, WORLDS, timeout, call_timeout,
                                                         cwd=tmp)
        by = {rec.item: rec for rec in records}
        left = crash_left(Path(tmp) / SNAPSHOT)    # before the restart's load_snapshot, which may change it
        if unloadable is None and crashed(by):
            done = {c.key(WORLD) for c in cases(WORLD)[:-1]}
            records += runner.launch_once("ckpt", SPEC, [path], WORLD, timeout, call_timeout, skip=done,
                                          cwd=tmp).records.values()
        report = checking.report("ckpt", SPEC, path, records, unloadable, general, start,
                                 judge=functools.partial(summarise, left=left))
        if unloadable is not None:
            return report
        if resume and (failure(by, "save") or failure(by, "load")):
            report.add("resume", False, "not tried: save_snapshot and load_snapshot must run without an error first")
        elif resume:
            resume_verdict(report, path, timeout)
    report.seconds = time.monotonic() - start
    return report


def crash_left(snapshot: Path) -> tuple:
    """(sha256, size) of the snapshot as the crash left it; (None, 0) when there was none."""
    return file_hash(snapshot), snapshot.stat().st_size if snapshot.is_file() else 0


def crashed(by: dict) -> bool:
    """A rank died in the crash case, as it was made to."""
    rec = by.get("crash")
    return rec is not None and any((v.get("figures") or {}).get("crash") for v in rec.verdicts.values())


def cases(world: int) -> list[Case]:
    return [Case("save", "save", save), Case("load", "load", load), Case("resave", "resave", resave),
            Case("crash", "crash", crash), Case("reload", "reload", reload)]


# ---- the cases (in each rank) ----------------------------------------------------------------------------------
def learner_call(ctx, phase: str, name: str, *args):
    """The learner's function ``name``; an exception becomes a Fail that names the phase, the rank and the line."""
    import traceback
    fn = need(ctx.mod, name, FILE)
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - the learner's code may raise anything; report it
        traceback.print_exc()
        where = error_where(exc, ctx.path)
        at = f" at {where}" if where else ""
        raise Fail(f"{phase}_snapshot raised on rank {ctx.rank}{at}: {type(exc).__name__}: {error_text(exc)}",
                   where=where) from None


def error_text(exc: Exception, limit: int = 500) -> str:
    """The exception's text without terminal colour codes or repeated lines; when long, its first line and the
    lines that name the cause (torch's weights_only error names the refused type in a line of its own)."""
    lines = list(dict.fromkeys(line.rstrip() for line in snapfile.ANSI.sub("", str(exc)).splitlines() if line.strip()))
    text = "\n".join(lines)
    if len(text) <= limit:
        return text
    named = [line.strip() for line in lines[1:] if "Unsupported global" in line or "WeightsUnpickler error" in line]
    text = "\n".join([lines[0][:300], *named[:2]]) + " [...]"
    if named and "numpy" in text:
        text += ("\nweights_only=True reads tensors and plain values only: put NumPy's key array in as an int64 "
                 "tensor, torch.from_numpy(keys.astype(np.int64)), not as an array (and not weights_only=False)")
    return text


def save(ctx):
    """The first save, into a folder below the ranks' own (a temporary file made in the current folder shows)."""
    model, optimizer, scheduler = training_objects(seed=0)
    train_a_little(model, optimizer, scheduler, ctx.rank)
    set_generators(100 + ctx.rank)
    ctx.cache.update(objects=(model, optimizer, scheduler), truth=snapshot_of(model, optimizer, scheduler),
                     rng_before=generators())
    os.makedirs(os.path.dirname(SNAPSHOT), exist_ok=True)
    problem = None
    # as 2 nodes of one rank each: a writer chosen by its local rank shows as a second writer
    with audit.WriteAudit(ctx.mod) as writes, nodes.environment(nodes.two_nodes(ctx.rank, ctx.world)):
        try:
            learner_call(ctx, "save", "save_snapshot", SNAPSHOT, model, optimizer, scheduler, *POSITION)
        except Fail as e:
            problem = e
    ctx.cache["rng"] = generators()     # where the run goes on from: a resumed run must get this back
    everyone = ctx.agree(problem is None)      # every rank's save is over before rank 0 reads the file
    mine = ctx.rank == 0 and writes.writes
    figures = {"writes": writes.writes, "sha": file_hash(SNAPSHOT) if ctx.rank == 0 else None,
               "how": snapfile.write_problem(writes.renames, SNAPSHOT, writes.writes) if mine else None}
    if problem is not None:
        problem.figures = figures
        raise problem
    if not everyone:
        raise Fail("another rank failed", figures=figures)
    return "", figures


def load(ctx):
    import torch.distributed as dist
    fresh = training_objects(seed=999)
    set_generators(999)
    # as 2 nodes again: an RNG state picked by the local rank gives rank 1 rank 0's
    with audit.LoadAudit(ctx.mod) as loads, nodes.environment(nodes.two_nodes(ctx.rank, ctx.world)):
        position = learner_call(ctx, "load", "load_snapshot", SNAPSHOT, *fresh)
    rngs = [None] * ctx.world
    dist.all_gather_object(rngs, ctx.cache["rng"], group=ctx.sync)
    restored, got_rng = snapshot_of(*fresh), generators()
    local = by_local(ctx, compare.borrowed(ctx.cache["rng"], got_rng, rngs, ctx.rank))
    got = compare.restored(ctx.cache["truth"], ctx.cache["rng"], restored, got_rng, position, POSITION, rngs,
                           ctx.rank, ctx.cache["rng_before"], by_local=local)
    # the file itself, as a run that is not this one reads it (rank 0: one reader is enough)
    elsewhere = snapfile.load_problem(loads.weights_only, loads.unpickled) or (
        (gone() or snapfile.model_problem(SNAPSHOT)) if ctx.rank == 0 else None)
    if got["model"][0] and elsewhere:
        got["model"] = [False, elsewhere]
    return "", {"restored": got}


def by_local(ctx, borrowed: bool) -> bool:
    """When a rank got rank 0's generators on 2 nodes: whether it gets its own on one node (every rank loads again,
    as the learner's load may hold collectives): the state was picked by the local rank."""
    if ctx.agree(not borrowed):
        return False
    set_generators(999)
    with nodes.environment(nodes.one_node(ctx.rank, ctx.world)):
        learner_call(ctx, "load", "load_snapshot", SNAPSHOT, *training_objects(seed=999))
    return borrowed and generators() == ctx.cache["rng"]


def gone() -> str | None:
    if os.path.isfile(SNAPSHOT):
        return None
    return (f"after load_snapshot there was no {os.path.basename(SNAPSHOT)}: load_snapshot deleted it (or moved it "
            "away). A run killed again before its next save would find no snapshot and begin again at step 1; leave "
            "the snapshot in place (the next save replaces it)")


def resave(ctx):
    """A second save over the first, the file watched after each of the learner's calls that name it: a moment
    with no whole snapshot there (deleted, moved away, half written) is a moment a crash could hit. The ranks run
    as torchrun inside an sbatch script runs them: a writer picked by SLURM_PROCID shows as a second writer."""
    model, optimizer, scheduler = ctx.cache["objects"]
    before, problem = file_hash(SNAPSHOT), None
    with audit.WriteAudit(ctx.mod) as writes, audit.PathWatch(ctx.mod, SNAPSHOT) as watch, \
            nodes.environment(nodes.torchrun_in_batch(ctx.rank, ctx.world)):
        try:
            learner_call(ctx, "save", "save_snapshot", SNAPSHOT, model, optimizer, scheduler, *RESAVE)
        except Fail as e:
            problem = e
    if not ctx.agree(problem is None):     # every rank's save is over before the file is read
        problem = problem or Fail("another rank failed")
        problem.figures = {"writes": writes.writes}
        raise problem
    after = file_hash(SNAPSHOT)
    return "", {"sha": after if ctx.rank == 0 else None, "writes": writes.writes,
                "gap": snapfile.gap_problem(watch.states, before, after, SNAPSHOT)}


def crash(ctx):
    """The second save, with its first write to a file dying halfway: the rank that writes says so, then dies; a rank
    whose save returns leaves at once too (its partner is gone: nothing more can be agreed)."""
    model, optimizer, scheduler = ctx.cache["objects"]
    train_a_little(model, optimizer, scheduler, ctx.rank, steps=1)
    with CrashingWrite(ctx.mod, on_crash=lambda target: ctx.say(True, figures={"crash": target})):
        learner_call(ctx, "crash-save", "save_snapshot", SNAPSHOT, model, optimizer, scheduler, 3, 1)
    ctx.say(True, figures={"crash_done": True})
    exit_now(0)


def reload(ctx):
    """The restart after the crash (a launch of its own): every rank's load_snapshot must go on from the last whole
    snapshot, the second save's, whatever the crash left beside it."""
    fresh, got = training_objects(seed=999), {}
    with audit.LoadAudit(ctx.mod) as loads:
        try:
            got["position"] = list(learner_call(ctx, "load", "load_snapshot", SNAPSHOT, *fresh))
        except Fail as e:
            got["error"] = str(e)
        except (TypeError, ValueError):      # not a pair: "position" said so already
            got["position"] = None
    saved = snapfile.model_of(SNAPSHOT)
    if saved is not None and "error" not in got:
        got["model"] = compare.model_verdict(saved, fresh[0].module.state_dict())[0]
    got["read"] = loads.read + loads.unpickled
    return "", {"reload": got}


def training_objects(seed: int):
    """A DDP-wrapped Net with Adadelta and StepLR, as the course's loop builds them."""
    import torch

    from course_lib.ckpt.train import training_objects
    torch.manual_seed(seed)
    return training_objects()


def train_a_little(model, optimizer, scheduler, rank: int, steps: int = 2) -> None:
    import torch
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(10 + rank)
    for _ in range(steps):
        data, target = torch.randn(8, 1, 28, 28, generator=g), torch.randint(0, 10, (8,), generator=g)
        optimizer.zero_grad()
        F.nll_loss(model(data), target).backward()
        optimizer.step()
    scheduler.step()


def set_generators(seed: int) -> None:
    import numpy as np
    import torch

    from course_lib.ckpt.train import seed_all
    seed_all(seed)
    torch.rand(seed % 7 + 1)        # not a freshly seeded state: a state that only a snapshot can give back
    np.random.standard_normal()     # NumPy's second normal of the pair is cached: has_gauss=1 must come back too


def generators() -> dict:
    """Fingerprints of this process's generators (CUDA's too when there is one)."""
    import numpy as np
    import torch
    name, keys, pos, has_gauss, cached = np.random.get_state()
    states = {"torch": torch.get_rng_state().numpy().tobytes(), "python": repr(random.getstate()).encode(),
              "numpy": repr((name, pos)).encode() + keys.tobytes(), "numpy_gauss": repr((has_gauss, cached)).encode()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state().numpy().tobytes()
    return {k: hashlib.sha256(v).hexdigest()[:16] for k, v in states.items()}


def snapshot_of(model, optimizer, scheduler) -> dict:
    return {"model": {k: v.detach().clone() for k, v in model.module.state_dict().items()},
            "optimizer": copy.deepcopy(optimizer.state_dict()), "scheduler": copy.deepcopy(scheduler.state_dict())}
