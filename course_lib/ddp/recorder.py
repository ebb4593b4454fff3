"""What one rank did, as the probe saw it: ``rank-<N>.json`` (and ``params-<N>.f32``) in ``$COURSE_PROBE_DIR``.

The record is rewritten whole at every event, atomically, so that a rank killed in a deadlock still leaves
its last complete record. ``called`` wraps a torch function so that the record notes the call (and which
wrapped call an exception escaped from).
"""
import functools
import json
import sys
import sysconfig
import time
import weakref
from pathlib import Path

from course_lib.core.atomic import atomic_writer, write_text

COLLECTIVES = ("all_reduce", "barrier", "broadcast", "all_gather", "all_gather_into_tensor", "reduce",
               "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "all_to_all", "send", "recv",
               "isend", "irecv", "all_gather_object", "broadcast_object_list", "monitored_barrier",
               "new_group")   # every rank of the job must call it: one made on some ranks only leaves the next waiting
STDLIB = sysconfig.get_paths()["stdlib"]
STEPS = {"init_process_group": 1, "DistributedDataParallel": 2, "DataLoader": 3, "DistributedSampler": 3,
         "set_epoch": 3, "set_device": 4, "save": 5, "destroy_process_group": 6, "spawn": 1, "start_processes": 1}


class Recorder:
    """What this rank did, written to JSON after every event."""

    def __init__(self, folder: Path, rank: int, script: Path):
        self.folder, self.rank, self.script = folder, rank, script
        self.data = {"launch_rank": rank, "script": str(script), "phase": "start", "in_call": None, "exit": None,
                     "env_reads": [], "init": [], "ddp": [], "ddp_forward": 0, "ddp_grad_forward": [0, 0],
                     "collectives": {}, "spawned": [], "loaders": {}, "loader_errors": [], "set_epoch": [],
                     "optimizer_steps": 0, "saves": [], "forward_devices": [], "set_device": [], "destroy": []}
        self.params = {}          # optimizer number -> last flat copy of its parameters
        self.ddp_models = weakref.WeakSet()
        self.current_iter = None  # the loader iteration whose batches are being trained on
        self.call_since = None    # when the wrapped call in data["in_call"] started
        self._dirty_params = False

    # ---------------------------------------------------------------- output
    def write(self):
        write_text(self.folder / f"rank-{self.rank}.json", json.dumps(self.data))

    def write_params(self):
        """The parameters, flat, as raw float32 (``ddp.runs.Run.params`` reads them without torch)."""
        if not self._dirty_params or not self.params:
            return
        import torch
        flat = torch.cat([self.params[k] for k in sorted(self.params)])
        with atomic_writer(self.folder / f"params-{self.rank}.f32", "wb") as f:
            f.write(flat.numpy().tobytes())
        self._dirty_params = False

    def phase(self, name: str):
        self.data["phase"] = name
        self.write()

    # ---------------------------------------------------------------- helpers
    def learner_frame(self):
        """The nearest caller outside the standard library, if it is the learner's code (not torch, not the probe)."""
        f = sys._getframe(2)
        while f is not None:
            name = f.f_code.co_filename
            if name.startswith("<frozen") or (name.startswith(STDLIB) and "-packages" not in name):
                f = f.f_back     # os.getenv, Mapping.get, ...: look at who called them
                continue
            return f if self.is_learner_file(name) else None
        return None

    def is_learner_file(self, filename: str) -> bool:
        p = Path(filename)
        return p == self.script or p.parent == self.script.parent

    def place(self, frames) -> dict:
        """File, line and source line of the deepest frame of the learner's code among ``frames`` (a
        ``traceback.StackSummary``: a crash's traceback, or the stack of a hook past torch and the probe)."""
        mine = [f for f in frames if self.is_learner_file(f.filename)]
        last = mine[-1] if mine else None
        return {"file": last.filename, "line": last.lineno, "code": (last.line or "").strip()} if last else {}

    def dist_rank(self):
        import torch.distributed as dist
        try:
            return dist.get_rank() if initialized() else None
        except Exception:  # noqa: BLE001 - a broken group must not break the record
            return None


def initialized() -> bool:
    """Whether this rank has a process group now."""
    import torch.distributed as dist
    return bool(dist.is_available() and dist.is_initialized())


def called(name, fn, rec, before=None, after=None):
    """Wrap ``fn``: note the call in ``rec`` (``in_call`` names the wrapper an exception escaped from)."""
    def wrapper(*args, **kwargs):
        info = before(*args, **kwargs) if before else None
        outer, since = rec.data["in_call"], rec.call_since
        rec.data["in_call"], rec.call_since = name, time.monotonic()
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:
            rec.data["error_in"] = {"call": name, "step": STEPS.get(name), "error": describe(e)}
            rec.write()
            raise
        finally:
            rec.data["in_call"], rec.call_since = outer, since
        if after:
            after(result, info, *args, **kwargs)
        return result
    return functools.wraps(fn)(wrapper)


def describe(e: BaseException) -> str:
    if isinstance(e, SyntaxError):   # its str() repeats the file and line, which are reported apart
        return f"{type(e).__name__}: {e.msg}"
    return f"{type(e).__name__}: {e}".strip()[:600]
