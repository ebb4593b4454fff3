"""course_lib: the small library the course notebooks call.

One module per job: data (datasets), model (the MNIST CNN), metrics (parse training output),
launch (N local processes), jobs (sbatch or local), checks (the learner's work), grading, plots.
"""
from pathlib import Path

__version__ = "0.1.0"

# The repository root: notebooks, solutions/ and exercises/ live beside the package.
ROOT = Path(__file__).resolve().parent.parent
