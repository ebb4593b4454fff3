"""Benchmarks: course bench allreduce (the all-reduce algorithms), course bench checks (the checkers' times) or
course bench room (a room of learners checking at once).

allreduce: the learner's algorithms against gloo (course_lib.allreduce.bench); checks: each checker on its solution
against the time to import torch (course_lib.bench_checks); room: N workspaces checked at once (course_lib.bench_room).

Each topic's module gives ``add_arguments(parser)`` and ``run(args) -> int`` (neither imports torch at the top).
"""
from __future__ import annotations

import importlib

TOPICS = {"allreduce": ("course_lib.allreduce.bench", "naive, ring and tree against gloo's all_reduce"),
          "checks": ("course_lib.bench_checks", "each checker on its solution against the time to import torch"),
          "room": ("course_lib.bench_room", "N learner workspaces, half solved, running the same check at once")}


def add_arguments(p):
    sub = p.add_subparsers(dest="topic", required=True, metavar="TOPIC")
    for name, (module, help_text) in TOPICS.items():
        importlib.import_module(module).add_arguments(sub.add_parser(name, help=help_text, description=help_text))


def run(args) -> int:
    return importlib.import_module(TOPICS[args.topic][0]).run(args)
