"""The ``course`` command, one grammar: ``course VERB [NOUN] [PATH] [--OPTIONS]``. Learner commands first (check,
show, download, init, update, restore, diagnose), then the instructor's (grade, release, bench, run, write, selftest).

A NOUN follows a verb that acts on more than one kind of thing (``course show env``, ``course release nbgrader
DIR``); a PATH is the file or folder acted on. Lists are comma lists everywhere (``--exercise ddp,tp``,
``--only 01,02``). Today's spellings (``ALIASES``) still work and are not listed.

Each command lives in the module that does the work; this file only wires the command line. Such a module exposes
``add_arguments(parser)`` and ``run(args) -> int`` and is imported only when its command runs, so ``course
--help`` stays fast (no torch). A command's ``before`` is what that module's own parser reads ahead of the rest
(``course init DIR`` is the workspace module's ``init DIR``).
"""
import argparse
import importlib
import os
import sys
import textwrap
from dataclasses import dataclass

from course_lib.registry import EXERCISES  # the standard library only: --help stays fast


@dataclass(frozen=True)
class Command:
    module: str          # the module that does the work
    args: str            # what follows the command's words: "EXERCISE PATH"
    does: str            # one line: what it does
    before: tuple = ()   # what the module's parser reads ahead of the rest


WORKSPACE, DATA, RELEASE = "course_lib.instructor.workspace", "course_lib.instructor.datacli", \
    "course_lib.instructor.release"
# "VERB [NOUN]" -> Command; learner commands first, then the instructor's. Each command's own --help is its module's
# whole docstring.
LEARNER = {
    "check": Command("course_lib.check", "EXERCISE PATH",
                     f"check your exercise file ({', '.join(EXERCISES)}); --engine local|slurm|auto"),
    "show env": Command("course_lib.instructor.envreport", "",
                        "what this machine offers the course: torch, devices, backend, Slurm or local, data"),
    "show data": Command(DATA, "", "where the data sets are, and which one the notebooks take", ("info",)),
    "download": Command(DATA, "DATASET", "download a data set (mnist, fashion-mnist), checksums verified",
                        ("download",)),
    "init": Command(WORKSPACE, "DIR", "your own copy of the course's notebooks, exercises and job scripts",
                    ("init",)),
    "update": Command(WORKSPACE, "[DIR]", "bring a newer course into your workspace; your edits are kept",
                      ("update",)),
    "restore": Command(WORKSPACE, "PATH", "the course's version of one file again (yours is kept as PATH.mine)",
                       ("restore",)),
    "diagnose": Command("course_lib.jobs.diagnose", "RUN [SCRIPT]",
                        "why a job failed or hung: hints read from its log and script"),
}
INSTRUCTOR = {
    "grade": Command("course_lib.grading.cli", "SUBMISSIONS_DIR", "grade a folder of learners' exercise folders"),
    "release exercises": Command(RELEASE, "", "write exercises/ from solutions/ (--check: exit 1 on drift)"),
    "release nbgrader": Command(RELEASE, "DIR", "an nbgrader course's source/ folder: the learners' files only",
                                ("--nbgrader",)),
    "release gradescope": Command(RELEASE, "DIR", "a Gradescope autograder bundle of the course's checkers",
                                  ("--gradescope",)),
    "bench allreduce": Command("course_lib.bench", "PATH", "a learner's all-reduce algorithms against gloo's, timed",
                               ("allreduce",)),
    "run notebooks": Command("course_lib.instructor.notebooks", "", "execute every notebook headless, a line each"),
    "write jobs": Command("course_lib.jobs.cli", "",
                          "write jobs/*.sbatch from the templates (--check: exit 1 on drift)"),
    "write lab-settings": Command("course_lib.instructor.hub", "",
                                  "the JupyterLab settings for learners (news off, no nbgrader menus)"),
    "selftest gpu": Command("course_lib.selftest.gpu", "", "run every GPU path of the course, report to "
                            "out/gpu-check/", ("--gpu",)),
}
TABLE = {**LEARNER, **INSTRUCTOR}
VERBS = tuple(dict.fromkeys(spelling.split()[0] for spelling in TABLE))
# today's spellings: the word, read by its module's parser as before; kept working, not listed
ALIASES = {"env": "course_lib.instructor.envreport", "data": DATA, "workspace": WORKSPACE, "release": RELEASE,
           "bench": "course_lib.bench",
           "notebooks": "course_lib.instructor.notebooks", "jobs": "course_lib.jobs.cli",
           "lab-settings": "course_lib.instructor.hub", "selftest": "course_lib.selftest.gpu"}
# every first word the command line takes
COMMANDS = {**{v: None for v in VERBS}, **ALIASES}


