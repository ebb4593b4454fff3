"""Checkpoint and restart: a full snapshot of a DDP training, written by rank 0, read by every rank.

### BEGIN SOLUTION
# STUB: Your exercise: write the four functions below, so that a training killed at any step resumes exactly
# STUB: where it was and goes on as if nothing had happened (notebook 08 explains each part).
# STUB:
# STUB:     course check ckpt exercises/08_checkpoint/snapshot.py
The training loop is notebook 02's DDP training (course_lib.ckpt.train). It calls ``save_snapshot`` on every
rank every few steps and after each epoch, and ``load_snapshot`` on every rank once at the start, when the
snapshot file exists. A snapshot holds all a run needs to go on as if it had never stopped:
  - the model's weights and the optimizer's state (Adadelta keeps two running averages per parameter);
  - the scheduler's state (its step count) and the position: epoch and batches done in that epoch, which is
    all a DistributedSampler needs (its order depends only on the seed and the epoch);
  - every rank's random number generators (here each rank draws its own dropout masks), gathered to rank 0.
Rank 0 alone writes it, to a temporary file renamed over the old snapshot: a crash mid-write leaves the old one.
### END SOLUTION

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
    ### BEGIN SOLUTION
    # STUB: raise NotImplementedError("rng_states: return the states of Python's, NumPy's and torch's generators")
    name, keys, pos, has_gauss, cached = np.random.get_state()
    states = {"python": random.getstate(),
              # NumPy's key array as an int64 tensor: torch.load(weights_only=True) refuses NumPy arrays
              "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
              "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state()
    return states
    ### END SOLUTION


def set_rng_states(states: dict) -> None:
    """Put back what ``rng_states`` returned."""
    ### BEGIN SOLUTION
    # STUB: raise NotImplementedError("set_rng_states: restore what rng_states returned")
    random.setstate(states["python"])
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])
    ### END SOLUTION


def save_snapshot(path, model, optimizer, scheduler, epoch, step):
    """Called on every rank: rank 0 writes everything needed to go on from (epoch, step) to ``path``, atomically."""
    ### BEGIN SOLUTION
    # STUB: # TODO: model (DDP-wrapped), optimizer, scheduler, position, every rank's RNG states; only rank 0 writes,
    # STUB: # and a crash in the middle of writing must leave the previous snapshot intact
    # STUB: if dist.get_rank() == 0:
    # STUB:     torch.save(model.module.state_dict(), path)
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, rng_states())      # each rank's generators; a collective: every rank calls it
    if dist.get_rank() != 0:
        return                                        # every rank holds the same weights: one writer is enough
    snapshot = {"model": model.module.state_dict(),   # the Net inside DDP: loads into a plain Net() too
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "epoch": epoch, "step": step, "rng": states}
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        torch.save(snapshot, f)
        f.flush()
        os.fsync(f.fileno())                          # the bytes are on disk before the rename makes them the snapshot
    os.replace(tmp, path)                             # atomic: a reader sees the old snapshot or the new, never half
    ### END SOLUTION


def load_snapshot(path, model, optimizer, scheduler):
    """Called on every rank: restore everything from ``path``; return (epoch, step), where to go on."""
    ### BEGIN SOLUTION
    # STUB: # TODO: every rank reads the snapshot and restores all that save_snapshot wrote
    # STUB: model.module.load_state_dict(torch.load(path))
    # STUB: return 1, 0
    snapshot = torch.load(path, map_location="cpu", weights_only=True)
    model.module.load_state_dict(snapshot["model"])
    optimizer.load_state_dict(snapshot["optimizer"])
    scheduler.load_state_dict(snapshot["scheduler"])
    states = snapshot["rng"]
    if len(states) != dist.get_world_size():
        raise RuntimeError(f"{path} was written by {len(states)} ranks, this run has {dist.get_world_size()}: "
                           "the per-rank random states do not map onto these ranks")
    set_rng_states(states[dist.get_rank()])           # this rank's own generators, not rank 0's
    return snapshot["epoch"], snapshot["step"]
    ### END SOLUTION


if __name__ == "__main__":
    from course_lib.ckpt.train import main
    main(snapshots=sys.modules[__name__])
