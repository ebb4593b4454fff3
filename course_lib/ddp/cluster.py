"""The cluster a CPU machine hides: launches that simulate other nodes, GPUs and launchers, and their verdicts.

Mistakes that only a second node, a second GPU or another launcher shows (the device from the global rank,
Slurm's variables read before torchrun's, ``local_rank == 0`` for the one writer, a file name from the local
rank, a hard-coded MASTER_ADDR) pass a one-node CPU run. Three launches show them (``simulate`` does the
rank's side):

- ``nodes``: the extra-ranks launch, as N nodes of one rank each (global rank != local rank, MASTER_ADDR names
  "node 0"): Steps 1, 3, 5 and 6 with more ranks, plus who wrote what (Step 5) and MASTER_ADDR (Step 1);
- ``gpus``: 2 nodes x 2 ranks with 2 GPUs per node that only record which device each rank picks; each rank
  ends at its first forward (Step 4);
- ``srun-torchrun``: the real torchrun inside the variables of a one-task Slurm step, as ``srun torchrun`` in
  ``jobs/ddp_torchrun.sbatch`` runs it; each rank ends at its first forward (Step 1).
"""
import json
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path

from course_lib.ddp.failures import describe_failure
from course_lib.ddp.messages import ranks_text, short, where
from course_lib.ddp.runs import SCRIPT_ARGS, Run, group, group_ok, start_env, works
from course_lib.ddp.simulate import SETTINGS
from course_lib.ddp.steps import BARE_CUDA, requested
from course_lib.runtime.gpus import count as local_gpus
from course_lib.runtime.job import read_json
from course_lib.runtime.launch import launch

GPU_NODES, GPU_PER_NODE = 2, 2
WATCH_S = 0.2     # how often launch_all asks whether the later launches are wanted
LOCAL = "the local rank (LOCAL_RANK from torchrun, SLURM_LOCALID from srun)"
# the variables of `srun torchrun` in a one-node job: Slurm's describe the one task that runs torchrun
ONE_TASK_STEP = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1", "SLURM_NPROCS": "1",
                 "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1", "SLURM_STEP_NUM_TASKS": "1",
                 "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node1", "SLURMD_NODENAME": "node1"}


@dataclass(frozen=True)
class Sim:
    name: str                      # "nodes", "gpus", "srun-torchrun", "torchrun-nodes"; "" for a plain launch
    layout: tuple | None = None    # (nodes, ranks per node)
    gpus: int = 0                  # simulated GPUs per node
    env: dict = field(default_factory=dict, hash=False, compare=False)
    stop_at_forward: bool = False


PLAIN = Sim("")
GPUS = Sim("gpus", layout=(GPU_NODES, GPU_PER_NODE), gpus=GPU_PER_NODE, stop_at_forward=True)
SRUN_TORCHRUN = Sim("srun-torchrun", env=ONE_TASK_STEP, stop_at_forward=True)
# torchrun on 2 nodes of 2 ranks: LOCAL_RANK and LOCAL_WORLD_SIZE differ from RANK and WORLD_SIZE (on one node they
# are equal)
TORCHRUN_NODES = Sim("torchrun-nodes", layout=(GPU_NODES, GPU_PER_NODE), stop_at_forward=True)


def launch_all(jobs: list, script: Path, root: Path, timeout: float, stall, later: list, wanted) -> dict:
    """Run every ``(sim, style, nprocs)`` of ``jobs`` at once (most of a launch is starting interpreters and
    importing torch, which overlaps with the others' waiting), and those of ``later`` too once ``wanted()`` is true
    while ``jobs`` run (or when they have ended): a launch that only some outcomes of ``jobs`` need costs nothing when
    they do not come. Ctrl-C stops them all."""
    stop = threading.Event()
    with ThreadPoolExecutor(max_workers=len(jobs) + len(later)) as pool:
        futures = {job: pool.submit(launch_one, *job, script, root, timeout, stall, stop) for job in jobs}
        first = list(futures.values())
        try:
            while later:
                ended = all(f.done() for f in first)   # before wanted(): it then reads their last records
                if wanted():
                    futures.update({job: pool.submit(launch_one, *job, script, root, timeout, stall, stop)
                                    for job in later})
                    break
                if ended:
                    break
                wait(first, timeout=WATCH_S)
            return {job: f.result() for job, f in futures.items()}
        except BaseException:
            stop.set()   # every launch kills its ranks within a fraction of a second
            raise


