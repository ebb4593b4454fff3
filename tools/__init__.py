"""The maintainers' benchmarks, outside the learner's package and CLI (README, "For maintainers"):

    python tools/bench_checks.py [--checkers ddp allreduce tp] [--start warm|cold|both] [--deadlock]
    python tools/bench_room.py [--learners 8] [--exercise allreduce] [--world-sizes 2] [--engine local|slurm]
"""
