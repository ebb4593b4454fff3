"""Check a learner's exercise file: course check EXERCISE PATH (the exercises are the registry's).

Prints one verdict per step or function. Exit codes: 0 all passed, 1 something failed, 2 bad input
(no such file, a Slurm job that gave no report); errors go to stderr.

Where the check runs (course_lib.jobs.choose("checks")): ``--engine`` (``engine=`` in Python), else
``$COURSE_CHECKS``, else the site profile's ``checks``, else ``$COURSE_ENGINE``, else the site profile's ``engine``,
else ``local``. ``slurm`` runs it as a short Slurm job (course_lib.check_slurm) with the same verdicts and text;
``auto`` takes Slurm when it answers, else local.
``course check sbatch`` always runs here, since it submits a job of its own (the registry's ``runs_here``).

A local check (course_lib.check_local; a check job runs it the same way, with no slot) first takes a check
slot of the machine's (``$COURSE_CHECK_SLOTS``, said when it waits), then has one overall deadline, said when it
starts ("checking: up to N s"): the sum of its own launches' deadlines, plus a margin for starting the fork server
and stopping ranks. Every launch inside the check ends by it (course_lib.runtime.scope: each runs for min(its own
timeout, what is left)); a run cut short by it makes the report's first row a "check run" FAIL that says so, so a
learner's cell never spins without an end. A local check's runs stay here, whatever the site's ``runs``.
"""
import contextlib
import json
import sys
from pathlib import Path

from course_lib import check_local, jobs
from course_lib.check_local import MARGIN, ROUNDS, overall_deadline  # noqa: F401 - importable from here
from course_lib.check_slurm import CheckJobError, check_on_slurm
from course_lib.registry import EXERCISES, get

# where a check runs: the same choices for ``course check --engine`` and ``course grade --engine``
ENGINES = ("local", "slurm", "auto")
AUTO_HELP = "auto: Slurm when sbatch is on PATH and the controller answers, else local"


def engine_for_checks(choice: str | None = None) -> str:
    """"local" or "slurm" for a check (auto: asks); course_lib.jobs.choose("checks") has the order."""
    return jobs.choose("checks", choice)[0]


_PRINT = object()   # ``say`` not given: print here, check_slurm's own default there


def check(exercise: str, path, engine: str | None = None, say=_PRINT, **kwargs):
    """Run the checker of ``exercise`` on ``path``; returns a course_lib.core.report.Report.

    ``engine``: "local" (here) or "slurm" (a short Slurm job; ``queue_timeout=`` seconds in the queue at
    most); None: as ``engine_for_checks`` chooses. A local check first says its overall
    deadline through ``say`` (None: silent), and there a wait for a check slot (course_lib.check_local.slot)."""
    if not get(exercise).runs_here and engine_for_checks(engine) == "slurm":
        return check_on_slurm(exercise, path, **kwargs) if say is _PRINT else \
            check_on_slurm(exercise, path, say=say or (lambda text: None), **kwargs)
    seconds = check_local.overall_deadline(exercise, kwargs)
    say = print if say is _PRINT else say
    if say is not None:
        say(f"checking: up to {seconds:.0f} s (the whole check's deadline, every launch at most its timeout one after "
            "another; most checks end in seconds)")
    return check_local.check_here(exercise, path, seconds, say, **kwargs)


def add_arguments(p):
    p.add_argument("exercise", choices=list(EXERCISES), metavar="EXERCISE",
                   help="; ".join(f"{e.name}: {e.file}" for e in EXERCISES.values()))
    p.add_argument("path", help=f"the learner's file, e.g. exercises/{EXERCISES['ddp'].file}")
    p.add_argument("--timeout", type=float, default=None,
                   help="deadline in seconds for each multi-process run of the check")
    p.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    p.add_argument("--engine", choices=ENGINES, default=None,
                   help=f"local: run the check here; slurm: as a short Slurm job; {AUTO_HELP} (default: "
                        "$COURSE_CHECKS, the site profile's checks, $COURSE_ENGINE, the site profile's engine, local)")
    p.add_argument("--queue-timeout", type=float, default=None, metavar="SECONDS",
                   help="--engine slurm: cancel the job if it has not started after this long (default 900)")
    p.add_argument("--strict-launchers", action="store_true",
                   help="ddp, Step 6: the script must work under both srun and torchrun (default: under the "
                        "launcher it reads)")


def run(args) -> int:
    if not Path(args.path).is_file():
        print(f"course check: no such file: {args.path} (give the path of your exercise file)", file=sys.stderr)
        return 2
    kwargs = {} if args.timeout is None else {"timeout": args.timeout}
    if getattr(args, "strict_launchers", False):
        if not get(args.exercise).strict_launchers:
            takers = " or ".join(f"`course check {e.name}`" for e in EXERCISES.values() if e.strict_launchers)
            print(f"course check: --strict-launchers is for {takers} only", file=sys.stderr)
            return 2
        kwargs["strict_launchers"] = True
    try:
        engine = "local" if get(args.exercise).runs_here else engine_for_checks(args.engine)
    except ValueError as e:         # a bad --engine/COURSE_CHECKS/COURSE_ENGINE, or a site profile that cannot be read
        print(f"course check: {e}", file=sys.stderr)
        return 2
    if engine == "slurm" and args.queue_timeout is not None:
        kwargs["queue_timeout"] = args.queue_timeout
    # --json: stdout holds the JSON alone (the deadline line and anything the checker prints go to stderr)
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        try:
            report = check(args.exercise, args.path, engine, **kwargs)
        except CheckJobError as e:   # the check's job gave no report
            print(f"course check: {e}", file=sys.stderr)
            return 2
    print(json.dumps(report.rows(), indent=1) if args.json else report.text())
    return 0 if report.passed else 1