def launch_one(sim: Sim, style: str, nprocs: int, script: Path, root: Path, timeout: float, stall, stop=None) -> Run:
    """Launch ``script`` under the probe as ``nprocs`` ranks; read back every rank's record. A simulated launch runs
    in its own folder, where the probe finds its ``simulate.json``."""
    folder = (root / sim.name if sim.name else root) / f"{style}-{nprocs}"
    (folder / "work").mkdir(parents=True)
    if sim.name:
        (folder / SETTINGS).write_text(json.dumps(asdict(sim)))
    gpu = local_gpus() >= nprocs
    env = {"COURSE_PROBE_DIR": str(folder), "COURSE_PROBE_HANG": str(max(5.0, timeout - 6)),
           "COURSE_PROBE_STALL": str(stall if stall else max(10.0, min(30.0, timeout / 4))), **start_env(gpu)}
    result = launch(["-m", "course_lib.ddp.probe", str(script), *SCRIPT_ARGS], nprocs=nprocs,
                    style=style, timeout=timeout, env=env, cwd=folder / "work", on_line=None, stop=stop)
    records = [read_json(folder / f"rank-{rank}.json") for rank in range(nprocs)]
    return Run(style, nprocs, result, folder, gpu, records)


def layout_text(run: Run) -> str:
    """'3 nodes of one rank each', '2 simulated nodes of 2 ranks and 2 GPUs each (ranks 0-1 on node 0, ...)'."""
    lay = run.rec(0).get("layout") or {}
    n, per = lay.get("nodes"), lay.get("per_node")
    if per == 1:
        return f"{n} nodes of one rank each"
    gpus = run.rec(0).get("virtual_gpus")
    where = ", ".join(f"{k * per}-{k * per + per - 1} on node {k}" for k in range(n))
    return f"{n} simulated nodes of {per} ranks" + (f" and {gpus} GPUs" if gpus else "") + f" each (ranks {where})"


def _where(run: Run, r: int) -> str:
    lay = run.rec(r).get("layout") or {}
    return f"local rank {lay.get('local_rank')} on node {lay.get('node')}"


# ------------------------------------------------------------------------------------------ Step 1
def srun_torchrun(run: Run | None, torchrun: Run | None):
    """Under ``srun torchrun`` both launchers' variables exist: a script that lets Slurm's win fails."""
    if run is None or torchrun is None or not works(torchrun) or group_ok(run):
        return None
    believed = []
    for r, (got, asked) in enumerate(zip(group(run), requested(run))):
        rank, world = got or ((asked or {}).get("rank", "?"), (asked or {}).get("world_size", "?"))
        believed.append(f"worker {r} believed it was rank {rank} of a world of {world}")
    reads = sorted({k for r in range(run.nprocs) for k in run.rec(r).get("env_reads", []) if k.startswith("SLURM")})
    read = f" (it read {', '.join(reads)})" if reads else ""
    return False, (f"under `srun torchrun` (torchrun started by a one-task Slurm step, as jobs/ddp_torchrun.sbatch "
                   f"does) {'; '.join(believed)}: the script took Slurm's variables{read}, which describe the one "
                   "task that runs torchrun (SLURM_PROCID=0, SLURM_NTASKS=1), not the rank. Each worker trains "
                   "alone on all the data, with no error. Read torchrun's RANK, LOCAL_RANK and WORLD_SIZE first, "
                   "and Slurm's only when RANK is not set.")


def master_addr(runs: list):
    """A MASTER_ADDR the script sets over the launcher's (or a tcp:// address of its own): one node only."""
    for run in runs:
        for r in range(run.nprocs):
            rec = run.rec(r)
            for w in rec.get("env_writes", []):
                if w["var"] == "MASTER_ADDR" and w["before"] is not None and w["value"] != w["before"]:
                    node0 = f", node 0's address on {layout_text(run)}" if rec.get("layout") else ""
                    return False, _addr_message(f"line {w['line']} sets MASTER_ADDR={w['value']!r} over the one the "
                                                f"launch gave ({w['before']}{node0})", w["value"])
            given = (rec.get("layout") or {}).get("master_addr")
            method = next((e["requested"].get("init_method") for e in rec.get("init", [])
                           if str(e["requested"].get("init_method") or "").startswith("tcp://")), None)
            host = method[6:].rsplit(":", 1)[0] if method else None
            if given and host and host != given:
                return False, _addr_message(f"init_process_group(init_method={method!r}) names its own address "
                                            f"where the launcher gave MASTER_ADDR={given} (node 0's address on "
                                            f"{layout_text(run)})", host)
    return None


