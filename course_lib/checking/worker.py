"""One rank of any ``course check`` that runs cases; the checker launches it srun-style, one launch per world size::

    python -m course_lib.checking.worker EXERCISE PATH [PATH ...] [--skip CASE,...] [--passed ITEM,...]
        [--ended ITEM,...] [--case-timeout S]

EXERCISE names the registry entry whose cases module says what to run. The learner's file is imported under the
module's collective guard; each case runs under a watchdog, then every rank agrees (on the harness's own group)
whether it passed. Markers (``course_lib.core.rankkit.emit``), per case: ``start``, one ``verdict`` per rank,
``end``; ``stuck`` when a case's deadline fires or every rank waits on another (``deadlock``, see
``checking.deadlock``), with the learner's line the rank waits on; ``relaunch`` when a
failure may have left messages in flight (the checker goes on in a fresh launch); ``done`` at the end. With several
PATHs the files are checked one after the other, each marker naming its ``file`` (index in PATHs). The ranks run
in the folder the checker gives them (cases that write files write there).
"""
import argparse
import datetime
import faulthandler
import os

from course_lib import registry
from course_lib.checking.case import Ctx, Fail, Missing, OtherRank
from course_lib.checking.deadlock import FOLDER_ENV, Deadlock
from course_lib.checking.guard import CollectiveGuard
from course_lib.checking.learner import error_where, explain, learner_line
from course_lib.checking.protocol import plugin
from course_lib.checking.watchdog import Watchdog
from course_lib.core.loader import import_path
from course_lib.core.rankkit import emit, exit_now, rank_env

# Gloo's error on a rank whose partner's process ended and closed its connection: what a rank still waiting sees
# after a stuck partner's watchdog ended it, not a fault of this rank's own code.
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Failed to recv, got 0 bytes")


def peer_gone(exc: BaseException) -> bool:
    return any(s in str(exc) for s in PEER_GONE)


def load(spec, path: str, k: int, guard: CollectiveGuard, seconds: float, tag: dict):
    """The learner's module, or None after a ``verdict`` marker for the file saying why it does not load."""
    def failed(error: str, where: str) -> None:
        text = plugin(spec).LOAD_TEXT
        emit("verdict", case="load", item=spec.LOAD_ITEM, rank=0, ok=False, load=True, **tag,
             message=text.format(file=spec.FILE, error=error, at=f" at {where}" if where else ""))

    deadline = Watchdog(seconds, lambda _frames: failed(
        f"loading it took more than {seconds:.0f} s (a loop or a blocking call at the top level of the file?)", ""))
    deadline.arm()
    try:
        with guard:   # a `from torch.distributed import all_reduce` in the file binds the guard's function
            return import_path(path, f"learner_{spec.__name__.rsplit('.', 1)[-1]}_{k}")
    except BaseException as e:   # SyntaxError, ImportError, an exception or exit at import time
        failed(f"{type(e).__name__}: {e}", error_where(e, path))
        return None
    finally:
        deadline.disarm()


def run_case(ctx: Ctx, spec, case, key: str, dog: Watchdog, tag: dict) -> tuple[bool, bool]:
    """One case under the watchdog; then every rank agrees: (passed on every rank, nothing left in flight)."""
    emit("start", case=key, item=case.item, label=case.label, **tag)
    dog.arm(key, ctx.path, tag)
    ctx.current = {"case": key, "item": case.item, "rank": ctx.rank, **tag}
    v: dict = {"ok": False}
    try:
        with ctx.guard:
            out = case.run(ctx)
        v["message"], v["figures"] = out if isinstance(out, tuple) else (out or "", {})
        v["ok"] = True
    except OtherRank as e:
        v.update(other=True, message=str(e))
    except Fail as e:
        v.update(message=str(e), kind=e.kind, where=e.where, figures=e.figures)
    except Missing as e:
        v.update(missing=True, kind="todo", message=str(e))
    except NotImplementedError as e:
        v.update(kind="todo", message=explain(e, ctx.path, spec.FILE))
    except Exception as e:   # the learner's code raised
        v.update(kind="peer_gone" if peer_gone(e) else "error", where=error_where(e, ctx.path),
                 message=explain(e, ctx.path, spec.FILE))
    ctx.say(**v)
    ok, clean = agree(ctx, v["ok"], v["ok"] or v.get("kind") == "todo")
    dog.disarm()
    emit("end", case=key, **tag)
    return ok, clean


