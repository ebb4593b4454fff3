"""Tensor parallelism (Megatron): the checker's cases, the reference rank grid, dp x tp training, plots."""