def _addr_message(what: str, addr: str) -> str:
    return (f"{what}: on one node that is this machine either way, but on two nodes the ranks of node 1 look for "
            f"rank 0 at {addr}, not on node 0, and init waits until it times out. Leave MASTER_ADDR to the job "
            "(the job script exports the first node of the allocation; torchrun sets it) and init from the "
            "environment (init_method env://, the default).")


# ------------------------------------------------------------------------------------------ Step 2
def subgroup(runs: list):
    """DDP given a process_group that leaves ranks out: with 2 ranks a group of ranks [0, 1] is everyone, so
    only a launch with more ranks shows it."""
    for run in filter(None, runs):
        entries = [(r, d) for r in range(run.nprocs) for d in run.rec(r).get("ddp", []) if d.get("group") is not None]
        members = next((d["group"] for _, d in entries if isinstance(d["group"], list)), None)
        outside = sorted({r for r, d in entries if d["group"] == "not a member"})
        if members is None or len(members) == run.nprocs and not outside:
            continue
        at = next((where(d.get("where")) for _, d in entries if d.get("where")), "")
        left = (f"; {ranks_text(outside)} got what new_group returns "
                "on a rank outside the group (GroupMember.NON_GROUP_MEMBER), which DDP fails on") if outside else ""
        shown = f" ({layout_text(run)})" if run.rec(0).get("layout") else ""
        return False, (f"with {run.nprocs} ranks{shown}, DDP averages the gradients over ranks {members} only: the "
                       f"process_group it was given{left}. With 2 ranks that group is every rank, so the 2-rank run "
                       "could not tell. Leave process_group out: DDP then averages over every rank of the job."
                       + (f"\nDDP(...) is{at}" if at else ""))
    return None


# ------------------------------------------------------------------------------------------ Step 4
def devices(run: Run | None):
    """Which device each rank of the simulated 2 x 2 GPUs picked; None when that was not seen."""
    if run is None or not all(run.rec(r).get("layout") for r in range(run.nprocs)):
        return None
    picks = [run.rec(r).get("picks", []) for r in range(run.nprocs)]
    lay = layout_text(run)
    for r, ps in enumerate(picks):
        bad = next((p for p in ps if p.get("invalid")), None)
        hidden = [w for w in run.rec(r).get("env_writes", []) if w["var"] == "CUDA_VISIBLE_DEVICES"]
        if bad and hidden:
            return False, (f"on {lay}, rank {r} ({_where(run, r)}) set CUDA_VISIBLE_DEVICES={hidden[-1]['value']} "
                           f"(line {hidden[-1]['line']}), so it sees only those GPUs, numbered from cuda:0, and then "
                           f"asked for {bad['device']} ({bad['how']}), which it cannot see. Leave CUDA_VISIBLE_DEVICES "
                           f"to the job (Slurm sets it) and use cuda:<local rank> ({LOCAL}), or, after narrowing it to "
                           "one GPU, use cuda:0.")
        if bad:
            return False, (f"on {lay}, rank {r} ({_where(run, r)}) asked for {bad['device']} ({bad['how']}), which "
                           f"its node does not have (cuda:0 to cuda:{GPU_PER_NODE - 1}): the device comes from the "
                           "global rank. cuda:RANK / set_device(rank) is right on one node and wrong on every other: "
                           f"use {LOCAL}.")
    early = next((r for r in range(run.nprocs) if run.rec(r).get("ddp_before_move")), None)
    if early is not None:
        return False, (f"on {lay}, rank {early} ({_where(run, early)}) gave DistributedDataParallel "
                       f"device_ids={run.rec(early)['ddp_before_move']} while its model was still on the CPU: with "
                       "GPUs, DDP raises ValueError there (device_ids need a model already on that GPU; on CPU they "
                       "are not given, so the CPU runs pass). Move the model to cuda:<local rank> first "
                       "(model.to(device)), then wrap it.")
    if not run.finished():
        return None   # stopped before its first forward for another reason: the full launches report it
    used = [_model_device(ps) for ps in picks]
    if not any(used):
        return False, (f"on {lay}, with torch.cuda.is_available() true, every rank kept its model on the CPU: "
                       f"put it on cuda:<local rank> when there are GPUs ({LOCAL}).")
    for r, d in enumerate(used):
        local = run.rec(r)["layout"]["local_rank"]
        if d != f"cuda:{local}":
            same = [q for q in range(run.nprocs) if used[q] == d and run.rec(q)["layout"]["node"]
                    == run.rec(r)["layout"]["node"]]
            share = (f"; ranks {', '.join(map(str, same))} share it on node {run.rec(r)['layout']['node']}"
                     if len(same) > 1 else "")
            return False, (f"on {lay}, rank {r} ({_where(run, r)}) put its model on {d or 'the CPU'}{share}: each "
                           f"rank of a node needs its own GPU, cuda:<local rank> ({LOCAL}).")
    late = [r for r, ps in enumerate(picks) if any(p["how"] == "set_device" and p["init"] for p in ps)]
    note = " (note: set the device before init_process_group)" if late else BARE_CUDA
    return True, (f"on {lay}, each rank put its model on cuda:<local rank> ({', '.join(used)}){note}")


