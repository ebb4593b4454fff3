"""Worker of ``course check zero``: run as W ranks by ``course_lib.core.launch.launch``.

    python -m course_lib.zero.worker PATH [PATH ...] [--skip CASE,...] [--passed ITEM,...] [--case-timeout S]

Talks to the checker through rankkit markers: per case ``start`` (case), one ``verdict`` (case, item, rank,
ok, message[, missing, other, figures]) and ``end`` (case); ``stuck`` (case) when a case's watchdog fires.
CASE is ``item@W``. With several PATHs (``check.check_many``) the files are checked one after the other in
this one launch, each in a module of its own, and every marker also names its ``file`` (index in PATHs).
The learner's collectives are counted (rankkit.CollectiveGuard, active before their file is imported); the
worker's own agreement and barriers use a group of its own and the real functions.
"""
from __future__ import annotations

import argparse
import functools

from course_lib.core import rankkit
from course_lib.core.loader import import_path
from course_lib.zero.cases import Fail, Missing, bounds, case_all_gather, case_reduce_scatter, case_shard_range, explain
from course_lib.zero.zerocase import case_zero

COUNTED = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_single",
           "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all", "all_to_all_single",
           "scatter", "gather")
ITEMS = ("shard_range", "reduce_scatter", "all_gather", "ZeRO-1", "ZeRO-2")
CASES = [("shard_range", case_shard_range), ("reduce_scatter", case_reduce_scatter), ("all_gather", case_all_gather),
         ("ZeRO-1", functools.partial(case_zero, stage=1)), ("ZeRO-2", functools.partial(case_zero, stage=2))]


class OtherRank(Fail):
    """This rank was fine; another one failed the same sub-case."""


class Ctx:
    """What a case needs: the learner's module, this rank, W, the guard's counts, agreement between ranks."""

    def __init__(self, mod, guard, sync):
        import torch.distributed as dist
        self.mod, self.guard, self.sync = mod, guard, sync
        self.world, self.r = dist.get_world_size(), dist.get_rank()
        self.rank = self.r
        self.kw = {}
        self.passed: dict[str, bool] = {}     # item -> passed on every rank, in this launch

    def take_counts(self):
        return self.guard.take()

    def agree(self, ok: bool) -> bool:
        """True when ``ok`` on every rank (a real all-reduce on the worker's own group, not counted)."""
        import torch
        flag = torch.tensor([0 if ok else 1])
        self.guard.original("all_reduce")(flag, group=self.sync)
        return int(flag) == 0

    def agree_or_fail(self, problem):
        if not self.agree(problem is None):
            raise Fail(problem) if problem else OtherRank("another rank failed this case")

    def shards(self, n):
        return bounds(self, n)

    def collectives(self):
        """The learner's own collectives once both passed in this launch, else the library's."""
        return "mine" if self.passed.get("reduce_scatter") and self.passed.get("all_gather") else "torch"


def run_case(ctx, case, item, call, path, watchdog, tag):
    """One case under the watchdog; every rank reports, then all wait for each other (on the worker's group)."""
    rankkit.emit("start", case=case, **tag)
    watchdog.arm(case, path, tag)
    verdict = {"case": case, "item": item, "rank": ctx.r, "ok": True, "message": "", **tag}
    try:
        out = call(ctx)
        verdict["message"], verdict["figures"] = out if isinstance(out, tuple) else (out, {})
    except OtherRank as e:
        verdict.update(ok=False, other=True, message=str(e))
    except Fail as e:
        verdict.update(ok=False, message=str(e))
    except Missing as e:
        verdict.update(ok=False, missing=True, message=str(e))
    except Exception as e:   # the learner's code raised
        verdict.update(ok=False, message=explain(e, path))
    rankkit.emit("verdict", **verdict)
    ctx.passed[item] = ctx.agree(verdict["ok"])
    watchdog.disarm()
    rankkit.emit("end", case=case, **tag)


def load_or_report(path, rank, name, tag):
    try:
        return import_path(path, name)
    except BaseException as e:
        rankkit.emit("verdict", case="import", item=None, rank=rank, ok=False,
                     message=f"zero.py does not load: {explain(e, path)}", **tag)
        return None


def run(paths, skip, case_timeout, passed=()):
    import torch
    import torch.distributed as dist
    env = rankkit.rank_env()
    dist.init_process_group("gloo", rank=env.rank, world_size=env.world_size)
    torch.set_num_threads(1)
    sync = dist.new_group(backend="gloo")   # the worker's own group: never pairs with the learner's calls
    watchdog = rankkit.Watchdog(case_timeout, lambda frames, case, path, tag: rankkit.emit(
        "stuck", case=case, where=rankkit.learner_line(frames, path), **tag))
    with rankkit.CollectiveGuard(COUNTED, mode="count") as guard:   # before the learner's module binds any name
        for k, path in enumerate(paths):
            tag = {"file": k} if len(paths) > 1 else {}
            mod = load_or_report(path, env.rank, f"learner_zero_{k}", tag)
            if mod is None:
                continue
            ctx = Ctx(mod, guard, sync)
            ctx.passed.update({item: True for item in passed})   # in an earlier launch of this check
            for item, fn in CASES:
                case = f"{item}@{env.world_size}"
                if case not in skip:
                    run_case(ctx, case, item, fn, path, watchdog, tag)
            dist.barrier(group=sync)   # the next file starts on every rank together
    dist.barrier(group=sync)
    dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("paths", nargs="+")
    p.add_argument("--skip", default="")
    p.add_argument("--passed", default="", help="items that passed in an earlier launch")
    p.add_argument("--case-timeout", type=float, default=30)
    a = p.parse_args(argv)
    run(a.paths, set(filter(None, a.skip.split(","))), a.case_timeout, list(filter(None, a.passed.split(","))))
    return 0


if __name__ == "__main__":
    rankkit.exit_now(main())
