"""The checking harness: one way to run an exercise's cases on real ranks and turn them into a Report.

An exercise's cases module (its registry entry names it) holds ``ITEMS``, ``FILE``, ``GUARD`` and ``cases(world)``
-> [Case]; the harness does the rest: ``worker`` runs as each rank, ``runner`` launches it per world size and reads
its markers, ``summary`` makes the Report. See the README's "Add an exercise".
"""
import time

from course_lib.core.report import Report

# The launcher's side (runner, warm, registry, summary) is imported in the functions on purpose (deferred): every rank's
# worker imports this package, and would otherwise import the launcher too (twice its import time, per rank).
# What the harness reads from a cases module, and its defaults: course_lib.checking.protocol.Plugin.


def check(exercise: str, path: str, timeout: float | None = None, case_timeout: float | None = None,
          world_sizes=None) -> Report:
    """Check the learner's file at ``path`` against ``exercise``'s cases; ``timeout`` bounds the runs on each world
    size, ``case_timeout`` each case (defaults: the cases module's TIMEOUT and CASE_TIMEOUT)."""
    from course_lib.checking import runner  # deferred: see the note above check()
    from course_lib.runtime import warm
    spec, timeout, case_timeout, worlds = settings(exercise, timeout, case_timeout, world_sizes)
    start = time.monotonic()
    with warm.session(spec.ENV or runner.ENV, spec.PRELOAD):   # one fork server for every launch of this check
        records, load, general = runner.run_worlds(exercise, spec, str(path), worlds, timeout, case_timeout)
    return report(exercise, spec, str(path), records, load, general, start)


def check_many(exercise: str, paths, timeout: float | None = None, case_timeout: float | None = None,
               world_sizes=None) -> list[Report]:
    """``check`` for each of ``paths``, all in one launch per world size (torch starts once, not once per file);
    if a launch hangs or fails, each file is checked again alone, so one file cannot cost another its verdicts."""
    from course_lib.checking import runner  # deferred: see the note above check()
    from course_lib.runtime import warm
    spec, timeout, case_timeout, worlds = settings(exercise, timeout, case_timeout, world_sizes)
    paths, start = [str(p) for p in paths], time.monotonic()
    with warm.session(spec.ENV or runner.ENV, spec.PRELOAD):
        got = runner.run_many(exercise, spec, paths, worlds, timeout, case_timeout)
        if got is None:
            return [check(exercise, p, timeout, case_timeout, world_sizes) for p in paths]
    records, loads = got
    return [report(exercise, spec, p, records[k], loads.get(k), [], start) for k, p in enumerate(paths)]


def settings(exercise, timeout, case_timeout, world_sizes):
    """(the cases module's Plugin, timeout, case_timeout, world sizes): the caller's, else the module's."""
    from course_lib import registry  # deferred: see the note above check()
    from course_lib.checking.protocol import plugin
    spec = plugin(registry.get(exercise).cases_module())
    worlds = [*spec.FIRST_WORLDS, *(world_sizes or spec.WORLDS)]
    return (spec, spec.TIMEOUT if timeout is None else timeout,
            spec.CASE_TIMEOUT if case_timeout is None else case_timeout, worlds)


def report(exercise, spec, path, records, load, general, start, judge=None) -> Report:
    """The Report of one file: the load failure alone, else the items (``judge``: a cases module that judges its
    items itself, as ckpt's; else ``summary.summarise``)."""
    from course_lib.checking.summary import summarise  # deferred: see the note above check()
    out = Report(exercise, path)
    if load:
        out.add(spec.LOAD_ITEM, False, load["message"] + "\nfix this first, then check again")
    else:
        (judge or summarise)(out, spec, records, general)
    out.seconds = time.monotonic() - start
    return out
