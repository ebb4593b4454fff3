"""The GPU self-check: ``course selftest --gpu`` (``make gpu-check``) runs every GPU path of the course.

probe.py what this machine has (CUDA, GPUs, bf16, nvidia-smi, Slurm); items.py the list of items, each with
what it needs; runs.py the deadline-bound subprocesses they start; report.py the Markdown + JSON report;
gpu.py the command. Each item ends PASS, FAIL (with the error) or NOT POSSIBLE HERE (with the reason).
See docs/gpu-check.md.
"""