def agree(ctx: Ctx, ok: bool, clean: bool) -> tuple[bool, bool]:
    import torch  # deferred: the launcher, which imports no torch, reads this
    flags = torch.tensor([0 if ok else 1, 0 if clean else 1])
    ctx.guard.original("all_reduce")(flags, group=ctx.sync)
    return int(flags[0]) == 0, int(flags[1]) == 0


def run_file(spec, path: str, k: int, guard, sync, dog, a, tag: dict) -> bool:
    """Every case of one file; False when a failure may have left messages in flight (a fresh launch goes on)."""
    mod = load(spec, path, k, guard, a.case_timeout, tag)
    if mod is None:
        return True
    passed = dict.fromkeys(a.passed, True)
    ended = set(a.ended)
    ctx = (plugin(spec).Ctx or Ctx)(mod, path, guard, sync, passed)
    ctx.file = spec.FILE
    for case in spec.cases(ctx.world):
        key = case.key(ctx.world)
        if key in a.skip or case.item in ended:
            continue
        passed[case.item], clean = run_case(ctx, spec, case, key, dog, tag)
        if not passed[case.item] and plugin(spec).STOP_ITEM:
            ended.add(case.item)    # an item's first failure is its verdict
        if not clean and plugin(spec).FRESH_AFTER_FAILURE and ctx.world > 1:
            return False
        if not passed[case.item] and plugin(spec).STOP_AT_FAILURE:
            break           # each case builds on the one before
    return True


def note_crashes(rank: int) -> None:
    """If this process dies of a signal (gloo aborts on a size mismatch), its Python stacks go to ``crash-<rank>``
    in the launch's folder: the checker reads the learner's line from it (``runner.crash_lines``)."""
    folder = os.environ.get(FOLDER_ENV)
    if folder:
        faulthandler.enable(open(os.path.join(folder, f"crash-{rank}"), "w"), all_threads=True)  # open until exit


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("exercise")
    p.add_argument("paths", nargs="+")
    items = lambda s: set(filter(None, s.split(",")))   # noqa: E731
    for name in ("--skip", "--passed", "--ended"):
        p.add_argument(name, type=items, default=set())
    p.add_argument("--case-timeout", type=float, default=30.0)
    a = p.parse_args(argv)
    spec = registry.get(a.exercise).cases_module()
    env = rank_env()
    import torch  # deferred: the launcher, which imports no torch, reads this
    import torch.distributed as dist
    torch.set_num_threads(1)
    # the library's own timeout only backs up the watchdog, which reports more clearly
    dist.init_process_group("gloo", rank=env.rank, world_size=env.world_size,
                            timeout=datetime.timedelta(seconds=a.case_timeout + 60))
    sync = dist.new_group(backend="gloo")
    note_crashes(env.rank)
    guard = CollectiveGuard(*spec.GUARD)
    # a deadlock ends the case as soon as every rank waits on another, not at its deadline
    early = Deadlock.from_env(env.rank, env.world_size)
    dog = Watchdog(a.case_timeout, lambda frames, key, path, tag, deadlock=False: emit(
        "stuck", case=key, where=learner_line(frames, path), deadlock=deadlock, **tag), early=early)
    for k, path in enumerate(a.paths):
        tag = {"file": k} if len(a.paths) > 1 else {}
        if not run_file(spec, path, k, guard, sync, dog, a, tag):
            emit("relaunch", **tag)
            break
    else:
        emit("done")
    # every rank leaves together: rank 0 hosts the store, and a rank still making its groups (a launch with no case
    # left to run, after a relaunch) lost it when rank 0 left first ("Connection reset by peer" in new_group, rank 1)
    guard.original("barrier")(group=sync)
    # every verdict is printed: leave at once (an orderly shutdown with torch loaded is slow, and a learner's
    # unfinished isend could make it hang)
    exit_now(0)


if __name__ == "__main__":
    main()
