"""The ``course`` command: check, grade, release, bench, notebooks, env, data.

Each sub-command lives in the module that does the work; this file only wires the command line.
A module that owns a sub-command exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# sub-command -> (module, one-line help)
COMMANDS = {
    "check": ("course_lib.checks.cli", "check a learner's exercise file: ddp, allreduce or tp"),
    "grade": ("course_lib.grading", "grade a folder of learners' exercise folders"),
    "release": ("course_lib.release", "write exercises/ from solutions/ (--check: fail if they differ)"),
    "bench": ("course_lib.bench", "benchmarks: all-reduce algorithms against the library"),
    "notebooks": ("course_lib.notebooks", "execute every notebook headless and print a line per notebook"),
    "env": ("course_lib.envreport", "report torch, devices, backend, Slurm or local, data"),
    "data": ("course_lib.datacli", "where the data sets are; download MNIST or Fashion-MNIST on request"),
    "jobs": ("course_lib.jobs.cli", "write the workshop's sbatch scripts into jobs/ (--check: fail if they drift)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="course", description="Multi-GPU deep learning course tools")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_text, description=(mod.__doc__ or help_text).strip().splitlines()[0])
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
