"""The GPU self-check: ``course selftest gpu`` (``make gpu-check``) runs every GPU path of the course.

probe.py what this machine has (CUDA, GPUs, bf16, nvidia-smi, Slurm) and the cuda-torch item; pick.py which
python runs the check (the Makefile's side, standard library only); items.py the list of items, each with what
it needs and its estimate; runs.py the deadline-bound subprocesses and ranks they start; report.py the Markdown
+ JSON report and the exit code; gpu.py the command. The items' code: train.py, speed.py, comm.py (with the
link's limit its busbw is held against), jobnb.py, forkcheck.py, and ranks.py, the workers their ranks run.
Each item ends PASS, FAIL (with the error), NOT POSSIBLE HERE (with the reason) or NOT RUN (the budget). See
docs/gpu-check.md.
"""
