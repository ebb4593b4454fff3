"""The verdicts of ``course check ckpt`` (in the checker), from the figures its cases measured on the ranks (cases.py):
what each rank wrote and in what order, what load_snapshot gave back and read, what a crash mid-write left."""
import os

from course_lib.ckpt import snapfile
from course_lib.core.report import Report

WORLD = 2
SNAPSHOT = "snapshots/snapshot.pt"   # below the folder the ranks run in: a temporary file made there is misplaced
RESTORED = ("model", "optimizer", "scheduler", "position", "RNG states")
RESAVE = (3, 0)            # the second snapshot, over the first, watched call by call
SEE_ABOVE = "not tested: the error above (under model) stopped the check before this piece"
PHASES = {"save": "save", "load": "load", "resave": "save", "crash": "crash-save", "reload": "load"}
NAME = os.path.basename(SNAPSHOT)


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


def summarise(report: Report, spec, records: list, general: list, left: tuple) -> None:
    """``left``: (sha256, size) of the snapshot file as the crash left it."""
    by = {rec.item: rec for rec in records}
    tail = "\n".join(general)
    restored_verdicts(report, by, tail)
    writes_verdict(report, by, tail)
    atomic_verdict(report, by, left)
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


def other_writer(by: dict, case: str) -> tuple | None:
    """(rank, what it wrote) for the first rank but 0 that wrote a file in ``case``."""
    return next(((r, f["writes"]) for r, f in sorted(figures(by, case).items()) if r != 0 and f.get("writes")), None)


def writes_verdict(report: Report, by: dict, tail: str) -> None:
    for case, env in (("save", "as 2 nodes of one rank each (LOCAL_RANK and SLURM_LOCALID are 0 on both): the writer "
                               "is the global rank 0, dist.get_rank() == 0, not the first rank of each node"),
                      ("resave", "the second time as torchrun inside an sbatch script runs them (RANK and LOCAL_RANK "
                                 "differ, but SLURM_PROCID and SLURM_LOCALID are 0 on every rank: the batch step is "
                                 "one Slurm task): the writer is the global rank 0, dist.get_rank() == 0, not "
                                 "SLURM_PROCID == 0")):
        found = other_writer(by, case)
        if found:
            r, writes = found
            how = ", ".join(f"{kind} {os.path.basename(target)}" for kind, target in writes[:3])
            report.add("rank 0 writes", False, f"rank {r} wrote too ({how}): every rank holds the same state, one "
                       "writer is enough; W ranks writing one file at once collide. Let rank 0 write, after "
                       "gathering what only the other ranks have (their random generators). The check runs its "
                       f"ranks {env}")
            return
    saved = figures(by, "save")
    if len(saved) < WORLD or failure(by, "save"):
        report.add("rank 0 writes", False,
                   SEE_ABOVE if failure(by, "save") else f"save_snapshot did not finish:\n{tail}")
        return
    if not saved[0].get("writes") or not saved[0].get("sha"):
        report.add("rank 0 writes", False, f"after save_snapshot there is no file at the path it was given "
                   f"({SNAPSHOT}): rank 0 must write the snapshot there")
        return
    report.add("rank 0 writes", True, f"rank 0 wrote {SNAPSHOT}; rank 1 wrote nothing")


def atomic_verdict(report: Report, by: dict, left: tuple) -> None:
    crashed = [(r, f["crash"]) for r, f in sorted(figures(by, "crash").items()) if f.get("crash")]
    problem = failure(by, "save") or failure(by, "load")
    # once a rank died in the crash, a rank that waits for it in a collective (a barrier) fails too: not a fault
    later = failure(by, "resave") or (None if crashed else failure(by, "crash"))
    before = figures(by, "save").get(0, {}).get("sha") and figures(by, "resave").get(0, {}).get("sha")
    if other_writer(by, "resave") and not problem:
        report.add("atomic write", False, "not tested: in the second save another rank wrote too (see rank 0 "
                   "writes)")
        return
    if problem or later or not before:
        report.add("atomic write", False,
                   SEE_ABOVE if problem else later or "not tested: no first snapshot was written")
        return
    if not crashed:
        report.add("atomic write", False, "not tested: the second save_snapshot wrote no file (the check makes the "
                   "first write of a save die halfway through)")
        return
    crash_rank, target = crashed[0][0], os.path.basename(crashed[0][1])
    head = f"rank {crash_rank} died halfway through writing {target}"
    (after, size), how = left, figures(by, "save").get(0, {}).get("how")
    if after != before:
        report.add("atomic write", False, f"{head}, and {NAME} {torn(after, size)}: the crash destroyed the last "
                   "good snapshot. " + (how[1] if how else "Write to a temporary file in the same folder, flush and "
                                        "os.fsync it, then os.replace() it over the snapshot (a rename is atomic)"))
        return
    if how:
        report.add("atomic write", False, f"{head} and the previous {NAME} {snapfile.SURVIVED[how[0]]}{how[1]}")
        return
    gap = next((f["gap"] for _, f in sorted(figures(by, "resave").items()) if f.get("gap")), None)
    if gap:
        report.add("atomic write", False, f"{head} and the previous {NAME} survived, but {gap}")
        return
    restart = reload_problem(by)
    if restart:
        report.add("atomic write", False, f"{head}; the previous {NAME} survived, but {restart}")
        return
    report.add("atomic write", True, f"{head}; the previous {NAME} was still there, whole, and a restart's "
               f"load_snapshot went on from it; it came into place by a rename of a file fsynced after its last write, "
               "from its own folder, atomic on a shared file system too")


def torn(after, size: int) -> str:
    return "is gone" if after is None else f"is now half a file ({size:,} bytes) that does not load"


def reload_problem(by: dict) -> str | None:
    """What went wrong when every rank, started afresh after the crash, called load_snapshot; None if it went on from
    the last good snapshot (the second save's)."""
    if "reload" not in by:
        return "the restart after it was not tried (the check could not start the ranks again)"
    hung = failure(by, "reload")
    if hung:
        return f"the restart after it failed: {hung}"
    # a position load_snapshot gets wrong anyway fails under "position": not the crash's doing
    loaded = [f["restored"]["position"][0] for f in figures(by, "load").values() if "restored" in f]
    for r, f in sorted(figures(by, "reload").items()):
        got = f.get("reload") or {}
        position = tuple(got.get("position") or ())
        if got.get("error"):
            outcome = f"failed: {got['error'].rstrip('.')}"
        elif position != RESAVE and all(loaded):
            outcome = (f"returned {position} on rank {r}, not (epoch={RESAVE[0]}, step={RESAVE[1]}) of the last "
                       "snapshot whole on disk")
        elif got.get("model") is False:
            outcome = f"gave rank {r}'s model other weights than {NAME}'s"
        else:
            continue
        stray = list(dict.fromkeys(os.path.basename(p) for p in got.get("read", []) if os.path.basename(p) != NAME))
        if stray:
            return (f"the restart's load_snapshot read {', '.join(stray)}, which the crash left half written, and "
                    f"{outcome}. Load {NAME} alone: a temporary file is whole only once it has been renamed into "
                    "place, and one still there is what a crash left")
        return f"the restart's load_snapshot {outcome}"
    return None
