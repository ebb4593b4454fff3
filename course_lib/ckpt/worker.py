"""One rank of ``course check ckpt``: the learner's save_snapshot and load_snapshot on a small DDP training.

Started by the checker through ``course_lib.core.launch`` (srun-style, 2 ranks)::

    python -m course_lib.ckpt.worker LEARNER_FILE SNAPSHOT_PATH [--seconds DEADLINE_OF_EACH_CALL]

Each rank trains a few steps, puts its random generators in a state of its own, then calls the learner's
``save_snapshot`` (every file it writes is recorded), builds a fresh model, optimizer and scheduler, scrambles its
generators and calls ``load_snapshot``: what comes back is compared with what was saved, piece by piece. Last,
``torch.save`` is made to die halfway through writing a second snapshot (``audit.CrashingSave``); the checker
then looks at what is left at SNAPSHOT_PATH. Markers (``@@ {json}``, course_lib.core.rankkit): ``import``,
``saved`` (writes), ``file`` (rank 0: the snapshot's hash), ``restored`` (verdict per piece), ``crash``,
``crash_done`` (the second save returned without calling torch.save), ``error`` (a call raised), ``stuck``.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import random
import traceback

from course_lib.ckpt import audit
from course_lib.core import rankkit
from course_lib.core.rankkit import emit

POSITION = (2, 5)          # saved mid-epoch: epoch 2, 5 batches done


def learner_call(path: str, phase: str, seconds: float, fn, *args, before_exit=None):
    """Call the learner's ``fn`` under a deadline; on an exception or a hang, say where in their file and exit
    (``before_exit()`` first: what the rank has to report even so)."""
    def stuck(frames):
        emit("stuck", phase=phase, seconds=seconds, where=rankkit.learner_line(frames, path))
        if before_exit:
            before_exit()
    dog = rankkit.Watchdog(seconds, stuck)
    dog.arm()
    try:
        return fn(*args)
    except BaseException as exc:  # noqa: BLE001 - the learner's code may raise anything; report it
        dog.disarm()
        emit("error", phase=phase, error=f"{type(exc).__name__}: {exc}"[:400], where=rankkit.error_where(exc, path))
        traceback.print_exc()
        if before_exit:
            before_exit()
        rankkit.exit_now(4)
    finally:
        dog.disarm()


def training_objects(seed: int):
    """A DDP-wrapped Net with Adadelta and StepLR, as the course's loop builds them."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from course_lib.model import Net
    torch.manual_seed(seed)
    model = DDP(Net())
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    return model, optimizer, scheduler


def train_a_little(model, optimizer, scheduler, rank: int, steps: int = 2) -> None:
    import torch
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(10 + rank)
    for _ in range(steps):
        data, target = torch.randn(8, 1, 28, 28, generator=g), torch.randint(0, 10, (8,), generator=g)
        optimizer.zero_grad()
        F.nll_loss(model(data), target).backward()
        optimizer.step()
    scheduler.step()


def set_generators(seed: int) -> None:
    import numpy as np
    import torch
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.rand(seed % 7 + 1)        # not a freshly seeded state: a state that only a snapshot can give back


def generators() -> dict:
    """Fingerprints of this process's generators (CUDA's too when there is one)."""
    import numpy as np
    import torch
    states = {"torch": torch.get_rng_state().numpy().tobytes(), "python": repr(random.getstate()).encode(),
              "numpy": repr(np.random.get_state()[1:]).encode() + np.random.get_state()[1].tobytes()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state().numpy().tobytes()
    return {k: hashlib.sha256(v).hexdigest()[:16] for k, v in states.items()}


def snapshot_of(model, optimizer, scheduler) -> dict:
    return {"model": {k: v.detach().clone() for k, v in model.module.state_dict().items()},
            "optimizer": copy.deepcopy(optimizer.state_dict()), "scheduler": copy.deepcopy(scheduler.state_dict())}


def load(path: str):
    """The learner's module, or a marker saying why not and the end of this rank."""
    from course_lib.core.loader import import_path
    try:
        learner = import_path(path, "learner_snapshot")
    except BaseException as exc:  # noqa: BLE001 - a learner's file may fail to import in any way
        emit("import", ok=False, error=f"{type(exc).__name__}: {exc}"[:400], where=rankkit.error_where(exc, path))
        rankkit.exit_now(0)
    missing = [n for n in ("save_snapshot", "load_snapshot") if not callable(getattr(learner, n, None))]
    emit("import", ok=not missing, missing=missing)
    if missing:
        rankkit.exit_now(0)
    return learner


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("learner")
    p.add_argument("snapshot")
    p.add_argument("--seconds", type=float, default=60.0, help="deadline of each call of the learner's code")
    args = p.parse_args(argv)
    import torch.distributed as dist

    from course_lib.ckpt import compare
    env = rankkit.rank_env()
    dist.init_process_group("gloo", rank=env.rank, world_size=env.world_size)
    rank = env.rank
    learner = load(args.learner)

    model, optimizer, scheduler = training_objects(seed=0)
    train_a_little(model, optimizer, scheduler, rank)
    set_generators(100 + rank)
    truth, truth_rng = snapshot_of(model, optimizer, scheduler), generators()
    with audit.WriteAudit(learner) as writes:
        report = lambda: emit("saved", writes=writes.writes)   # noqa: E731 - also sent when the save fails
        learner_call(args.learner, "save", args.seconds, learner.save_snapshot, args.snapshot, model, optimizer,
                     scheduler, *POSITION, before_exit=report)
    report()
    dist.barrier()
    if rank == 0:
        emit("file", sha=compare.file_hash(args.snapshot))

    fresh = training_objects(seed=999)
    set_generators(999)
    position = learner_call(args.learner, "load", args.seconds, learner.load_snapshot, args.snapshot, *fresh)
    rngs = [None] * env.world_size
    dist.all_gather_object(rngs, truth_rng)
    emit("restored", **compare.restored(truth, truth_rng, snapshot_of(*fresh), generators(), position, POSITION,
                                        rngs, rank))
    dist.barrier()

    train_a_little(model, optimizer, scheduler, rank, steps=1)
    with audit.CrashingSave(learner, on_crash=lambda target: emit("crash", target=target)):
        learner_call(args.learner, "crash-save", args.seconds, learner.save_snapshot, args.snapshot, model, optimizer,
                     scheduler, 3, 1)
    emit("crash_done")
    rankkit.exit_now(0)


if __name__ == "__main__":
    main()
