"""The runtime: what starts, waits on and stops the course's processes and jobs. It imports nothing of course_lib
above it (only course_lib.core and course_lib.metrics: tests/test_layers.py).

Ranks on this machine: launch (N ranks of a script, srun- or torchrun-style, under one deadline; scope bounds
every launch inside a check), rank_env and gpus (their environment), warm, forkserver, warm_agent and warm_rank
(ranks forked from a server that imported torch once, or under torchrun from its agent forked there), proc (the one
way to stop a process tree).
Jobs: job (the Job both engines give), local and slurm (the engines), progress (the one loop that waits for a job,
and its live display), reattach (a job again after a kernel restart), runner and run_job (a check's or a
run's own job), sampler (the local engine's top). Why a Slurm job failed is read by course_lib.jobs.diagnose.
"""
