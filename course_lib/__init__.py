"""course_lib: the library the course notebooks and the ``course`` command call.

    data, model, metrics, nb   at the top, where learners' files import them: data sets, the MNIST CNN,
                               parsing training output, what every notebook shares
    registry    the one list of exercises: file, checker or cases module, notebook, how to recognise a stray file
    check       ``course check EXERCISE PATH``, through the registry
    checking/   the checking harness: an exercise's cases run on real ranks (one worker), summed up in a Report
    core/       shared by all: launching ranks, process trees, rank markers, reports, paths, atomic writes
    ddp/        DDP in six steps: its checker, the probe inside each rank, the step diff
    allreduce/  all-reduce algorithms: the checker's cases, benchmark, cost model, plots, NCCL_ALGO
    tp/         tensor parallelism: the checker's cases, the rank grid, dp x tp training, plots
    ckpt/, zero/ checkpoint/restart and ZeRO: the checkers' cases, their experiments
    grading/    ``course grade``: a whole class, each check in a sandbox, grades.csv
    jobs/       sbatch scripts from templates, submitted to Slurm or run locally, watched, read back
    instructor/ ``course release``, ``notebooks``, ``env`` and ``data``: an instructor's tools
    cli         ``course <verb> [<topic>]``: wires the commands above, nothing else
"""

__version__ = "0.1.0"
