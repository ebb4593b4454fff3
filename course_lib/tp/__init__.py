"""Tensor parallelism (Megatron): the checker, its rank worker, dp x tp training, plots."""
