"""``course grade SUBMISSIONS_DIR``: grade a class, each learner's exercises checked in a sandbox; docs/grading.md
says what it writes (grades.csv, scores.csv, grades.md, feedback/, logs/, the exports) and how.

``--timeout`` is the checker's deadline for each multi-process run (as in ``course check``); ``--check-timeout`` is
the grader's for one whole check, after which everything it started is killed. Exit codes: 0 grading ran (learners'
failures are results), 2 it could not (bad arguments, --out not writable, a check the grader itself could not run),
130 interrupted (Ctrl-C or SIGTERM: what is done is kept, --resume continues). Errors go to stderr.
"""
import os
import sys
import tempfile
from pathlib import Path

from course_lib import jobs
from course_lib.check import AUTO_HELP, ENGINES
from course_lib.cli import comma_items
from course_lib.grading.array import grade_on_slurm
from course_lib.grading.cgroups import describe
from course_lib.grading.nbgrader_layout import assignment_names, submitted_folder, write_gradebook
from course_lib.grading.reports import FORMATS, Outputs, read_rows
from course_lib.grading.routes import ROUTES, route_exercises
from course_lib.grading.run import grade
from course_lib.grading.sandbox import Limits
from course_lib.grading.scores import RosterError, read_graded_at, read_roster
from course_lib.registry import EXERCISES


def add_arguments(p):
    p.add_argument("submissions", type=Path, metavar="SUBMISSIONS_DIR",
                   help="a folder with one entry per learner: a copy of exercises/, a zip of one, or a single file")
    p.add_argument("--out", type=Path, default=None,
                   help="where grades.csv, grades.md and logs/ go (default: grades/<name of SUBMISSIONS_DIR>)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--exercise", action=comma_items(choices=list(EXERCISES)), metavar="EX[,EX...]",
                       help=f"grade only these exercises ({', '.join(EXERCISES)}); default: all")
    which.add_argument("--route", choices=list(ROUTES), default=None,
                       help="grade the exercises of one route of the README's course map: "
                            + "; ".join(f"{r}: {', '.join(route_exercises(r))}" for r in ROUTES))
    p.add_argument("--roster", type=Path, default=None, metavar="CSV",
                   help="a CSV with columns learner (the entry's name in SUBMISSIONS_DIR) and id (the student id an "
                        "LMS or Gradescope knows): scores.csv and the exports carry the id; roster learners with no "
                        "entry get 0")
    p.add_argument("--format", action=comma_items(choices=list(FORMATS)), default=[], dest="formats",
                   metavar="FORMAT[,FORMAT...]",
                   help="also write gradescope/<learner>/results.json (gradescope) or lms.csv (lms): gradescope,lms "
                        "for both; grades.csv, scores.csv, grades.md and feedback/ are always written")
    p.add_argument("--jobs", "-j", type=int, default=1, help="checks run at the same time (default 1)")
    p.add_argument("--timeout", type=float, default=None,
                   help="deadline in seconds of each multi-process run, passed to the checker (default: the "
                        "checker's)")
    p.add_argument("--check-timeout", type=float, default=600,
                   help="deadline in seconds of one whole check (default 600)")
    p.add_argument("--strict-launchers", action="store_true",
                   help="ddp: Step 6 requires the script to work under srun and torchrun (default: the one it reads)")
    p.add_argument("--max-processes", type=int, default=512, help="processes and threads one check may have")
    p.add_argument("--memory-mb", type=int, default=4096, help="memory of one check (where cgroups are usable)")
    p.add_argument("--resume", action="store_true", help="keep grades.csv in --out and grade only what is not there")
    p.add_argument("--engine", choices=ENGINES, default="local",
                   help=f"local: checks run here (default); slurm: one job array, a task per learner; {AUTO_HELP}")
    p.add_argument("--throttle", type=int, default=16,
                   help="Slurm engine: tasks of the array running at the same time (sbatch --array=...%%N)")
    p.add_argument("--slurm-time", type=int, default=None, metavar="MINUTES",
                   help="Slurm engine: time limit of one task (default: every check to its deadline, plus 3 min)")
    p.add_argument("--cpus-per-task", type=int, default=2,
                   help="Slurm engine: CPUs of one task (a check runs up to 5 ranks, mostly waiting)")
    p.add_argument("--checker", default="", metavar="MODULE",
                   help="a module with check(path, timeout=...) to use instead of each exercise's checker (to try "
                        "a grading setup quickly, or an instructor's own checks); it must be importable")
    p.add_argument("--nbgrader-db", type=Path, default=None, metavar="PATH",
                   help="also write each learner's score per exercise into this nbgrader gradebook (gradebook.db)")


