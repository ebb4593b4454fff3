"""Worker of ``course check ownddp``: run as W ranks by ``course_lib.core.launch.launch``.

    python -m course_lib.owndp.worker PATH [PATH ...] [--skip CASE,...] [--case-timeout S]

Markers (rankkit): per case ``start`` (case), one ``verdict`` (case, item, rank, ok, message[, missing, other]) and
``end``; ``stuck`` (case, where) when a case's watchdog fires. CASE is ``variant@W``. With several PATHs (the
tests' faulty submissions) every marker also names its ``file`` (index in PATHs).
"""
from __future__ import annotations

import argparse

from course_lib.core import rankkit
from course_lib.core.loader import import_path
from course_lib.owndp.cases import Fail, Missing, Recorder, case_variant, explain

ITEMS = ("naive", "flat", "overlapped", "bucketed")


class OtherRank(Fail):
    """This rank was fine; another one failed the same sub-case."""


class Ctx:
    """What a case needs: the learner's module and file, this rank, W, the recorder, agreement between ranks."""

    def __init__(self, mod, path, rec, sync):
        import torch.distributed as dist
        self.mod, self.path, self.rec, self.sync = mod, path, rec, sync
        self.world, self.r = dist.get_world_size(), dist.get_rank()

    def agree_or_fail(self, problem):
        """Every rank passes this point together; if any had a problem, each raises (its own, or OtherRank)."""
        import torch
        flag = torch.tensor([0 if problem is None else 1])
        self.rec.real["all_reduce"](flag, group=self.sync)   # the worker's own group, not recorded
        if int(flag):
            raise Fail(problem) if problem else OtherRank("another rank failed this case")


def run_case(ctx, case, item, watchdog, tag):
    rankkit.emit("start", case=case, **tag)
    watchdog.arm(case, ctx.path, tag)
    verdict = {"case": case, "item": item, "rank": ctx.r, "ok": True, "message": "", **tag}
    try:
        verdict["message"] = case_variant(ctx, item)
    except OtherRank as e:
        verdict.update(ok=False, other=True, message=str(e))
    except Fail as e:
        verdict.update(ok=False, message=str(e))
    except Missing as e:
        verdict.update(ok=False, missing=True, message=str(e))
    except Exception as e:   # the learner's code raised
        verdict.update(ok=False, message=explain(e, ctx.path))
    rankkit.emit("verdict", **verdict)
    watchdog.disarm()
    rankkit.emit("end", case=case, **tag)


def run(paths, skip, case_timeout):
    import torch
    import torch.distributed as dist
    env = rankkit.rank_env()
    dist.init_process_group("gloo", rank=env.rank, world_size=env.world_size)
    torch.set_num_threads(1)
    sync = dist.new_group(backend="gloo")   # the worker's own group: never pairs with the learner's calls
    watchdog = rankkit.Watchdog(case_timeout, lambda frames, case, path, tag: rankkit.emit(
        "stuck", case=case, where=rankkit.learner_line(frames, path), **tag))
    rec = Recorder()                        # before the learner's module binds any name
    for k, path in enumerate(paths):
        tag = {"file": k} if len(paths) > 1 else {}
        try:
            mod = import_path(path, f"learner_own_ddp_{k}")
        except BaseException as e:
            rankkit.emit("verdict", case="import", item=None, rank=env.rank, ok=False,
                         message=f"own_ddp.py does not load: {explain(e, path)}", **tag)
            continue
        ctx = Ctx(mod, path, rec, sync)
        for item in ITEMS:
            if f"{item}@{env.world_size}" not in skip:
                run_case(ctx, f"{item}@{env.world_size}", item, watchdog, tag)
        dist.barrier(group=sync)            # the next file starts on every rank together
    dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("paths", nargs="+")
    p.add_argument("--skip", default="")
    p.add_argument("--case-timeout", type=float, default=30)
    a = p.parse_args(argv)
    run(a.paths, set(filter(None, a.skip.split(","))), a.case_timeout)
    return 0


if __name__ == "__main__":
    rankkit.exit_now(main())
