"""A profiler view of one training step: where the time goes, and whether DDP's all-reduce overlaps backward: ``run``
traces one step on every rank (``profile_step``, ``profile_steps``), ``timeline`` reads the traces back, plots them."""
