"""Checkpoint and restart: a full snapshot of a DDP training, written by rank 0, read by every rank.

Your exercise: write the four functions below, so that a training killed at any step resumes exactly
where it was and goes on as if nothing had happened (notebook 08 explains each part).

    course check ckpt exercises/08_checkpoint/snapshot.py

Run it (rank 1 kills itself before step 14; torchrun restarts both ranks, which resume from the snapshot):

    torchrun --standalone --nproc_per_node 2 --max-restarts 1 snapshot.py --epochs 3 --kill-at 14
"""
import os
import random
import sys

import numpy as np
import torch
import torch.distributed as dist


def rng_states() -> dict:
    """This process's random number generators: Python's, NumPy's and torch's (and CUDA's, with a GPU)."""
    raise NotImplementedError("rng_states: return the states of Python's, NumPy's and torch's generators")


def set_rng_states(states: dict) -> None:
    """Put back what ``rng_states`` returned."""
    raise NotImplementedError("set_rng_states: restore what rng_states returned")


def save_snapshot(path, model, optimizer, scheduler, epoch, step):
    """Called on every rank: rank 0 writes everything needed to go on from (epoch, step) to ``path``, atomically."""
    # TODO: model (DDP-wrapped), optimizer, scheduler, position, every rank's RNG states; only rank 0 writes,
    # and a crash in the middle of writing must leave the previous snapshot intact
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), path)


def load_snapshot(path, model, optimizer, scheduler):
    """Called on every rank: restore everything from ``path``; return (epoch, step), where to go on."""
    # TODO: every rank reads the snapshot and restores all that save_snapshot wrote
    model.module.load_state_dict(torch.load(path))
    return 1, 0


if __name__ == "__main__":
    from course_lib.ckpt.train import main
    main(snapshots=sys.modules[__name__])