def comma_list(text: str) -> list[str]:
    """An option's list, the one syntax of every command: ``ddp,tp`` (``type=comma_list, action="extend"``)."""
    return [item.strip() for item in text.split(",") if item.strip()]


def comma_items(convert=str, choices=None):
    """``action=`` for an option whose value is a comma list (``--exercise ddp,tp``), each item ``convert``-ed and
    one of ``choices``; the option may be repeated, and with ``nargs="+"`` space-separated values parse too."""
    class Items(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            items = [convert(item) for value in (values if isinstance(values, list) else [values])
                     for item in comma_list(value)]
            wrong = [str(item) for item in items if choices is not None and item not in choices]
            if wrong:
                parser.error(f"{option_string} {', '.join(wrong)}: choose from {', '.join(map(str, choices))}")
            setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), *items])
    return Items


def _listing() -> str:
    """The commands, learner's first, one line each: ``course VERB [NOUN] ARGUMENTS``, then what it does."""
    lines = ["Multi-GPU deep learning course tools: course VERB [NOUN] [PATH] [--OPTIONS]; "
             "course VERB [NOUN] --help says more."]
    for title, group in (("learner commands", LEARNER), ("instructor commands", INSTRUCTOR)):
        lines += ["", f"{title}:"]
        for spelling, c in group.items():
            lines += [f"  {spelling} {c.args}".rstrip(), *textwrap.wrap(c.does, 110, initial_indent=" " * 6,
                                                                        subsequent_indent=" " * 6)]
    return "\n".join(lines)


EPILOG = """\
exit codes:
  0    ok
  1    the learner's work failed (a check, a grade), or drift found (release exercises --check, write jobs --check)
  2    bad input, or the command could not run (errors go to stderr as "course <verb>: ...")
  130  interrupted (Ctrl-C)

options with one meaning everywhere:
  --timeout SECONDS   the deadline of each multi-process run (course grade: --check-timeout for a whole check)
  --check             write nothing; exit 1 when what would be written differs (release exercises, write jobs)
  --engine            where the work runs: local, slurm or auto (check, grade)
  --out DIR           where the command writes its results
  lists               comma lists, e.g. --exercise ddp,tp or --only 01,02

environment:
  COURSE_HOME         the course's folder (notebooks/, exercises/, solutions/) when it is not beside course_lib
  COURSE_WORKSPACE    the learner's workspace (default: the nearest folder up with .course-workspace.json)
  COURSE_SITE         site profile for jobs: a name in course_lib/jobs/sites/ or a .toml path (default generic)
  COURSE_ENGINE       where jobs, checks and runs go: slurm, local or auto (default: the site profile's engine,
                      else jobs auto, checks and runs here; auto: Slurm when sbatch answers)
  COURSE_CHECKS       checks only, over COURSE_ENGINE: local, slurm or auto (then the site profile's checks)
  COURSE_RUNS         the notebooks' runs only, over COURSE_ENGINE: local, slurm or auto (then the site's runs)
  COURSE_RUNS_DIR     where job run folders go (default jobs/runs/ of the workspace)
  COURSE_OUT_DIR      where outputs go: answers, reports, traces (default out/ of the workspace)
  COURSE_DATA_DIR     where the data sets are (default ~/.cache/multigpu-course/data)
  COURSE_QUICK        1: the notebooks' small settings (CI, a first look)
  COURSE_WARM         0: every rank starts in a fresh interpreter (default 1: forked from a server that has
                      imported torch once)
  COURSE_WARM_KEEP    seconds an idle warm server waits for the next check (default 120; 0: it ends with its check)
  COURSE_CHECK_SLOTS  local checks that run at once on this machine, every user's together (default: the CPUs this
                      process may use; 0: no limit); the others wait, said, each deadline starting once it runs;
                      the slot files are in $COURSE_CHECK_SLOTS_DIR (default /tmp/course-check-slots)
  COURSE_SBATCH_RUN   1: course check sbatch runs the job on this Slurm too (default: on the local site profiles)
  COURSE_LOCAL_GPUS   the number of GPUs the local engine takes this machine to have (tests: one GPU on a CPU)
  COURSE_SELFTEST_CPU 1: the GPU self-check's collective workers run on CPU over gloo (its tests)
  COURSE_WAKEUP_LOG   a file where `course run notebooks` logs each kernel reply it had to pick up itself
  set by the course for its own processes: COURSE_PROBE_* (DDP checker), COURSE_GRADE_* (grading sandbox),
  COURSE_WARM_SOCKET (a forked rank's server), COURSE_IN_JOB (a run inside a job), COURSE_IN_CHECK
  (a check holding a slot), COURSE_WAITS_DIR (hang reports)

site profile keys (the profile COURSE_SITE names; docs/site-profiles.md):
  engine              where jobs, checks and runs go: local, slurm or auto (under COURSE_ENGINE)
  checks, runs        where checks or the notebooks' runs alone go: local or slurm (over COURSE_ENGINE)
  partition, account, reservation, qos, time, mem, constraint, gpu_request, gpus_per_node, cpus_per_node
                      what each job asks Slurm for
  check_partition, check_qos
                      where a check job goes (it needs CPUs only)
  modules, module_init, python, env, nccl, srun_args, sbatch_extra
                      how a job's ranks start: the modules loaded, the python, variables, extra arguments
  data_dir            where the data sets are on the cluster
"""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def _format_action(self, action):
        # list the commands in one column: argparse would put a long name on a line of its own
        self._action_max_length = max(self._action_max_length, 15)
        return super()._format_action(action)


