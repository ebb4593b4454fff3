"""Run a learner's training script as one rank, watching what it does from outside its code.

    python -m course_lib.checks.ddp_probe SCRIPT [ARGS...]     (one per rank, via course_lib.launch)

Before the script runs (``runpy``, as ``python SCRIPT ARGS`` would), the probe wraps the parts of torch
that the six DDP steps touch and writes what it saw to ``$COURSE_PROBE_DIR/rank-<N>.json`` (N: the
launcher's rank), rewritten at every event so that a rank killed in a deadlock still leaves its record:

- Step 1: ``init_process_group`` (arguments, resulting rank, world size, backend, error), which launcher
  variables the script itself reads (SLURM_*, RANK, LOCAL_RANK, WORLD_SIZE), ``torch.cuda.set_device``;
- Step 2: ``DistributedDataParallel`` construction and forward calls, the user's collectives, optimizer
  steps, and the trained parameters (``params-<N>.pt`` at the end of each epoch and at the end);
- Step 3: every index each DataLoader iteration hands out (the sampler's whole epoch), ``set_epoch`` calls,
  DataLoader errors (``shuffle=True`` with a sampler);
- Step 4: the devices of the inputs and parameters of every module call;
- Step 5: every ``torch.save``: which rank, where, the keys of the saved dict;
- Step 6: ``destroy_process_group``, and whether a DDP model was still alive then.

A rank that waits in a collective (or in the rendezvous) longer than ``$COURSE_PROBE_STALL`` seconds, or
runs longer than ``$COURSE_PROBE_HANG`` seconds, dumps its stack to ``stack-<N>.txt`` (``faulthandler``)
and exits; one stopped by SIGTERM dumps it there too. With ``$COURSE_PROBE_DATA`` (a file the
checker prepares) the ``digits`` data set is read from that file: a small subset, and no scikit-learn import.
"""
from __future__ import annotations

import faulthandler
import json
import os
import runpy
import signal
import sys
import sysconfig
import time
import traceback
import weakref
from pathlib import Path

LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_LOCALID",
               "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NODEID", "SLURM_NNODES", "OMPI_COMM_WORLD_RANK",
               "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE")
COLLECTIVES = ("all_reduce", "barrier", "broadcast", "all_gather", "all_gather_into_tensor", "reduce",
               "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "all_to_all", "send", "recv",
               "isend", "irecv", "all_gather_object", "broadcast_object_list", "monitored_barrier")
STDLIB = sysconfig.get_paths()["stdlib"]
MAX_INDICES = 1_000_000     # a sampler longer than this is recorded only in part (an infinite sampler)
STEPS = {"init_process_group": 1, "DistributedDataParallel": 2, "DataLoader": 3, "DistributedSampler": 3,
         "set_epoch": 3, "set_device": 4, "save": 5, "destroy_process_group": 6, "spawn": 1, "start_processes": 1}


