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


def load_problem(weights_only: list) -> str | None:
    if False in weights_only:
        return ("load_snapshot reads the snapshot with torch.load(..., weights_only=False): unpickling runs any code "
                "the file holds, and a snapshot on a shared file system can be replaced by anyone who can write "
                "there. The snapshot is tensors and plain values: weights_only=True (torch's default) reads it")
    return None


def write_problem(renames: list, snapshot: str) -> str | None:
    """Judge how rank 0 brought ``snapshot`` into place, from its renames [(from, to, fsynced)]; None if right."""
    target = os.path.realpath(snapshot)
    into = [(src, synced) for src, dst, synced in renames if dst == target]
    name = os.path.basename(snapshot)
    if not into:
        return (f"{name} was written in place, not renamed into place (a copy onto it, or a write to it): a crash "
                f"during that write leaves half a file. Write a temporary file next to {name}, then os.replace() it")
    src, synced = into[-1]
    if os.path.dirname(src) != os.path.dirname(target):
        return (f"the temporary file was {src}, in another folder than {name}: on a cluster /tmp is the node's own "
                "disk and the snapshot's folder a shared file system (Lustre, GPFS, NFS); a rename between two file "
                "systems fails (EXDEV), and shutil.move then copies, which is not atomic. Create the temporary file "
                f"in {name}'s own folder (f\"{{path}}.tmp\", or tempfile.mkstemp(dir=os.path.dirname(path)))")
    if not synced:
        return ("the temporary file was renamed without os.fsync() first: the rename is atomic, but after a node "
                "crash the file system may have stored the rename before the bytes (delayed allocation), and the "
                "snapshot is then empty or short. f.flush() and os.fsync(f.fileno()) before os.replace()")
    return None


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