class _Refused(Exception):
    """Why grading cannot go on (exit 2)."""


def _where(args):
    """(submissions folder, layout note, out, exercises, rows to keep, outputs), or _Refused."""
    subs: Path = args.submissions
    if not subs.is_dir():
        raise _Refused(f"{subs} is not a folder (give the folder that holds one folder per learner)")
    subs, layout = submitted_folder(subs)
    if args.nbgrader_db is not None:
        if not args.nbgrader_db.parent.is_dir():
            raise _Refused(f"--nbgrader-db {args.nbgrader_db}: its folder does not exist")
        try:
            import nbgrader.api  # noqa: F401 - only checked for here; nbgrader_layout imports it when it writes
        except ImportError:
            raise _Refused("--nbgrader-db needs nbgrader in this environment: pip install nbgrader") from None
    chosen = args.exercise or (route_exercises(args.route) if args.route else list(EXERCISES))
    exercises = [ex for ex in EXERCISES if ex in chosen]
    out: Path = args.out or Path("grades") / (args.submissions.resolve().name or "class")
    if Path(os.path.realpath(out)).is_relative_to(Path(os.path.realpath(subs))):
        raise _Refused(f"--out {out} is inside SUBMISSIONS_DIR, which grading never writes into")
    if args.jobs < 1 or args.check_timeout <= 0 or args.throttle < 1 or args.cpus_per_task < 1:
        raise _Refused("--jobs, --throttle and --cpus-per-task must be 1 or more and --check-timeout positive")
    csv_path = out / "grades.csv"
    if csv_path.exists() and not args.resume:
        raise _Refused(f"{csv_path} exists from an earlier run: --resume continues it, or choose another --out")
    try:
        done_rows = read_rows(csv_path) if csv_path.exists() else []
    except (OSError, ValueError) as e:
        raise _Refused(f"cannot resume: {e}") from None
    try:
        (out / "logs").mkdir(parents=True, exist_ok=True)
        roster = read_roster(args.roster) if args.roster is not None else None
    except OSError as e:
        raise _Refused(f"cannot write to {out}: {e}") from None
    except RosterError as e:
        raise _Refused(str(e)) from None
    graded_at = read_graded_at(out / "scores.csv") if args.resume else {}
    return subs, layout, out, exercises, done_rows, Outputs(tuple(dict.fromkeys(args.formats)), roster, graded_at)


def run(args) -> int:
    try:
        subs, layout, out, exercises, done_rows, outputs = _where(args)
        try:
            engine = jobs.engine(args.engine)[0]
            site = jobs.load_site() if engine == "slurm" else None
        except ValueError as e:     # a site profile that does not load (SiteError), an engine name not known
            raise _Refused(str(e)) from None
        limits = Limits(deadline=args.check_timeout, run_timeout=args.timeout, max_processes=args.max_processes,
                        memory_mb=args.memory_mb, checker=args.checker, strict_launchers=args.strict_launchers)
        on_done = _gradebook_writer(args.nbgrader_db, exercises)
        with tempfile.TemporaryDirectory(prefix="course-grade-") as scratch:
            if engine == "local":
                return grade(subs, out, exercises, limits, args.jobs, done_rows, Path(scratch),
                             [layout, describe(limits)], on_done, outputs)
            return grade_on_slurm(subs, out, exercises, limits, done_rows, Path(scratch), [layout], on_done, site,
                                  args.throttle, args.slurm_time, args.cpus_per_task, outputs)
    except (_Refused, jobs.SubmitError) as e:
        print(f"course grade: {e}", file=sys.stderr)
        return 2


def _gradebook_writer(db: Path | None, exercises: list[str]):
    """What to do with the rows once all is graded: write them into nbgrader's gradebook (or nothing)."""
    if db is None:
        return None

    def write(rows, learners):
        assignments = assignment_names(learners, exercises)
        n = write_gradebook(db, rows, assignments)
        print(f"nbgrader gradebook {db}: {n} scores written (assignments: "
              + ", ".join(f"{ex} -> {a}" for ex, a in assignments.items()) + ")")
    return write