def launch_rank() -> int:
    """The rank the launcher gave this process (torchrun's RANK, else srun's SLURM_PROCID)."""
    for name in ("RANK", "SLURM_PROCID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


class Recorder:
    """What this rank did, written to JSON after every event."""

    def __init__(self, folder: Path, rank: int, script: Path):
        self.folder, self.rank, self.script = folder, rank, script
        self.script_dir = script.parent
        self.data = {"launch_rank": rank, "pid": os.getpid(), "script": str(script), "phase": "start",
                     "env_reads": [], "init": [], "ddp": [], "ddp_forward": 0, "collectives": {},
                     "loaders": {}, "loader_errors": [], "set_epoch": [], "optimizer_steps": 0,
                     "saves": [], "forward_devices": [], "set_device": [], "destroy": [], "exit": None,
                     "spawned": [],
                     "in_call": None, "cwd": os.getcwd()}
        self.params = {}          # optimizer number -> last flat copy of its parameters
        self.ddp_models = weakref.WeakSet()
        self.current_iter = None  # the loader iteration whose batches are being trained on
        self.call_since = None    # when the wrapped call in data["in_call"] started
        self._dirty_params = False

    # ---------------------------------------------------------------- output
    def write(self):
        path = self.folder / f"rank-{self.rank}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data), encoding="utf-8")
        os.replace(tmp, path)

    def write_params(self):
        if not self._dirty_params or not self.params:
            return
        import torch
        flat = torch.cat([self.params[k] for k in sorted(self.params)])
        path = self.folder / f"params-{self.rank}.pt"
        _ORIGINAL["save"](flat, str(path) + ".tmp")
        os.replace(str(path) + ".tmp", path)
        self._dirty_params = False

    def phase(self, name: str):
        self.data["phase"] = name
        self.write()

    # ---------------------------------------------------------------- helpers
    def learner_frame(self, depth: int = 2):
        """The nearest caller outside the standard library, if it is the learner's code (not torch, not the probe)."""
        f = sys._getframe(depth)
        while f is not None:
            name = f.f_code.co_filename
            if name.startswith("<frozen") or (name.startswith(STDLIB) and "-packages" not in name):
                f = f.f_back     # os.getenv, Mapping.get, ...: look at who called them
                continue
            return f if self.is_learner_file(name) else None
        return None

    def is_learner_file(self, filename: str) -> bool:
        p = Path(filename)
        return p == self.script or p.parent == self.script_dir

    def dist_rank(self):
        import torch.distributed as dist
        try:
            return dist.get_rank() if dist.is_available() and dist.is_initialized() else None
        except Exception:  # noqa: BLE001 - a broken group must not break the record
            return None


_ORIGINAL = {}
REC: Recorder | None = None


def _called(name, fn, rec, before=None, after=None):
    """Wrap ``fn``: note the call in ``rec`` (``in_call`` names the wrapper an exception escaped from)."""
    def wrapper(*args, **kwargs):
        info = before(*args, **kwargs) if before else None
        outer, since = rec.data["in_call"], rec.call_since
        rec.data["in_call"], rec.call_since = name, time.monotonic()
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:
            rec.data["error_in"] = {"call": name, "step": STEPS.get(name), "error": _describe(e)}
            rec.write()
            raise
        finally:
            rec.data["in_call"], rec.call_since = outer, since
        if after:
            after(result, info, *args, **kwargs)
        return result
    wrapper.__wrapped__ = fn
    wrapper.__name__ = getattr(fn, "__name__", name)
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    return wrapper


def _describe(e: BaseException) -> str:
    if isinstance(e, SyntaxError):   # its str() repeats the file and line, which are reported apart
        return f"{type(e).__name__}: {e.msg}"
    return f"{type(e).__name__}: {e}".strip()[:600]


def _device_of(t):
    return str(t.device) if hasattr(t, "device") else None


# -------------------------------------------------------------------- Step 1: process group, environment
def _install_env_reads(rec: Recorder):
    cls = type(os.environ)
    original = cls.__getitem__

    def getitem(self, key):
        if self is os.environ and key in LAUNCH_VARS and key not in rec.data["env_reads"] and rec.learner_frame():
            rec.data["env_reads"].append(key)
        return original(self, key)

    cls.__getitem__ = getitem


def _install_process_group(rec: Recorder):
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    def before_init(*args, **kwargs):
        names = ("backend", "init_method", "timeout", "world_size", "rank")
        requested = {k: v for k, v in zip(names, args)}
        requested.update(kwargs)
        entry = {"requested": {k: (v if isinstance(v, (int, str, type(None))) else repr(v))
                               for k, v in requested.items() if k in ("backend", "init_method", "world_size", "rank")},
                 "env": {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")},
                 "time": time.time()}
        rec.data["init"].append(entry)
        rec.write()
        return entry

    def after_init(_result, entry, *args, **kwargs):
        entry.update(rank=dist.get_rank(), world_size=dist.get_world_size(), backend=str(dist.get_backend()))
        rec.phase("init")

    init = _called("init_process_group", c10d.init_process_group, rec, before_init, after_init)
    dist.init_process_group = c10d.init_process_group = init

    def before_destroy(*args, **kwargs):
        alive = len(rec.ddp_models)   # no gc.collect() here: what the learner's code left alive
        rec.data["destroy"].append({"ddp_alive": alive, "group": bool(args or kwargs.get("group"))})
        rec.write_params()
        rec.write()

    def after_destroy(*_):
        rec.phase("destroyed")

    destroy = _called("destroy_process_group", c10d.destroy_process_group, rec, before_destroy, after_destroy)
    dist.destroy_process_group = c10d.destroy_process_group = destroy

    for name in COLLECTIVES:
        fn = getattr(c10d, name, None)
        if fn is None:
            continue

        def count(*args, _name=name, **kwargs):
            c = rec.data["collectives"]
            c[_name] = c.get(_name, 0) + 1
            numel = sum(a.numel() for a in args if isinstance(a, torch.Tensor))
            c[_name + ":numel"] = c.get(_name + ":numel", 0) + numel

        wrapped = _called(name, fn, rec, count)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is fn:
            setattr(dist, name, wrapped)

    if hasattr(c10d, "get_node_local_rank"):
        def note_local_rank(*_a, **_k):
            if "LOCAL_RANK" not in rec.data["env_reads"]:
                rec.data["env_reads"].append("LOCAL_RANK")
        wrapped = _called("get_node_local_rank", c10d.get_node_local_rank, rec, note_local_rank)
        dist.get_node_local_rank = c10d.get_node_local_rank = wrapped

    import torch.multiprocessing as tmp
    for name in ("spawn", "start_processes"):
        if hasattr(tmp, name):   # processes the script starts itself run without the probe: say so
            def note_spawn(*args, _name=name, **kwargs):
                rec.data.setdefault("spawned", []).append(_name)
                rec.write()
            setattr(tmp, name, _called(name, getattr(tmp, name), rec, note_spawn))

    if torch.cuda.is_available():
        def note_device(*args, **kwargs):
            rec.data["set_device"].append({"device": str(args[0] if args else kwargs.get("device")),
                                           "before_init": not dist.is_initialized()})
        torch.cuda.set_device = _called("set_device", torch.cuda.set_device, rec, note_device)


# -------------------------------------------------------------------- Step 2: DDP, optimizer, parameters
def _install_training(rec: Recorder):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.optim.optimizer import register_optimizer_step_post_hook

    init = DDP.__init__

    def before_ddp(self, module=None, device_ids=None, *args, **kwargs):
        params = list(module.parameters()) if module is not None else []
        rec.data["ddp"].append({"device_ids": repr(device_ids), "param_device": _device_of(params[0]) if params else None,
                                "module": type(module).__name__})
        rec.write()

    def after_ddp(_result, _info, self, *args, **kwargs):
        rec.ddp_models.add(self)
        rec.phase("ddp")

    DDP.__init__ = _called("DistributedDataParallel", init, rec, before_ddp, after_ddp)

    forward = DDP.forward

    def ddp_forward(self, *args, **kwargs):
        rec.data["ddp_forward"] += 1
        return forward(self, *args, **kwargs)

    DDP.forward = ddp_forward

    optimizers = {}   # id(optimizer) -> its number, in order of the first step

    def after_step(optimizer, _args, _kwargs):
        number = optimizers.setdefault(id(optimizer), len(optimizers))
        try:
            with torch.no_grad():
                rec.params[number] = torch.cat([p.detach().reshape(-1).float().cpu()
                                                for g in optimizer.param_groups for p in g["params"]])
        except Exception:  # noqa: BLE001 - odd parameters (sparse, meta): Step 2 then says it could not read them
            rec.params.pop(number, None)
        rec._dirty_params = True
        rec.data["optimizer_steps"] += 1
        if rec.current_iter is not None:
            rec.current_iter["steps"] += 1
        if rec.data["phase"] in ("start", "init", "ddp"):
            rec.data["phase"] = "train"

    register_optimizer_step_post_hook(after_step)

    seen = rec.data["forward_devices"]

    def forward_pre(module, args):
        tensor = next((a for a in args if isinstance(a, torch.Tensor)), None) if isinstance(args, tuple) else None
        param = next(module.parameters(recurse=False), None)
        if tensor is None or param is None:
            return
        pair = [str(tensor.device), str(param.device)]
        if pair not in seen and len(seen) < 20:
            seen.append(pair)

    torch.nn.modules.module.register_module_forward_pre_hook(forward_pre)


# -------------------------------------------------------------------- Step 3: data
def _install_data(rec: Recorder):
    import torch.utils.data as tud
    from torch.utils.data import dataloader as dl
    from torch.utils.data.distributed import DistributedSampler

    loaders = {}   # id(loader) -> number

    def loader_info(loader):
        key = id(loader)
        if key not in loaders:
            loaders[key] = len(loaders)
            try:
                n = len(loader.dataset)
            except TypeError:
                n = None
            rec.data["loaders"][str(loaders[key])] = {
                "dataset_len": n, "sampler": type(loader.sampler).__name__,
                "batch_sampler": type(loader.batch_sampler).__name__ if loader.batch_sampler is not None else None,
                "batch_size": loader.batch_size, "drop_last": loader.drop_last, "iters": []}
        return rec.data["loaders"][str(loaders[key])]

    def record_epoch(it, loader):
        """Materialise this iteration's indices (the sampler's whole epoch) and note them.

        Whatever goes wrong here is the probe's problem, never the learner's: the iteration goes on as it was.
        """
        if isinstance(loader.dataset, tud.IterableDataset):
            return   # no indices to record: the data set yields the samples itself
        batches, flat = [], []
        source = it._sampler_iter
        try:
            for item in source:
                batches.append(item)
                flat.extend(item if isinstance(item, (list, tuple)) else [item])
                if len(flat) >= MAX_INDICES:
                    break
        finally:
            it._sampler_iter = _chain(batches, source)
        try:
            indices = [int(i) for i in flat]
        except (TypeError, ValueError):
            indices = []
        entry = {"indices": indices, "batches": 0, "steps": 0, "done": False, "dist_rank": rec.dist_rank()}
        loader_info(loader)["iters"].append(entry)
        it._course_probe_entry = entry
        rec.write()

    base = dl._BaseDataLoaderIter
    base_init, base_reset, base_next = base.__init__, base._reset, base.__next__

    def init(self, loader, *args, **kwargs):
        base_init(self, loader, *args, **kwargs)
        record_epoch(self, loader)

    def reset(self, loader, *args, **kwargs):
        base_reset(self, loader, *args, **kwargs)
        record_epoch(self, loader)

    def next_(self):
        entry = getattr(self, "_course_probe_entry", None)
        try:
            batch = base_next(self)
        except StopIteration:
            if entry is not None and not entry["done"]:
                entry["done"] = True
                rec.current_iter = None
                rec.write_params()
                rec.write()
            raise
        if entry is not None:
            entry["batches"] += 1
            rec.current_iter = entry
        return batch

    base.__init__, base._reset, base.__next__ = init, reset, next_

    dl_init = tud.DataLoader.__init__

    def before_loader(self, dataset=None, *args, **kwargs):
        names = ("batch_size", "shuffle", "sampler", "batch_sampler")
        given = dict(zip(names, args))
        given.update(kwargs)
        rec.data["loader_errors"].append({"shuffle": repr(given.get("shuffle")),
                                          "sampler": type(given.get("sampler")).__name__
                                          if given.get("sampler") is not None else None,
                                          "error": None})
        return rec.data["loader_errors"][-1]

    def after_loader(_result, entry, *args, **kwargs):
        rec.data["loader_errors"].remove(entry)   # only failed constructions are kept

    def loader_init(self, *args, **kwargs):
        entry = before_loader(self, *args, **kwargs)
        try:
            dl_init(self, *args, **kwargs)
        except BaseException as e:
            entry["error"] = _describe(e)
            rec.data["error_in"] = {"call": "DataLoader", "step": 3, "error": _describe(e)}
            rec.write()
            raise
        after_loader(None, entry)

    tud.DataLoader.__init__ = loader_init
    dl.DataLoader.__init__ = loader_init

    set_epoch = DistributedSampler.set_epoch

    def note_epoch(self, epoch, *args, **kwargs):
        rec.data["set_epoch"].append(int(epoch) if isinstance(epoch, int) else repr(epoch))

    DistributedSampler.set_epoch = _called("set_epoch", set_epoch, rec, note_epoch)
    DistributedSampler.__init__ = _called("DistributedSampler", DistributedSampler.__init__, rec)


def _chain(first, rest):
    yield from first
    yield from rest


# -------------------------------------------------------------------- Step 5: checkpoints
def _install_save(rec: Recorder):
    import torch

    _ORIGINAL["save"] = torch.save

    def before_save(obj, f, *args, **kwargs):
        entry = {"rank": rec.dist_rank(), "launch_rank": rec.rank, "type": type(obj).__name__,
                 "path": os.path.abspath(os.fspath(f)) if isinstance(f, (str, os.PathLike)) else repr(f)}
        if isinstance(obj, dict):
            keys = [str(k) for k in obj]
            entry.update(keys=keys[:50], n_keys=len(keys),
                         all_tensors=all(isinstance(v, torch.Tensor) for v in obj.values()))
        rec.data["saves"].append(entry)
        rec.data["phase"] = "save"
        rec.write_params()
        rec.write()

    torch.save = _called("save", torch.save, rec, before_save)


# -------------------------------------------------------------------- data: a small, prepared subset
def _install_data_file(path: str):
    import torch
    import course_lib.data as data

    prepared = torch.load(path, weights_only=True)

    def load_digits_split(split: str):
        images, targets = prepared[split]
        return data.InMemoryDataset(images, targets, "digits", split)

    data.load_digits_split = load_digits_split


# -------------------------------------------------------------------- running the script
def _learner_tb(tb, script: Path):
    """The traceback from the learner's first frame on (the probe's and runpy's frames are noise)."""
    t = tb
    while t is not None and Path(t.tb_frame.f_code.co_filename) != script:
        t = t.tb_next
    return t or tb


def _where(e: BaseException, rec: Recorder) -> dict:
    """File, line and source line of the deepest frame of the learner's code in ``e``'s traceback."""
    if isinstance(e, SyntaxError):
        return {"file": e.filename, "line": e.lineno, "code": (e.text or "").strip()}
    where = {}
    for frame in traceback.extract_tb(e.__traceback__):
        if rec.is_learner_file(frame.filename):
            where = {"file": frame.filename, "line": frame.lineno, "code": (frame.line or "").strip()}
    return where


def _watch_collectives(rec: Recorder, stall: float, stack) -> None:
    """A daemon thread: a collective (or the rendezvous) that waits longer than ``stall`` seconds is a deadlock.

    Collectives release the GIL while they wait, so this thread runs; it dumps every thread's stack and
    ends the process, which spares the checker from waiting for its deadline.
    """
    import threading

    def watch():
        while True:
            time.sleep(0.5)
            name, since = rec.data["in_call"], rec.call_since
            if name is None or since is None or (name not in COLLECTIVES and name != "init_process_group"):
                continue
            limit = stall * (2 if name == "init_process_group" else 1)   # peers may still be starting
            if time.monotonic() - since > limit:
                rec.data["stalled"] = {"call": name, "seconds": round(time.monotonic() - since, 1)}
                rec.write()
                faulthandler.dump_traceback(file=stack, all_threads=True)
                stack.flush()
                os._exit(3)

    threading.Thread(target=watch, name="course-probe-watchdog", daemon=True).start()


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m course_lib.checks.ddp_probe SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    script = Path(argv[0]).resolve()
    folder = Path(os.environ.get("COURSE_PROBE_DIR") or ".")
    folder.mkdir(parents=True, exist_ok=True)
    rank = launch_rank()
    rec = Recorder(folder, rank, script)
    global REC
    REC = rec

    # a deadlock: dump every thread's stack, then exit; a SIGTERM from the launcher: dump, then die
    stack = open(folder / f"stack-{rank}.txt", "w")
    hang = float(os.environ.get("COURSE_PROBE_HANG", "0") or 0)
    if hang > 0:
        faulthandler.dump_traceback_later(hang, exit=True, file=stack)
    faulthandler.register(signal.SIGTERM, file=stack, all_threads=True, chain=True)
    stall = float(os.environ.get("COURSE_PROBE_STALL", "0") or 0)
    if stall > 0:
        _watch_collectives(rec, stall, stack)

    _install_env_reads(rec)
    _install_process_group(rec)
    _install_training(rec)
    _install_data(rec)
    _install_save(rec)
    if os.environ.get("COURSE_PROBE_DATA"):
        _install_data_file(os.environ["COURSE_PROBE_DATA"])
    rec.write()

    sys.argv = [str(script), *argv[1:]]
    sys.path.insert(0, str(script.parent))   # as `python SCRIPT` does
    code = 0
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        rec.data["exit"] = {"code": code, "message": None if isinstance(e.code, (int, type(None))) else str(e.code),
                            "phase": rec.data["phase"], "where": _where(e, rec)}
        if code and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException as e:  # noqa: BLE001 - whatever the learner's code raised is reported, then exits 1
        code = 1
        rec.data["exit"] = {"code": 1, "error": _describe(e), "type": type(e).__name__,
                            "phase": rec.data["phase"], "where": _where(e, rec), "in": rec.data.get("error_in")}
        if isinstance(e, SyntaxError):
            traceback.print_exception(type(e), e, None)
        else:
            traceback.print_exception(type(e), e, _learner_tb(e.__traceback__, script))
    else:
        rec.data["exit"] = {"code": 0, "phase": rec.data["phase"]}
    finally:
        faulthandler.cancel_dump_traceback_later()
        rec.data["initialized_at_exit"] = _initialized()
        rec.data["ddp_alive_at_exit"] = len(rec.ddp_models)
        rec.write_params()
        rec.write()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _initialized() -> bool:
    import torch.distributed as dist
    return bool(dist.is_available() and dist.is_initialized())


if __name__ == "__main__":
    sys.exit(main())
