"""The probe's hooks on torch for Steps 1, 2, 4, 5 and 6 (the data hooks of Step 3 are in ``datahooks``).

``install`` replaces or hooks torch functions so that what the learner's code does lands in the rank's record; the
learner's calls still run as they would.
"""
import os
import sys
import traceback
from pathlib import Path

from course_lib.ddp import averaging, logged, traffic
from course_lib.ddp.recorder import COLLECTIVES, Recorder, called

LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_LOCALID",
               "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NODEID", "SLURM_NNODES", "OMPI_COMM_WORLD_RANK",
               "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE")


def install(rec: Recorder):
    for hook in (_note_env_reads, _wrap_init_and_destroy, _count_collectives, _note_spawn, _wrap_ddp,
                 averaging.install, _note_optimizer_steps, _note_devices, _note_save, logged.install):
        hook(rec)


# -------------------------------------------------------------------- Step 1: process group, environment
def _note_env_reads(rec: Recorder):
    """The launcher variables the learner's code reads (torch's get_node_local_rank() reads LOCAL_RANK for it)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    cls = type(os.environ)
    original = cls.__getitem__

    def getitem(self, key):
        if self is os.environ and key in LAUNCH_VARS and key not in rec.data["env_reads"] and rec.learner_frame():
            rec.data["env_reads"].append(key)
        return original(self, key)

    cls.__getitem__ = getitem
    if hasattr(c10d, "get_node_local_rank"):
        def note_local_rank(*_a, **_k):
            if "LOCAL_RANK" not in rec.data["env_reads"]:
                rec.data["env_reads"].append("LOCAL_RANK")
        wrapped = called("get_node_local_rank", c10d.get_node_local_rank, rec, note_local_rank)
        dist.get_node_local_rank = c10d.get_node_local_rank = wrapped


def _wrap_init_and_destroy(rec: Recorder):
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    def before_init(*args, **kwargs):
        requested = {**dict(zip(("backend", "init_method", "timeout", "world_size", "rank"), args)), **kwargs}
        entry = {"requested": {k: (v if isinstance(v, (int, str, type(None))) else repr(v))
                               for k, v in requested.items() if k in ("backend", "init_method", "world_size", "rank")}}
        rec.data["init"].append(entry)
        rec.write()
        return entry

    def after_init(_result, entry, *args, **kwargs):
        entry.update(rank=dist.get_rank(), world_size=dist.get_world_size(), backend=str(dist.get_backend()))
        rec.phase("init")

    init = called("init_process_group", c10d.init_process_group, rec, before_init, after_init)
    dist.init_process_group = c10d.init_process_group = init

    def before_destroy(*args, **kwargs):
        alive = len(rec.ddp_models)   # no gc.collect() here: what the learner's code left alive
        rec.data["destroy"].append({"ddp_alive": alive, "group": bool(args or kwargs.get("group")),
                                    "held_by": holders(rec) if alive else []})
        rec.write_params()
        rec.write()

    def after_destroy(*_):
        rec.phase("destroyed")

    destroy = called("destroy_process_group", c10d.destroy_process_group, rec, before_destroy, after_destroy)
    dist.destroy_process_group = c10d.destroy_process_group = destroy


def holders(rec: Recorder) -> list[str]:
    """The names by which the learner's code still holds a live DDP model: locals and globals of its frames,
    attributes of its objects (``self.net``), the module that wraps it (torch.compile's ``_orig_mod``)."""
    import gc

    import torch

    models = list(rec.ddp_models)
    found: list[str] = []

    def named(space: dict, where: str):
        found.extend(f"`{k}` ({where})" for k, v in list(space.items()) if any(v is m for m in models))

    frame = sys._getframe(1)
    while frame is not None:   # the running frames' locals are not gc referrers: look at each
        if rec.is_learner_file(frame.f_code.co_filename):
            fn = frame.f_code.co_name
            named(frame.f_locals, "a global" if fn == "<module>" else f"a local of {fn}()")
        frame = frame.f_back
    for model in models:
        for ref in gc.get_referrers(model):
            if not isinstance(ref, dict) or "__builtins__" in ref:
                continue   # module globals were seen above
            for owner in gc.get_referrers(ref):
                if getattr(owner, "__dict__", None) is ref:
                    named(ref, f"an attribute of a {type(owner).__name__}")
                elif isinstance(owner, torch.nn.Module) and owner._modules is ref:
                    found.extend(f"a {type(owner).__name__} that wraps it as {k}" for k, v in ref.items()
                                 if v is model)
    return list(dict.fromkeys(found))[:5]


def _count_collectives(rec: Recorder):
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in COLLECTIVES:   # each in torch.distributed since 2.0 (pyproject: torch>=2.1)
        fn = getattr(c10d, name)

        def count(*args, _name=name, **kwargs):
            c = rec.data["collectives"]
            c[_name] = c.get(_name, 0) + 1
            numel = sum(a.numel() for a in args if isinstance(a, torch.Tensor))
            c[_name + ":numel"] = c.get(_name + ":numel", 0) + numel
            if rec.current_iter is not None and numel:   # inside a loop over a DataLoader: ddp.traffic judges it
                traffic.note(rec.current_iter, _name, numel, lambda: rec.place(traceback.extract_stack()))
            elif rec.current_iter is not None and _name == "barrier":
                traffic.note_barrier(rec.current_iter, lambda: rec.place(traceback.extract_stack()))
            return logged.scalar(args, kwargs) if _name == "all_reduce" else None   # a loss for the log?

        def after(_result, before, *args, **kwargs):
            logged.note_reduce(rec, before, *args, **kwargs)

        wrapped = called(name, fn, rec, count, after if name == "all_reduce" else None)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is fn:
            setattr(dist, name, wrapped)


def _note_spawn(rec: Recorder):
    import torch.multiprocessing as tmp
    for name in ("spawn", "start_processes"):   # processes the script starts itself run without the probe: say so
        def note_spawn(*args, _name=name, **kwargs):
            rec.data["spawned"].append(_name)
            rec.write()
        setattr(tmp, name, called(name, getattr(tmp, name), rec, note_spawn))


# -------------------------------------------------------------------- Step 2: DDP, optimizer, parameters
def _group_given(group):
    """DDP's ``process_group`` argument: None (the default group: every rank), the ranks of the group, or
    "not a member": what new_group returns on a rank outside the new group (GroupMember.NON_GROUP_MEMBER)."""
    import torch.distributed as dist

    if group is None:
        return None
    if isinstance(group, int) and group == dist.GroupMember.NON_GROUP_MEMBER:
        return "not a member"
    try:
        return dist.get_process_group_ranks(group)
    except Exception:  # noqa: BLE001 - an odd argument must not break the record
        return repr(group)[:80]


def _wrap_ddp(rec: Recorder):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    def before_ddp(self, module=None, device_ids=None, *args, **kwargs):
        rec.data["ddp"].append({"group": _group_given(args[4] if len(args) > 4 else kwargs.get("process_group")),
                                "where": rec.place(traceback.extract_stack()) or None})
        rec.write()

    def after_ddp(_result, _info, self, *args, **kwargs):
        rec.ddp_models.add(self)
        rec.phase("ddp")

    DDP.__init__ = called("DistributedDataParallel", DDP.__init__, rec, before_ddp, after_ddp)
    forward = DDP.forward

    def ddp_forward(self, *args, **kwargs):
        rec.data["ddp_forward"] += 1
        if torch.is_grad_enabled():   # a training forward: [all of them, those inside model.no_sync()]
            # no_sync() clears this flag, and DDP reads it in forward: the backward that follows reduces nothing
            rec.data["ddp_grad_forward"][1] += not self.require_backward_grad_sync
            rec.data["ddp_grad_forward"][0] += 1
        return forward(self, *args, **kwargs)

    DDP.forward = ddp_forward


def _note_optimizer_steps(rec: Recorder):
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    optimizers = {}   # id(optimizer) -> its number, in order of the first step

    def after_step(optimizer, _args, _kwargs):
        if id(optimizer) not in optimizers:
            averaging.note_optimizer(rec, optimizer)
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


# -------------------------------------------------------------------- Step 4: devices
def _note_devices(rec: Recorder):
    """set_device calls (before or after init), and the (input, parameter) devices of module calls."""
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        def note_device(*args, **kwargs):
            rec.data["set_device"].append({"device": str(args[0] if args else kwargs.get("device")),
                                           "before_init": not dist.is_initialized()})
        torch.cuda.set_device = called("set_device", torch.cuda.set_device, rec, note_device)
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


# -------------------------------------------------------------------- Step 5: checkpoints
def _note_save(rec: Recorder):
    import torch

    def before_save(obj, f, *args, **kwargs):
        rec.data["saves"].append({"rank": rec.dist_rank(), "launch_rank": rec.rank, "type": type(obj).__name__,
                                  "path": os.path.abspath(os.fspath(f)) if isinstance(f, (str, os.PathLike))
                                  else repr(f)})
        rec.data["phase"] = "save"
        rec.write_params()
        rec.write()

    torch.save = called("save", torch.save, rec, before_save)


def note_checkpoint(rec: Recorder):
    """After the script: Step 5's verdict on the file of this rank's last save as rank 0 (``loads_into_net``), with
    the file's ``stat_of``. The checker takes it while the file is unchanged (else it loads the file itself), so
    that its own process needs no torch."""
    mine = [s for s in rec.data["saves"] if s["rank"] in (0, None)]
    if not mine:
        return
    last, path = mine[-1], Path(mine[-1]["path"])
    before = stat_of(path)
    try:
        verdict = loads_into_net(path, last["type"])
    except Exception:  # noqa: BLE001 - the checker loads it itself
        return
    if before is not None and stat_of(path) == before:   # not written while it was read
        last["loads"] = {"verdict": list(verdict), "stat": before}


def stat_of(path: Path) -> list | None:
    """What changes when a file is written again: [inode, size, mtime in ns]; None when it is not there."""
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def loads_into_net(path: Path, saved_type: str):
    """Rank 0's checkpoint: a state_dict without DDP's prefix that loads into Net() with strict=True?"""
    if not path.is_file():
        return False, f"rank 0 saved {path.name}, but the file is not there"
    import torch

    from course_lib.model import Net
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - whatever was saved, say what it is
        return False, (f"{path.name} does not load as a state_dict ({saved_type} was saved; "
                       f"{type(e).__name__}): save model.module.state_dict(), not the model object")
    if not isinstance(state, dict):
        return False, f"{path.name} holds a {type(state).__name__}: save the model's state_dict"
    keys = list(state)
    if keys and all(str(k).startswith("module.") for k in keys):
        return False, (f"the keys of {path.name} start with 'module.' ({keys[0]}): that is the DDP wrapper's "
                       "state_dict, which does not load into a plain Net. Save model.module.state_dict().")
    try:
        Net().load_state_dict(state, strict=True)
    except Exception as e:  # noqa: BLE001
        return False, (f"{path.name} does not load into Net() with strict=True: {str(e).splitlines()[0][:200]} "
                       f"(keys: {', '.join(map(str, keys[:4]))}{', ...' if len(keys) > 4 else ''})")
    return True, f"only rank 0 wrote {path.name}; it loads into Net() with strict=True"
