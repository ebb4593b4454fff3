"""Checkpoint and restart (notebook 08): the loop with snapshots, its checker, the loss curves, the requeue job."""