def _resolve(argv: list[str]):
    """(the command's words, its module, what that module's parser reads) for ``argv``; None when it names no
    command (a bare verb that wants a noun, an unknown word, an option first)."""
    if not argv or argv[0].startswith("-"):
        return None
    two = " ".join(argv[:2])
    if two in TABLE:
        return two, TABLE[two], [*TABLE[two].before, *argv[2:]]
    if argv[0] in TABLE:
        return argv[0], TABLE[argv[0]], [*TABLE[argv[0]].before, *argv[1:]]
    if argv[0] in ALIASES:
        return argv[0], Command(ALIASES[argv[0]], "", ""), argv[1:]
    return None


def top_parser() -> argparse.ArgumentParser:
    """``course`` itself: the listing, the exit codes, the environment and the site keys."""
    parser = argparse.ArgumentParser(prog="course", usage="course VERB [NOUN] [PATH] [--OPTIONS]",
                                     description=_listing(), epilog=EPILOG, formatter_class=_Formatter)
    parser.add_argument("verb", choices=VERBS, metavar="VERB", help="one of the verbs above")
    return parser


def command_parser(words: str, command: Command) -> argparse.ArgumentParser:
    """The parser of ``course WORDS``: its module's arguments, its module's whole docstring as its help."""
    mod = importlib.import_module(command.module)
    # the module's whole docstring: what the command does, its forms and its defaults, not a first line cut
    parser = argparse.ArgumentParser(prog=f"course {words}", description=(mod.__doc__ or command.does).strip(),
                                     formatter_class=_Formatter)
    mod.add_arguments(parser)
    for action in parser._actions:
        # a command that is one sub-command of its module (course init: the workspace's init) shows as itself
        if isinstance(action, argparse._SubParsersAction) and command.before[:1] and \
                command.before[0] in action.choices:
            sub = action.choices[command.before[0]]
            sub.prog, sub.description, sub.formatter_class = parser.prog, parser.description, _Formatter
    parser.set_defaults(_run=mod.run)
    return parser


def _bare_verb(argv: list[str]) -> int:
    """``course VERB`` of a verb that wants a noun: its nouns (with --help), else an error naming them."""
    verb = argv[0]
    nouns = [s.split()[1] for s in TABLE if s.split()[0] == verb and " " in s]
    if any(a in ("-h", "--help") for a in argv[1:]):
        print(f"usage: course {verb} NOUN [PATH] [--OPTIONS]\n\nnouns:")
        for noun in nouns:
            c = TABLE[f"{verb} {noun}"]
            print(f"  {noun} {c.args}".rstrip() + f"\n      {c.does}")
        return 0
    print(f"course {verb}: name one of {', '.join(nouns)} (course {verb} NOUN --help)", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    resolved = _resolve(argv)
    words = resolved[0] if resolved else None
    try:
        if resolved is None:
            if argv and argv[0] in VERBS:
                return _bare_verb(argv)
            top_parser().parse_args(argv[:1])      # --help, or an error naming the verbs
            return 2
        _, command, rest = resolved
        if any(a in ("-h", "--help") for a in rest):   # help alone: a mode flag's value (--nbgrader DIR) not needed
            rest = [b for b in command.before if not b.startswith("-")] + ["--help"]
        elif command.before[-1:] and command.before[-1].startswith("-") and command.args:
            # release nbgrader DIR is the module's --nbgrader DIR: the DIR must come right after the noun
            value = rest[len(command.before):len(command.before) + 1]
            if not value or value[0].startswith("-"):
                print(f"course {words}: {command.args} comes first: course {words} {command.args} [--OPTIONS]",
                      file=sys.stderr)
                return 2
        args = command_parser(words, command).parse_args(rest)
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print(f"course {words}: interrupted" if words else "course: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`course check ... | head`): no traceback; as the signal module's docs advise, point
        # stdout at /dev/null so that the flush at exit does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
