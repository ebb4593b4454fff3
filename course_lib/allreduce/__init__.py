"""All-reduce algorithms: the checker, its rank worker, the benchmark, the alpha-beta cost model, plots, NCCL_ALGO."""
