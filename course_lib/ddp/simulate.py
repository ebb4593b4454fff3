"""The probe's side of a simulated cluster: what a rank would see on another node, GPU or launcher, on CPU.

The checker leaves ``simulate.json`` in a run's probe folder (``$COURSE_PROBE_DIR``); before the learner's
script runs, ``install(rec)`` applies it:
- ``layout: [nodes, ranks_per_node]``: the launcher's variables as a multi-node step gives them and, srun-style,
  MASTER_ADDR as the address of "node 0" (NODE0_ADDR: a script that overwrites it with its own is seen);
- ``env``: variables to add (Slurm's of a one-task step, for ``srun torchrun``);
- ``gpus: G``: a stand-in for G GPUs per node that records which device each rank picks and raises "invalid device
  ordinal" as CUDA does, while everything stays on the CPU (nccl becomes gloo);
- ``stop_at_forward``: the rank ends (exit code 0) at its first module call with parameters: the group and the
  devices are known by then, and the rest of the run would only repeat the full launches.
In every run the learner's launcher variables set in ``os.environ`` (a hard-coded MASTER_ADDR) and files opened for
writing (a file name that repeats on every node) are noted.
"""
import builtins
import json
import os
from pathlib import Path

from course_lib.core.rankkit import exit_now
from course_lib.ddp.recorder import Recorder, initialized

NODE0_ADDR = "127.0.0.2"    # "node 0" of a simulated layout: Linux routes all of 127/8 to the loopback
SETTINGS = "simulate.json"
# set on a module the script sent to a simulated GPU: an attribute, so that copy.deepcopy(model) is on that GPU too,
# as it would be
MOVED = "_course_sim_on_gpu"
WRITES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES")


def install(rec: Recorder, folder: Path):
    """Apply the run's simulation (before the probe's hooks: they wrap what this installs)."""
    sim = json.loads((folder / SETTINGS).read_text()) if (folder / SETTINGS).is_file() else {}
    os.environ.update(sim.get("env", {}))
    if sim.get("layout"):
        rec.data["layout"] = apply_layout(*sim["layout"])
    if sim.get("gpus"):
        rec.data["virtual_gpus"] = sim["gpus"]
        rec.data["picks"] = []
        _virtual_cuda(rec, int(sim["gpus"]))
    if sim.get("stop_at_forward"):
        _stop_at_forward(rec)
    _note_env_writes(rec)
    _note_file_writes(rec)


def _stop_at_forward(rec: Recorder):
    """End the rank at its first module call with parameters, once every rank of its group got there."""
    import torch

    def stop(module, _args):
        if next(module.parameters(recurse=False), None) is None:
            return
        rec.data["exit"] = {"code": 0, "phase": rec.data["phase"], "stopped": "first forward"}
        rec.write()
        if initialized():
            import torch.distributed as dist
            try:   # the others may still be in DDP's first broadcast: leave together
                dist.barrier()
            except Exception:  # noqa: BLE001 - a peer gone already: nothing left to wait for
                pass
        exit_now(0)

    torch.nn.modules.module.register_module_forward_pre_hook(stop)


# ------------------------------------------------------------------------------------------ layout
def apply_layout(nodes: int, per_node: int) -> dict:
    torchrun = "RANK" in os.environ
    rank = int(os.environ["RANK" if torchrun else "SLURM_PROCID"])
    node, local = divmod(rank, per_node)
    if torchrun:
        os.environ.update(LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(per_node), GROUP_RANK=str(node),
                          GROUP_WORLD_SIZE=str(nodes), ROLE_RANK=str(rank))
    else:
        os.environ.update(SLURM_LOCALID=str(local), SLURM_NODEID=str(node), SLURM_NNODES=str(nodes),
                          SLURM_JOB_NUM_NODES=str(nodes), SLURM_STEP_NUM_NODES=str(nodes),
                          SLURM_TASKS_PER_NODE=f"{per_node}(x{nodes})", SLURMD_NODENAME=f"node{node + 1}",
                          SLURM_JOB_NODELIST=f"node[1-{nodes}]", MASTER_ADDR=NODE0_ADDR)
    return {"node": node, "local_rank": local, "nodes": nodes, "per_node": per_node,
            "master_addr": os.environ.get("MASTER_ADDR")}


# ------------------------------------------------------------------------------------------ virtual GPUs
def _virtual_cuda(rec: Recorder, gpus: int):
    """G GPUs per node that are only names: each pick is recorded and checked, the tensors stay on the CPU."""
    import torch
    import torch.nn as nn

    state = {"current": 0}

    def visible() -> int:
        """The node's GPUs, or as many as the script's own CUDA_VISIBLE_DEVICES names."""
        mine = [w["value"] for w in rec.data.get("env_writes", []) if w["var"] == "CUDA_VISIBLE_DEVICES"]
        return len([d for d in mine[-1].split(",") if d.strip()]) if mine else gpus

    def pick(how: str, device) -> torch.device:
        """Record a device the script asked for; a CUDA ordinal this node lacks raises as CUDA does."""
        d = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        if d.type != "cuda":
            return d
        index = state["current"] if d.index is None else d.index
        entry = {"how": how, "device": f"cuda:{index}", "init": initialized()}
        if how != "set_device" and rec.data["picks"] and rec.data["picks"][-1] == entry:
            return torch.device("cpu")   # the same pick again (every batch's .to()): noted once
        rec.data["picks"].append(entry)
        if len(rec.data["picks"]) > 40:
            del rec.data["picks"][20:-20]
        if not 0 <= index < visible():
            entry["invalid"] = True
            rec.write()
            raise RuntimeError("CUDA error: invalid device ordinal")
        rec.write()
        return torch.device("cpu")

    def set_device(device):
        pick("set_device", device)
        state["current"] = device if isinstance(device, int) else (torch.device(device).index or 0)

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = visible
    torch.cuda.current_device = lambda: state["current"]
    torch.cuda.set_device = set_device
    torch.cuda.synchronize = lambda device=None: None
    _redirect_to(torch, nn, pick)
    _constructors_on_cpu(torch, pick, rec)


