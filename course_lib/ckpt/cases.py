"""The cases of ``course check ckpt PATH`` (exercises/08_checkpoint/snapshot.py), on 2 gloo ranks (course_lib.checking
runs them), then notebook 08's experiment (resume.py): save, load into fresh objects and compare piece by piece, then
a save that dies halfway (``audit.CrashingSave``). Each case builds on the one before: the first failure ends the run.
"""
import copy
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
from course_lib.ckpt import audit, snapfile
from course_lib.ckpt.compare import file_hash
from course_lib.ckpt.curves import RANK_ENV
from course_lib.core.rankkit import exit_now
from course_lib.core.report import Report

FILE = LOAD_ITEM = "snapshot.py"
ITEMS = ("model", "optimizer", "scheduler", "position", "RNG states", "rank 0 writes", "atomic write", "resume")
RESTORED = ITEMS[:5]
WORLD = 2
WORLDS = (WORLD,)
GUARD = ((), "count")
ENV = RANK_ENV
STOP_AT_FAILURE = True
SNAPSHOT = "snapshot.pt"   # in the folder the ranks run in
POSITION = (2, 5)          # saved mid-epoch: epoch 2, 5 batches done
RESAVE = (3, 0)            # the second snapshot, over the first, watched call by call
SEE_ABOVE = "not tested: the error above (under model) stopped the check before this piece"
SPEC = sys.modules[__name__]   # this module, as the harness's runner takes a cases module


def check(path: str, timeout: float = 240, resume: bool = True, call_timeout: float = 60) -> Report:
    """Check the learner's file at ``path``; ``timeout`` bounds each multi-process run, ``call_timeout`` each call
    of save_snapshot or load_snapshot; ``resume=False`` leaves out the torchrun experiment (the slow part)."""
    from course_lib.checking import runner
    from course_lib.ckpt.resume import resume_verdict
    from course_lib.runtime import warm
    start, path = time.monotonic(), str(path)
    with warm.session(RANK_ENV), tempfile.TemporaryDirectory(prefix="ckpt-check-") as tmp:
        # one fork server for the ranks, the reference and the torchrun runs
        records, unloadable, general = runner.run_worlds("ckpt", SPEC, path, WORLDS, timeout, call_timeout, cwd=tmp)
        report = checking.report("ckpt", SPEC, path, records, unloadable, general, start,
                                 judge=functools.partial(summarise, snapshot=Path(tmp) / SNAPSHOT))
        if unloadable is not None:
            return report
        by = {rec.item: rec for rec in records}
        if resume and (failure(by, "save") or failure(by, "load")):
            report.add("resume", False, "not tried: save_snapshot and load_snapshot must run without an error first")
        elif resume:
            resume_verdict(report, path, timeout)
    report.seconds = time.monotonic() - start
    return report


def cases(world: int) -> list[Case]:
    return [Case("save", "save", save), Case("load", "load", load), Case("resave", "resave", resave),
            Case("crash", "crash", crash)]


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
    model, optimizer, scheduler = training_objects(seed=0)
    train_a_little(model, optimizer, scheduler, ctx.rank)
    set_generators(100 + ctx.rank)
    ctx.cache.update(objects=(model, optimizer, scheduler), truth=snapshot_of(model, optimizer, scheduler),
                     rng_before=generators())
    problem = None
    # as 2 nodes of one rank each: a writer chosen by its local rank shows as a second writer
    with audit.WriteAudit(ctx.mod) as writes, audit.one_rank_per_node(ctx.rank, ctx.world):
        try:
            learner_call(ctx, "save", "save_snapshot", SNAPSHOT, model, optimizer, scheduler, *POSITION)
        except Fail as e:
            problem = e
    ctx.cache["rng"] = generators()     # where the run goes on from: a resumed run must get this back
    everyone = ctx.agree(problem is None)      # every rank's save is over before rank 0 reads the file
    figures = {"writes": writes.writes, "sha": file_hash(SNAPSHOT) if ctx.rank == 0 else None,
               "how": snapfile.write_problem(writes.renames, SNAPSHOT) if ctx.rank == 0 and writes.writes else None}
    if problem is not None:
        problem.figures = figures
        raise problem
    if not everyone:
        raise Fail("another rank failed", figures=figures)
    return "", figures


def load(ctx):
    import torch.distributed as dist

    from course_lib.ckpt import compare
    fresh = training_objects(seed=999)
    set_generators(999)
    with audit.LoadAudit(ctx.mod) as loads:
        position = learner_call(ctx, "load", "load_snapshot", SNAPSHOT, *fresh)
    rngs = [None] * ctx.world
    dist.all_gather_object(rngs, ctx.cache["rng"], group=ctx.sync)
    got = compare.restored(ctx.cache["truth"], ctx.cache["rng"], snapshot_of(*fresh), generators(), position,
                           POSITION, rngs, ctx.rank, ctx.cache["rng_before"])
    # the file itself, as a run that is not this one reads it (rank 0: one reader is enough)
    elsewhere = snapfile.load_problem(loads.weights_only) or (snapfile.model_problem(SNAPSHOT) if ctx.rank == 0
                                                              else None)
    if got["model"][0] and elsewhere:
        got["model"] = [False, elsewhere]
    return "", {"restored": got}


