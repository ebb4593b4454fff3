"""The worker of one sandboxed check, ``python -m course_lib.grading.sandbox_worker EXERCISE PATH RESULT LIMITS``
(LIMITS: the sandbox's Limits as JSON; course_lib.grading.sandbox starts it): joins the check's cgroups and sets its
rlimits before any learner code runs (children inherit both), runs the checker on PATH and writes its verdicts as
JSON to RESULT, a folder the learner's code is not given.
"""
import importlib
import json
import os
import resource
import sys
import time

import psutil

from course_lib.core.atomic import write_text
from course_lib.grading.sandbox import CGROUPS_VAR, Limits


def _enter_limits(max_processes: int, max_file_mb: int) -> None:
    for d in filter(None, os.environ.get(CGROUPS_VAR, "").split(os.pathsep)):
        try:
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except OSError as e:   # v2 wants write access to the common ancestor too: say so, go on with rlimits
            print(f"[grader] could not join the check's cgroup {d}: {e}; rlimits and the sweep only", flush=True)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    size = max_file_mb * 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    if os.getuid() != 0:
        # RLIMIT_NPROC counts all of this user's processes, zombies too: give the check max_processes more than now
        cap = max_processes + sum(1 for p in psutil.process_iter(["uids"], ad_value=None)
                                  if p.info["uids"] is not None and p.info["uids"].real == os.getuid())
        hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        if hard == resource.RLIM_INFINITY:
            hard = cap
        resource.setrlimit(resource.RLIMIT_NPROC, (min(cap, hard), hard))


def worker(argv: list[str]) -> int:
    exercise, path, result = argv[:3]
    limits = Limits(**json.loads(argv[3]))
    # the checker's fork server (course_lib.runtime.warm) starts after this, so it and every rank it forks are in
    # the check's cgroups, under its rlimits, and found by the sweep as the worker's descendants
    _enter_limits(limits.max_processes, limits.max_file_mb)

    from course_lib.core.report import Report
    from course_lib.registry import get

    kwargs = {"timeout": limits.run_timeout} if limits.run_timeout else {}
    if limits.strict_launchers and get(exercise).strict_launchers and not limits.checker:
        kwargs["strict_launchers"] = True
    start = time.monotonic()
    try:
        report = (importlib.import_module(limits.checker) if limits.checker else get(exercise)).check(path, **kwargs)
    except BaseException as e:   # the learner's code may raise SystemExit or worse at import time
        report = Report(exercise, path)
        report.add("check", False, f"the check itself stopped: {type(e).__name__}: {e}")
    data = {"exercise": exercise, "seconds": time.monotonic() - start,
            "verdicts": [{"item": v.item, "result": v.result, "message": v.message} for v in report.verdicts]}
    write_text(result, json.dumps(data))
    return 0


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1:]))
