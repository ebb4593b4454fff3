"""The ``course`` command: ``course COMMAND [ARGUMENTS] [--OPTIONS]``; learner commands (check, env, data, workspace)
first, then the instructor's (grade, release, bench, notebooks, jobs, selftest, lab-settings).

Each sub-command lives in the module that does the work; this file only wires the command line.
A module that owns a sub-command exposes ``add_arguments(parser)`` and ``run(args) -> int``; it is imported
only when its command runs, so ``course --help`` stays fast (no torch).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap

from course_lib.registry import EXERCISES  # the standard library only: --help stays fast

# sub-command -> (module, its arguments, what it does). Learner commands first, then the instructor's; each
# command's own --help is its module's whole docstring.
LEARNER = {
    "check": ("course_lib.check", "EXERCISE PATH",
              f"check your exercise file ({', '.join(EXERCISES)}); --engine local|slurm|auto"),
    "env": ("course_lib.instructor.envreport", "",
            "what this machine offers the course: torch, devices, backend, Slurm or local, data"),
    "data": ("course_lib.instructor.datacli", "[info | download NAME]",
             "where the data sets are; download one on request"),
    "workspace": ("course_lib.instructor.workspace", "init DIR | update [DIR] | restore PATH",
                  "your own copy of the course's notebooks, exercises and job scripts"),
}
INSTRUCTOR = {
    "grade": ("course_lib.grading.cli", "DIR", "grade a folder of learners' exercise folders"),
    "release": ("course_lib.instructor.release", "[--check | --nbgrader DIR | --gradescope DIR]",
                "write exercises/ from solutions/ (--check: exit 1 on drift)"),
    "bench": ("course_lib.bench", "allreduce PATH", "a learner's all-reduce algorithms against gloo's, timed"),
    "notebooks": ("course_lib.instructor.notebooks", "", "execute every notebook headless, a line each"),
    "jobs": ("course_lib.jobs.cli", "[--check]", "write jobs/*.sbatch from the templates (--check: exit 1 on drift)"),
    "selftest": ("course_lib.selftest.gpu", "--gpu", "run every GPU path of the course, report to out/gpu-check/"),
    "lab-settings": ("course_lib.instructor.hub", "",
                     "the JupyterLab settings for learners (news off, no nbgrader menus)"),
}
COMMANDS = {name: (module, f"{args}: {does}" if args else does)
            for name, (module, args, does) in {**LEARNER, **INSTRUCTOR}.items()}


def _listing() -> str:
    """The commands, learner's first, one line each: ``course COMMAND ARGUMENTS``, then what it does."""
    lines = ["Multi-GPU deep learning course tools: course COMMAND [ARGUMENTS] [--OPTIONS]; "
             "course COMMAND --help says more."]
    for title, group in (("learner commands", LEARNER), ("instructor commands", INSTRUCTOR)):
        lines += ["", f"{title}:"]
        for name, (_, args, does) in group.items():
            lines += [f"  {name} {args}".rstrip(), *textwrap.wrap(does, 110, initial_indent=" " * 6,
                                                                 subsequent_indent=" " * 6)]
    return "\n".join(lines)


EPILOG = """\
exit codes:
  0    ok
  1    the learner's work failed (a check, a grade), or drift found (release --check, jobs --check)
  2    bad input, or the command could not run (errors go to stderr as "course <verb>: ...")
  130  interrupted (Ctrl-C)

options with one meaning everywhere:
  --timeout SECONDS   the deadline of each multi-process run (course grade: --check-timeout for a whole check)

environment:
  COURSE_HOME         the course's folder (notebooks/, exercises/, solutions/) when it is not beside course_lib
  COURSE_WORKSPACE    the learner's workspace (default: the nearest folder up with .course-workspace.json)
  COURSE_SITE         site profile for jobs: a name in course_lib/jobs/sites/ or a .toml path (default generic)
  COURSE_ENGINE       jobs engine: slurm, local or auto (default auto: Slurm when sbatch answers)
  COURSE_CHECKS       where checks run: local, slurm or auto (default: the site profile's checks, else local)
  COURSE_RUNS_DIR     where job run folders go (default jobs/runs/ of the workspace)
  COURSE_OUT_DIR      where outputs go: answers, reports, traces (default out/ of the workspace)
  COURSE_DATA_DIR     where the data sets are (default ~/.cache/multigpu-course/data)
  COURSE_QUICK        1: the notebooks' small settings (CI, a first look)
  set by the course for its own processes: COURSE_PROBE_* (DDP checker), COURSE_GRADE_* (grading sandbox)

site profile keys (the profile COURSE_SITE names; docs/site-profiles.md):
  checks, runs        where checks and the notebooks' runs go: local or slurm
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
        # list the commands in one column: argparse would put "notebooks" on a line of its own
        self._action_max_length = max(self._action_max_length, 15)
        return super()._format_action(action)


def _command_of(argv: list[str]) -> str | None:
    """The sub-command named in ``argv`` (the first word not an option), if it is one."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in COMMANDS else None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``course`` parser; only ``command``'s module is imported and gets its options."""
    parser = argparse.ArgumentParser(prog="course", usage="course COMMAND [ARGUMENTS] [--OPTIONS]",
                                     description=_listing(), epilog=EPILOG, formatter_class=_Formatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="one of the commands above")
    for name, (module, help_text) in COMMANDS.items():
        if name != command:
            sub.add_parser(name, prog=f"course {name}")
            continue
        mod = importlib.import_module(module)
        # the module's whole docstring: what the command does, its forms and its defaults, not a first line cut
        p = sub.add_parser(name, prog=f"course {name}", description=(mod.__doc__ or help_text).strip(),
                           formatter_class=_Formatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _command_of(argv)
    try:
        args = build_parser(command).parse_args(argv)
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print(f"course {command}: interrupted" if command else "course: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`course check ... | head`): no traceback; as the signal module's docs advise, point
        # stdout at /dev/null so that the flush at exit does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