def resave(ctx):
    """A second save over the first, the file watched after each of the learner's calls that name it: a moment
    with no whole snapshot there (deleted, moved away, half written) is a moment a crash could hit."""
    model, optimizer, scheduler = ctx.cache["objects"]
    before, problem = file_hash(SNAPSHOT), None
    with audit.PathWatch(ctx.mod, SNAPSHOT) as watch:
        try:
            learner_call(ctx, "save", "save_snapshot", SNAPSHOT, model, optimizer, scheduler, *RESAVE)
        except Fail as e:
            problem = e
    if not ctx.agree(problem is None):     # every rank's save is over before the file is read
        raise problem or Fail("another rank failed")
    after = file_hash(SNAPSHOT)
    return "", {"sha": after if ctx.rank == 0 else None,
                "gap": snapfile.gap_problem(watch.states, before, after, SNAPSHOT)}


def crash(ctx):
    """The second save, with torch.save dying halfway: the rank that writes says so, then dies; a rank whose save
    returns leaves at once too (its partner is gone: nothing more can be agreed)."""
    model, optimizer, scheduler = ctx.cache["objects"]
    train_a_little(model, optimizer, scheduler, ctx.rank, steps=1)
    with audit.CrashingSave(ctx.mod, on_crash=lambda target: ctx.say(True, figures={"crash": target})):
        learner_call(ctx, "crash-save", "save_snapshot", SNAPSHOT, model, optimizer, scheduler, 3, 1)
    ctx.say(True, figures={"crash_done": True})
    exit_now(0)


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
    import torch

    from course_lib.ckpt.train import seed_all
    seed_all(seed)
    torch.rand(seed % 7 + 1)        # not a freshly seeded state: a state that only a snapshot can give back


