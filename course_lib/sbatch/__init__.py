"""A learner's own sbatch script, judged: ``course check sbatch PATH`` (``check``): read as sbatch and bash read it
(``script``), held against the site profile (``lint``), and run on Slurm with a probe in place of python (``run``).
"""
