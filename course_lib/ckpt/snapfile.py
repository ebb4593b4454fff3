"""The snapshot file as another program finds it (``weights_only=True``, a plain ``Net()``), and the learner's way of
writing it (a rename of a fsynced file from its own folder): used by the checkpoint checker.
"""
import os
import re

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def state_dicts(obj, depth: int = 0):
    """Every dict of name -> tensor inside ``obj`` (a snapshot is dicts and lists of them)."""
    import torch
    if depth > 4:
        return
    if isinstance(obj, dict):
        if obj and all(isinstance(k, str) for k in obj) and all(isinstance(v, torch.Tensor) for v in obj.values()):
            yield obj
        for v in obj.values():
            yield from state_dicts(v, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from state_dicts(v, depth + 1)


def refusal(exc: Exception) -> str:
    """The line of torch's weights_only error that names what it refused (its advice to set weights_only=False is
    exactly what not to do with a file on a shared disk)."""
    lines = [line.strip() for line in ANSI.sub("", str(exc)).splitlines() if line.strip()]
    named = [line for line in lines if "Unsupported global" in line or "WeightsUnpickler error" in line]
    return (named or lines or [type(exc).__name__])[0][:300]


def model_problem(path) -> str | None:
    """Why the snapshot at ``path`` does not give a plain Net its weights through weights_only=True; None if it does."""
    import torch

    from course_lib.model import Net
    name = os.path.basename(path)
    try:
        snapshot = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever torch refuses, say what
        return (f"torch.load({name}, weights_only=True) refuses the snapshot: {refusal(exc)}. Keep it to tensors, "
                "numbers, strings and lists or dicts of them: NumPy's key array as an int64 tensor "
                "(torch.from_numpy(keys.astype(np.int64)))")
    net = Net()
    want = set(net.state_dict())
    found = list(state_dicts(snapshot))
    for sd in found:
        if set(sd) == want:
            try:
                net.load_state_dict(sd)
            except RuntimeError as exc:
                return f"the snapshot's model does not load into a plain Net(): {refusal(exc)}"
            return None
    if any(set(sd) == {f"module.{k}" for k in want} for sd in found):
        return ("the snapshot's model has DDP's names (module.conv1.weight, ...): it loads only into a DDP-wrapped "
                "model, not into the plain Net() that an evaluation or another run builds. Save "
                "model.module.state_dict() and load it into model.module")
    return (f"{name} holds no state_dict of the model (conv1.weight, ...): "
            "save model.module.state_dict() in the snapshot")


def load_problem(weights_only: list, unpickled: list = ()) -> str | None:
    if False in weights_only:
        return ("load_snapshot reads the snapshot with torch.load(..., weights_only=False): unpickling runs any code "
                "the file holds, and a snapshot on a shared file system can be replaced by anyone who can write "
                "there. The snapshot is tensors and plain values: weights_only=True (torch's default) reads it")
    if unpickled:
        return (f"load_snapshot reads {os.path.basename(unpickled[0])} with pickle.load: unpickling runs any code the "
                "file holds, and a file on a shared file system can be replaced by anyone who can write there. Keep "
                "everything in the snapshot as tensors and plain values (NumPy's key array as an int64 tensor) and "
                "read it with torch.load(weights_only=True)")
    return None


# how each kind of problem of the first save is said, after "the previous snapshot.pt survived"
SURVIVED = {"in place": "survived, but the first save_snapshot was not atomic: ",
            "cluster": "survived on this disk, but not on a cluster's: ",
            "node": "survived this process's crash, but not a node's: "}


def write_problem(renames: list, snapshot: str, writes: list = ()) -> tuple[str, str] | None:
    """Judge how rank 0 brought ``snapshot`` into place, from its renames [(from, to, fsync, bytes when fsynced,
    bytes when renamed)] (audit.WriteAudit) and the files it wrote: (kind, why) as in SURVIVED, or None if right."""
    target = os.path.realpath(snapshot)
    into = [r for r in renames if r[1] == target]
    name = os.path.basename(snapshot)
    if not into:
        return "in place", (f"{name} was written in place, not renamed into place (a copy onto it, or a write to it): "
                            f"a crash during that write leaves half a file. Write a temporary file next to {name}, "
                            "then os.replace() it")
    src, _, synced, at_sync, at_rename = into[-1]
    if os.path.dirname(src) != os.path.dirname(target):
        return "cluster", moved_problem(src, name, os.path.dirname(target))
    if synced == "no":
        return "node", ("the temporary file was renamed without os.fsync() first: the rename is atomic, but after a "
                        "node crash the file system may have stored the rename before the bytes (delayed "
                        "allocation), and the snapshot is then empty or short. f.flush() and os.fsync(f.fileno()) "
                        "before os.replace()")
    if synced == "early":
        return "node", (f"the temporary file was fsynced before its last write ({at_sync:,} bytes when os.fsync() "
                        f"ran, {at_rename:,} when it was renamed): fsync makes durable only what was written before "
                        "it, so after a node crash the snapshot may be empty or short. Write everything, f.flush(), "
                        "then os.fsync(f.fileno()), then os.replace()")
    moved = {r[0] for r in renames}
    side = [p for _, p in writes if os.path.realpath(p) not in moved | {target} and os.path.isfile(p)]
    if side:
        return "in place", (f"it also wrote {os.path.basename(side[0])} in place, beside {name} (never renamed into "
                            "place): a crash during that write leaves it half written next to a whole snapshot, and "
                            f"the restart cannot read it. Keep everything in {name}, written once, atomically (the "
                            "RNG states too, as tensors and plain values)")
    return None


def moved_problem(src: str, name: str, folder: str) -> str:
    """The temporary file ``src`` was in another folder than the snapshot's (``folder``)."""
    if os.path.dirname(src) == os.getcwd():
        where = (f"the folder the run started in, not {name}'s folder ({os.path.basename(folder)}/): the two may be "
                 "different file systems (the job's folder on one, the snapshots on a shared one)")
    else:
        where = ("on a cluster /tmp is the node's own disk and the snapshot's folder a shared file system (Lustre, "
                 "GPFS, NFS)")
    return (f"the temporary file was {src}, in another folder than {name}: {where}; a rename between two file "
            "systems fails (EXDEV), and shutil.move then copies, which is not atomic. Create the temporary file in "
            f"the folder of the path save_snapshot is given (f\"{{path}}.tmp\", or "
            "tempfile.mkstemp(dir=os.path.dirname(path)))")


def model_of(path):
    """The model's state_dict (a plain Net's names) in the snapshot at ``path``; None if none or it does not load."""
    import torch

    from course_lib.model import Net
    want = set(Net().state_dict())
    try:
        snapshot = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - a torn or missing file: no model to compare with
        return None
    return next((sd for sd in state_dicts(snapshot) if set(sd) == want), None)


def gap_problem(states: list, before: str | None, after: str | None, snapshot: str) -> str | None:
    """The first moment of a save, watched call by call ([(call, sha or None)], audit.PathWatch), at which
    ``snapshot`` held neither the old snapshot (``before``) nor the new one (``after``); None if there was none."""
    whole = {before, after} - {None}
    name = os.path.basename(snapshot)
    for i, (call, sha) in enumerate(states):
        if sha in whole:
            continue
        until = next((c for c, s in states[i + 1:] if s in whole), None)
        state, left = ((f"no {name}", "no snapshot to resume from: the restart begins again at step 1")
                       if sha is None else (f"a {name} that was neither the old snapshot nor the new one",
                                            "a snapshot that does not load"))
        return (f"a second save_snapshot, watched call by call: after {call} there was {state}"
                + (f" until {until}" if until else "") + f"; a crash or a kill in that moment leaves {left}. "
                "os.replace(tmp, path) puts the new file in place of the old one in one atomic step: neither delete "
                "nor move the old one first")
    return None
