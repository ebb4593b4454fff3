"""A learner's own sbatch script, judged: ``course check sbatch PATH`` (exercises/03_jobs/ddp.sbatch).

- ``script``: reads the script as sbatch and bash do (the #SBATCH block, the exports, the launch line);
- ``lint``: the directives against the site profile and the launch against the directives;
- ``probe`` and ``run``: the job on Slurm with ``python``/``torchrun`` standing in for the training, so each
  rank says what it saw (rank, MASTER_ADDR/PORT, OMP_NUM_THREADS) and the ranks really form a process group;
- ``check``: the verdicts, one per mistake a learner makes.
"""
