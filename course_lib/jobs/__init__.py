"""Jobs: sbatch scripts from templates, submitted to Slurm or run locally, watched and read back."""
