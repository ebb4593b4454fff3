"""What came back from ``load_snapshot``, piece by piece, against what was saved: one ``[ok, message]`` per piece."""
import hashlib
import os

GENERATORS = {"torch": "torch's (torch.get_rng_state(): dropout)", "python": "Python's random",
              "numpy": "NumPy's", "cuda": "CUDA's",
              "numpy_gauss": "NumPy's cached normal draw"}


def file_hash(path) -> str | None:
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _tensors_equal(a, b) -> bool:
    import torch
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and torch.equal(a.cpu(), b.cpu()))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_tensors_equal(x, y) for x, y in zip(a, b))
    return a == b


def model_verdict(saved: dict, got: dict) -> list:
    differ = [k for k in saved if k not in got or not _tensors_equal(saved[k], got[k])]
    if not differ:
        return [True, f"all {len(saved)} tensors of the model restored"]
    return [False, f"{len(differ)} of {len(saved)} tensors differ from the saved model after load_snapshot "
                   f"(e.g. {differ[0]}): save model.module.state_dict() and load it into model.module"]


def optimizer_verdict(saved: dict, got: dict) -> list:
    if not got.get("state"):
        return [False, "the optimizer's state is empty after load_snapshot: Adadelta's running averages "
                       "(square_avg, acc_delta) would start again from zero; save optimizer.state_dict() and "
                       "restore it with optimizer.load_state_dict()"]
    lr_saved, lr_got = saved["param_groups"][0]["lr"], got["param_groups"][0]["lr"]
    if lr_saved != lr_got:
        return [False, f"the learning rate is {lr_got:g} after load_snapshot, {lr_saved:g} when saved"]
    if not _tensors_equal(saved["state"], got["state"]):
        return [False, "the optimizer's per-parameter state differs from the saved one"]
    return [True, f"state of {len(saved['state'])} parameters and the learning rate ({lr_saved:g}) restored"]


def scheduler_verdict(saved: dict, got: dict) -> list:
    if _tensors_equal(saved, got):
        return [True, f"last_epoch={saved.get('last_epoch')} restored"]
    return [False, f"the scheduler's last_epoch is {got.get('last_epoch')} after load_snapshot, "
                   f"{saved.get('last_epoch')} when saved: save scheduler.state_dict() and restore it with "
                   "scheduler.load_state_dict() (a schedule that computes the rate from its step count, cosine "
                   "or warm-up, would go wrong without it)"]


def position_verdict(got, expected) -> list:
    try:
        epoch, step = (int(v) for v in got)
    except (TypeError, ValueError):
        return [False, f"load_snapshot returned {got!r}: it must return (epoch, step), where the run goes on"]
    if (epoch, step) == tuple(expected):
        return [True, f"saved at (epoch {expected[0]}, step {expected[1]}), load_snapshot returned the same"]
    msg = f"saved at (epoch={expected[0]}, step={expected[1]}), load_snapshot returned (epoch={epoch}, step={step})"
    if epoch == expected[0] and step == 0:
        msg += ": the position within the epoch is lost, the resumed run would train the epoch's first batches twice"
    elif epoch != expected[0]:
        msg += ": the wrong epoch; the sampler's order depends on it (set_epoch), so would the batches"
    return [False, msg]


def borrowed(saved: dict, got: dict, every_rank: list, rank: int) -> bool:
    """Rank ``rank`` (not 0) got rank 0's generators back instead of its own."""
    lost = [k for k in saved if got.get(k) != saved[k]]
    return bool(lost) and rank != 0 and all(got.get(k) == every_rank[0][k] for k in lost)


def rng_verdict(saved: dict, got: dict, every_rank: list, rank: int, before: dict, by_local: bool = False) -> list:
    """``saved``: the generators as save_snapshot left them (where the run goes on from), ``before``: as they were
    when it was called; ``by_local``: this rank got its own back once its local rank was its rank."""
    lost = [k for k in saved if got.get(k) != saved[k]]
    if not lost:
        return [True, "restored: " + ", ".join(GENERATORS[k] for k in saved)]
    if borrowed(saved, got, every_rank, rank) and by_local:
        return [False, f"rank {rank}'s generators got rank 0's state when LOCAL_RANK and SLURM_LOCALID were 0 on "
                       "every rank (2 nodes of one rank each), and its own when they were its rank (one node): the "
                       "gathered states are picked by the local rank, which starts at 0 on every node. Pick them "
                       "by the global rank: states[dist.get_rank()]"]
    if borrowed(saved, got, every_rank, rank):
        return [False, f"rank {rank}'s generators got rank 0's state: each rank has its own (here each draws "
                       "its own dropout masks); gather them all to rank 0 (dist.all_gather_object) and give "
                       "each rank its own back"]
    if all(got.get(k) == before.get(k) for k in lost):
        return [False, f"save_snapshot drew from {', '.join(GENERATORS[k] for k in lost)} on rank {rank} after "
                       "taking the generators' state: the run goes on from the state after that draw, a resumed "
                       "run from the state before it, so their numbers differ. Draw nothing in save_snapshot "
                       "(tempfile and os.replace need no random name), or take the generators' state last"]
    kept = [GENERATORS[k] for k in saved if k not in lost]
    return [False, "not restored: " + ", ".join(GENERATORS[k] for k in lost)
            + (f" (restored: {', '.join(kept)})" if kept else "")
            + (". np.random.get_state() has five fields, the last two (has_gauss, cached) the second normal of a "
               "pair, drawn but not used yet: set_state needs all five back" if "numpy_gauss" in lost else "")
            + ". Save each generator's state with the snapshot and set it back last in load_snapshot"]


def restored(truth: dict, truth_rng: dict, got: dict, got_rng: dict, position, expected, every_rank: list,
             rank: int, rng_before: dict, by_local: bool = False) -> dict:
    """{piece: [ok, message]} for model, optimizer, scheduler, position and RNG states."""
    return {"model": model_verdict(truth["model"], got["model"]),
            "optimizer": optimizer_verdict(truth["optimizer"], got["optimizer"]),
            "scheduler": scheduler_verdict(truth["scheduler"], got["scheduler"]),
            "position": position_verdict(position, expected),
            "RNG states": rng_verdict(truth_rng, got_rng, every_rank, rank, rng_before, by_local)}