def not_followed(run: Run | None, script: Path, fix_first: int | None = None) -> str:
    """Why the simulated GPU launch gave no verdict (a note for Step 4's CPU verdict), or ''. ``fix_first``: Step 1
    or 2 failed; that launch needs each rank's own rank, a process group and the DDP model, so the note sends the
    learner to that step first (else a PASS with a crash in its note reads as a second, unexplained problem)."""
    if run is None or devices(run) is not None:
        return ""
    failure = describe_failure(run, script)
    why = failure.message.splitlines()[0] if failure else "it did not reach the first forward"
    launch = f"launch on {GPU_NODES} simulated nodes of {GPU_PER_NODE} GPUs"
    first = (f"Fix Step {fix_first} first: the {launch} needs what Step {fix_first} checks, and it" if fix_first
             else f"The {launch}")
    return f"\n({first} could not follow the script to its model: {why})"


def _model_device(picks: list) -> str | None:
    """The device the model went to (or, without a model move, the device set last)."""
    for kinds in (("model.to", "model.cuda"), ("set_device", "init_process_group(device_id=...)"), ("tensor.to",)):
        found = [p["device"] for p in picks if p["how"] in kinds]
        if found:
            return found[-1]
    return None


# ------------------------------------------------------------------------------------------ Step 5
def writers(run: Run | None, one_node: Run):
    """Files (the checkpoint among them) written by more than one rank on the simulated nodes."""
    if run is None or not run.finished() or not run.rec(0).get("layout"):
        return None
    by_path = _writes(run)
    alone = {p.split("/")[-1]: ranks for p, ranks in _writes(one_node).items()}
    for path, ranks in sorted(by_path.items()):
        if len(ranks) < 2 or len(alone.get(path.split("/")[-1], [])) > 1:
            continue   # written by one rank, or by several on one node too (Step 5's own verdict says so)
        who = ", ".join(f"{r} ({_where(run, r)})" for r in ranks)
        if any(s["path"] == path for r in ranks for s in run.rec(r).get("saves", [])):
            return False, (f"on one node only rank 0 wrote {short(path)}, but on {layout_text(run)} ranks {who} "
                           "all wrote it: the writer is chosen by the local rank (local_rank == 0 is true once "
                           "per node). Save when the global rank is 0 (dist.get_rank() == 0).")
        return False, (f"on {layout_text(run)}, ranks {who} all wrote {short(path)}: a name built from the local "
                       "rank repeats on every node, and on a shared file system the nodes overwrite each other's "
                       "file. Build it from the global rank.")
    return None


def _writes(run: Run) -> dict:
    """path -> the ranks that wrote it (torch.save and open() for writing)."""
    out: dict = {}
    for r in range(run.nprocs):
        rec = run.rec(r)
        for path in {s["path"] for s in rec.get("saves", [])} | set(rec.get("files_written", [])):
            out.setdefault(path, []).append(r)
    return out
