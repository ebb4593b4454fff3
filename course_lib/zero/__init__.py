"""ZeRO and sharded data parallelism: the checker of the ZeRO exercise and the notebook 09 runs."""
