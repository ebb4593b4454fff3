"""A profiler view of one training step: where the time goes, and whether DDP's all-reduce overlaps backward.

``run.profile_step(nprocs=2, bucket_cap_mb=1)`` traces one step of the course's CNN with ``torch.profiler`` on every
rank (``run.profile_steps`` traces several bucket settings in one launch of the ranks); ``timeline.Timeline`` reads
a rank's Chrome trace back (phases, backward compute, all-reduce buckets) and measures the overlap;
``timeline.plot`` draws the ranks' timelines one above the other.
"""