def _constructors_on_cpu(torch, pick, rec: Recorder):
    """init_process_group(device_id=), DDP(device_ids=) and pinned loaders: the pick recorded, the CPU kept. DDP
    given device_ids for a model still on the CPU raises ValueError, as it does with real GPUs."""
    import torch.distributed.distributed_c10d as c10d
    from torch.nn.parallel import DistributedDataParallel as DDP

    init = c10d.init_process_group

    def init_on_cpu(backend=None, *args, **kwargs):
        if kwargs.get("device_id") is not None:
            pick("init_process_group(device_id=...)", kwargs.pop("device_id"))
        if isinstance(backend, str) and "nccl" in backend:
            backend = "gloo"   # the group's backend is judged by the full launches, not here
        return init(backend, *args, **kwargs)

    c10d.init_process_group = torch.distributed.init_process_group = init_on_cpu
    ddp_init = DDP.__init__

    def ddp_on_cpu(self, module, device_ids=None, output_device=None, *args, **kwargs):
        for d in device_ids or []:
            pick("DDP(device_ids=...)", d)
        if device_ids and not getattr(module, "__dict__", {}).get(MOVED):
            rec.data["ddp_before_move"] = repr(device_ids)
            rec.write()
            raise ValueError("DistributedDataParallel device_ids and output_device arguments only work with "
                             "single-device/multiple-device GPU modules or CPU modules, but got device_ids "
                             f"{device_ids}, output_device {output_device}, and module parameters "
                             "{device(type='cpu')}.")   # DDP's own words (torch/nn/parallel/distributed.py)
        return ddp_init(self, module, None, None, *args, **kwargs)

    DDP.__init__ = ddp_on_cpu
    loader_init = torch.utils.data.DataLoader.__init__

    def loader_on_cpu(self, *args, **kwargs):
        kwargs["pin_memory"] = False   # pinning needs a real CUDA
        return loader_init(self, *args, **kwargs)

    torch.utils.data.DataLoader.__init__ = loader_on_cpu


def _redirect_to(torch, nn, pick):
    """``.to(cuda...)``/``.cuda()`` of tensors and modules: the pick is recorded, the CPU is kept; a module sent
    to a GPU is marked ``MOVED``."""
    tensor_to, module_to = torch.Tensor.to, nn.Module.to

    def t_to(self, *args, **kwargs):
        args, kwargs = _cpu_args(pick, "tensor.to", args, kwargs)
        return tensor_to(self, *args, **kwargs)

    def m_to(self, *args, **kwargs):
        if any(_cuda(a) for a in (*args, kwargs.get("device"))):
            self.__dict__[MOVED] = True
        args, kwargs = _cpu_args(pick, "model.to", args, kwargs)
        return module_to(self, *args, **kwargs)

    def t_cuda(self, device=None, *args, **kwargs):
        pick("tensor.cuda", "cuda" if device is None else device)
        return self

    def m_cuda(self, device=None):
        pick("model.cuda", "cuda" if device is None else device)
        self.__dict__[MOVED] = True
        return self

    torch.Tensor.to, torch.Tensor.cuda, nn.Module.to, nn.Module.cuda = t_to, t_cuda, m_to, m_cuda


def _cuda(x) -> bool:
    """A CUDA device among ``.to()``'s arguments: ``torch.device("cuda", k)``, ``"cuda:k"`` or an ordinal ``k``
    (``.to(local_rank)``: an int there is a device index)."""
    import torch
    return ((isinstance(x, torch.device) and x.type == "cuda") or (isinstance(x, str) and x.split(":")[0] == "cuda")
            or (isinstance(x, int) and not isinstance(x, bool)))


def _cpu_args(pick, how, args, kwargs):
    def cpu(x):
        return pick(how, x) if _cuda(x) else x
    if "device" in kwargs:
        kwargs = {**kwargs, "device": cpu(kwargs["device"])}
    return tuple(cpu(a) for a in args), kwargs


# ------------------------------------------------------------------------------------------ the learner's writes
def _note_env_writes(rec: Recorder):
    """Launcher variables the learner's code sets in os.environ (a hard-coded MASTER_ADDR), with the line."""
    cls = type(os.environ)
    original = cls.__setitem__
    writes = rec.data.setdefault("env_writes", [])

    def setitem(self, key, value):
        if self is os.environ and key in WRITES and len(writes) < 20:
            frame = rec.learner_frame()
            if frame is not None:
                writes.append({"var": key, "value": str(value), "before": os.environ.get(key),
                               "line": frame.f_lineno})
        return original(self, key, value)

    cls.__setitem__ = setitem


def _note_file_writes(rec: Recorder):
    """Files the learner's code opens for writing: a name that repeats on every node is seen by the checker."""
    opened = rec.data.setdefault("files_written", [])
    original = builtins.open

    def open_(file, mode="r", *args, **kwargs):
        if isinstance(mode, str) and set(mode) & set("wax+") and isinstance(file, (str, os.PathLike)) \
                and len(opened) < 50:
            frame = rec.learner_frame()
            if frame is not None:
                path = os.path.abspath(os.fspath(file))
                if path not in opened:
                    opened.append(path)
                    rec.write()
        return original(file, mode, *args, **kwargs)

    builtins.open = open_
