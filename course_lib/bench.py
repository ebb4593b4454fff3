"""Benchmarks a learner runs: ``course bench allreduce``, the all-reduce algorithms they wrote against gloo
(course_lib.allreduce.bench). The maintainers' benchmarks (the checkers' times, a room of learners) are in tools/.

Each topic's module gives ``add_arguments(parser)`` and ``run(args) -> int`` (neither imports torch at the top).
"""
import importlib

TOPICS = {"allreduce": ("course_lib.allreduce.bench", "naive, ring and tree against gloo's all_reduce")}


def add_arguments(p):
    sub = p.add_subparsers(dest="topic", required=True, metavar="TOPIC")
    for name, (module, help_text) in TOPICS.items():
        importlib.import_module(module).add_arguments(sub.add_parser(name, help=help_text, description=help_text))


def run(args) -> int:
    return importlib.import_module(TOPICS[args.topic][0]).run(args)