def generators() -> dict:
    """Fingerprints of this process's generators (CUDA's too when there is one)."""
    import numpy as np
    import torch
    states = {"torch": torch.get_rng_state().numpy().tobytes(), "python": repr(random.getstate()).encode(),
              "numpy": repr(np.random.get_state()[1:]).encode() + np.random.get_state()[1].tobytes()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state().numpy().tobytes()
    return {k: hashlib.sha256(v).hexdigest()[:16] for k, v in states.items()}


def snapshot_of(model, optimizer, scheduler) -> dict:
    return {"model": {k: v.detach().clone() for k, v in model.module.state_dict().items()},
            "optimizer": copy.deepcopy(optimizer.state_dict()), "scheduler": copy.deepcopy(scheduler.state_dict())}


# ---- the verdicts (in the checker) -----------------------------------------------------------------------------
PHASES = {"save": "save", "load": "load", "resave": "save", "crash": "crash-save"}


def failure(by: dict, case: str) -> str | None:
    """The message for an error or a hang in ``case`` (save, load, crash) on some rank, if any."""
    rec = by.get(case)
    if rec is None:
        return None
    bad = [v for _, v in sorted(rec.verdicts.items()) if not v["ok"] and not v.get("other")]
    if rec.ended == "hung" and all(v.get("kind") == "peer_gone" for v in bad):
        silent = set(range(WORLD)) - set(rec.verdicts)
        located = {r for r, at in rec.stuck.items() if at}   # a rank that said where it waits, first
        rank = min(located & silent or located or set(rec.stuck) & silent or silent or set(rec.stuck))
        at = f" at {rec.stuck[rank]}" if rec.stuck.get(rank) else ""
        name = f"{PHASES[case]}_snapshot"
        if rec.deadlock:    # every rank was seen waiting on another: say where each one waited
            others = [f"rank {r} waited at {where}" if where else f"rank {r} had returned from {name} and waited "
                      f"for rank {rank}" for r, where in sorted(rec.stuck.items()) if r != rank]
            return (f"{name} did not return on rank {rank}{at}: a deadlock, seen after {rec.waited:.0f} s "
                    f"({'; '.join(others + ['no rank could go on'])}): "
                    "a collective that not every rank calls waits forever")
        return (f"{name} did not return on rank {rank} within {rec.seconds:.0f} s{at}: "
                "a collective that not every rank calls waits forever")
    if bad:
        return bad[0]["message"]
    return f"{PHASES[case]}_snapshot: {rec.ended}" if rec.ended else None


def summarise(report: Report, spec, records: list, general: list, snapshot: Path) -> None:
    by = {rec.item: rec for rec in records}
    tail = "\n".join(general)
    restored_verdicts(report, by, tail)
    writes_verdict(report, by, tail)
    atomic_verdict(report, by, snapshot)
    for text in general:
        report.add("check run", False, text)


def figures(by: dict, case: str) -> dict:
    """rank -> the figures of its verdict on ``case``."""
    rec = by.get(case)
    return {r: v.get("figures") or {} for r, v in rec.verdicts.items()} if rec else {}


def restored_verdicts(report: Report, by: dict, tail: str) -> None:
    """model ... RNG states: every rank's verdict; the first failing rank's message."""
    problem = failure(by, "save") or failure(by, "load")
    per_rank = {r: f["restored"] for r, f in figures(by, "load").items() if "restored" in f}
    for item in RESTORED:
        if problem or len(per_rank) < WORLD:
            said = report.verdicts and report.verdicts[-1].item in RESTORED
            report.add(item, False, SEE_ABOVE if said else problem or f"not every rank got this far:\n{tail}")
            continue
        bad = [(r, v[item][1]) for r, v in sorted(per_rank.items()) if not v[item][0]]
        if bad:
            r, msg = bad[0]
            ranks = "" if len(bad) == 1 else f" (also rank {', '.join(str(b[0]) for b in bad[1:])})"
            report.add(item, False, f"rank {r}{ranks}: {msg}")
        else:
            report.add(item, True, f"on {WORLD} ranks: {per_rank[0][item][1]}")


def writes_verdict(report: Report, by: dict, tail: str) -> None:
    saved = figures(by, "save")
    others = {r: f["writes"] for r, f in saved.items() if r != 0 and f.get("writes")}
    if others:
        r, writes = next(iter(others.items()))
        how = ", ".join(f"{kind} {os.path.basename(target)}" for kind, target in writes[:3])
        report.add("rank 0 writes", False, f"rank {r} wrote too ({how}): every rank holds the same state, one "
                   "writer is enough; W ranks writing one file at once collide. Let rank 0 write, after "
                   "gathering what only the other ranks have (their random generators). The check runs its ranks "
                   "as 2 nodes of one rank each (LOCAL_RANK and SLURM_LOCALID are 0 on both): the writer is the "
                   "global rank 0, dist.get_rank() == 0, not the first rank of each node")
        return
    if len(saved) < WORLD or failure(by, "save"):
        report.add("rank 0 writes", False,
                   SEE_ABOVE if failure(by, "save") else f"save_snapshot did not finish:\n{tail}")
        return
    if not saved[0].get("writes") or not saved[0].get("sha"):
        report.add("rank 0 writes", False, f"after save_snapshot there is no file at the path it was given "
                   f"({SNAPSHOT}): rank 0 must write the snapshot there")
        return
    report.add("rank 0 writes", True, f"rank 0 wrote {SNAPSHOT}; rank 1 wrote nothing")


def atomic_verdict(report: Report, by: dict, snapshot: Path) -> None:
    crashed = [(r, f["crash"]) for r, f in sorted(figures(by, "crash").items()) if f.get("crash")]
    problem = failure(by, "save") or failure(by, "load")
    # once a rank died in the crash, a rank that waits for it in a collective (a barrier) fails too: not a fault
    later = failure(by, "resave") or (None if crashed else failure(by, "crash"))
    before = figures(by, "save").get(0, {}).get("sha") and figures(by, "resave").get(0, {}).get("sha")
    if problem or later or not before:
        report.add("atomic write", False,
                   SEE_ABOVE if problem else later or "not tested: no first snapshot was written")
        return
    if not crashed:
        report.add("atomic write", False, "not tested: the second save_snapshot never called torch.save (the "
                   "check makes torch.save die halfway through its write)")
        return
    crash_rank, target = crashed[0][0], os.path.basename(crashed[0][1])
    after, name = file_hash(snapshot), SNAPSHOT
    how = figures(by, "save").get(0, {}).get("how")
    if after == before and how:
        report.add("atomic write", False, f"rank {crash_rank} died halfway through writing {target} and the previous "
                   f"{name} survived on this disk, but not on a cluster's: {how}")
        return
    gap = next((f["gap"] for _, f in sorted(figures(by, "resave").items()) if f.get("gap")), None)
    if after == before and gap:
        report.add("atomic write", False, f"rank {crash_rank} died halfway through writing {target} and the previous "
                   f"{name} survived, but {gap}")
        return
    if after == before:
        report.add("atomic write", True, f"rank {crash_rank} died halfway through writing {target}; the previous "
                   f"{name} was still there, whole; it came into place by a rename of a fsynced file from its own "
                   "folder, atomic on a shared file system too")
        return
    state = ("is gone" if after is None else
             f"is now half a file ({os.path.getsize(snapshot):,} bytes) that does not load")
    report.add("atomic write", False, f"rank {crash_rank} died halfway through writing {target}, and {name} {state}: "
               "the crash destroyed the last good snapshot. Write to a temporary file in the same folder, flush "
               "and os.fsync it, then os.replace() it over the snapshot (a rename is atomic)")
