"""Check a DDP training script step by step: ``course check ddp PATH``.

The learner's script runs as real ranks (``course_lib.launch``: srun-style, then the real torchrun, then
3 ranks), each under ``course_lib.checks.ddp_probe``, which watches torch from outside the learner's code
and leaves one JSON record per rank. The script runs in a temporary folder (its checkpoint lands there;
nothing of the learner's is touched) with ``--dataset digits --epochs 2 --save-model`` on a small
subset of the data. From the records, one verdict per step:

1. process group: initialised on every rank, the right world size, distinct ranks
2. gradients averaged: the parameters are the same on every rank after training, and something
   (DistributedDataParallel, or the learner's own all_reduce) averaged the gradients
3. data: disjoint shards that cover the data set each epoch, a new order each epoch (set_epoch)
4. device: the inputs on the model's device; each rank on its own GPU (verifiable only with GPUs)
5. checkpoint: written by rank 0 only, loads with ``strict=True`` into the plain ``Net``
6. launch: which launch styles work (srun's SLURM_* variables, torchrun's RANK/...), a clean shutdown

A crash, a deadlock or a syntax error gets a verdict at the step it stops, naming the rank, where it
was in the learner's file and the last lines it printed; every process is gone when ``check`` returns.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.checks.report import Report

SCRIPT_ARGS = ["--dataset", "digits", "--epochs", "2", "--save-model"]
TRAIN_IMAGES, TEST_IMAGES = 128, 64     # the digits subset each check trains on: seconds, not minutes
STEP_NAMES = {1: "Step 1", 2: "Step 2", 3: "Step 3", 4: "Step 4", 5: "Step 5", 6: "Step 6"}
ENV_HELP = "srun sets SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS; torchrun sets RANK, LOCAL_RANK, WORLD_SIZE"
_CACHE: dict = {}


# ------------------------------------------------------------------------------------------ runs
@dataclass
class Run:
    """One launch of the script under the probe: the launcher's result and each rank's record."""
    style: str
    nprocs: int
    result: object                  # course_lib.launch.LaunchResult
    folder: Path                    # the probe's records
    workdir: Path                   # the script's working directory
    gpu: bool
    records: list = field(default_factory=list)

    def stack(self, rank: int) -> str:
        p = self.folder / f"stack-{rank}.txt"
        return p.read_text(errors="replace") if p.is_file() else ""

    def params(self, rank: int):
        import torch
        p = self.folder / f"params-{rank}.pt"
        return torch.load(p, weights_only=True) if p.is_file() else None

    def rec(self, rank: int) -> dict:
        return self.records[rank] or {}

    def exited_normally(self, rank: int) -> bool:
        ex = self.rec(rank).get("exit")
        return bool(ex) and ex.get("code") == 0

    def finished(self) -> bool:
        """Every rank ran the script to its end (whatever the process did after that)."""
        return all(self.exited_normally(r) for r in range(self.nprocs))


def _prepare_data(folder: Path) -> Path:
    """The first TRAIN_IMAGES/TEST_IMAGES digits, saved once for all ranks (they skip scikit-learn)."""
    import torch
    from course_lib.data import load_digits_split
    prepared = {}
    for split, n in (("train", TRAIN_IMAGES), ("test", TEST_IMAGES)):
        ds = load_digits_split(split)
        prepared[split] = (ds.images[:n].clone(), ds.targets[:n].clone())
    path = folder / "digits-subset.pt"
    torch.save(prepared, path)
    return path


def _gpus() -> int:
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no CUDA at all
        return 0


def run_script(script: Path, style: str, nprocs: int, root: Path, data: Path, timeout: float,
               echo: bool = False, stall: float | None = None) -> Run:
    """Launch ``script`` under the probe as ``nprocs`` ranks; read back every rank's record."""
    from course_lib.launch import launch
    folder = root / f"{style}-{nprocs}"
    workdir = folder / "work"
    workdir.mkdir(parents=True)
    gpu = _gpus() >= nprocs
    env = {"COURSE_PROBE_DIR": str(folder), "COURSE_PROBE_DATA": str(data),
           "COURSE_PROBE_HANG": str(max(5.0, timeout - 6)), "PYTHONDONTWRITEBYTECODE": "1",
           "COURSE_PROBE_STALL": str(stall if stall else max(10.0, min(30.0, timeout / 4)))}
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""   # fewer GPUs than ranks: check on CPU, say so at Step 4
    printer = (lambda rank, line: print(f"[{style} {nprocs}] [rank {rank}] {line}", flush=True)) if echo else None
    result = launch(["-m", "course_lib.checks.ddp_probe", str(script), *SCRIPT_ARGS], nprocs=nprocs,
                    style=style, timeout=timeout, env=env, cwd=workdir, on_line=printer)
    run = Run(style, nprocs, result, folder, workdir, gpu)
    for rank in range(nprocs):
        p = folder / f"rank-{rank}.json"
        try:
            run.records.append(json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None)
        except json.JSONDecodeError:
            run.records.append(None)
    return run


# ------------------------------------------------------------------------------------------ helpers
def _short(path) -> str:
    return Path(path).name if path else "?"


def _tail(run: Run, rank: int, n: int = 4) -> str:
    """The last lines ``rank`` printed before any traceback (the error itself is reported on its own)."""
    lines = list(run.result.ranks[rank].lines) if rank < len(run.result.ranks) else []
    if "Traceback (most recent call last):" in lines:
        lines = lines[:lines.index("Traceback (most recent call last):")]
    lines = [line for line in lines if line.strip()][-n:]
    if not lines:
        return f"rank {rank} printed nothing before that"
    return f"last lines rank {rank} printed:\n" + "\n".join("    " + line[:160] for line in lines)


def _first(text: str, limit: int = 220) -> str:
    """The first sentence of a (long, library-made) error message."""
    text = re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", text.strip().splitlines()[0] if text.strip() else "")
    m = re.match(r"(.{20,}?[.!])(\s|$)", text)
    text = m.group(1) if m else text
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _where(where: dict | None) -> str:
    if not where or not where.get("line"):
        return ""
    code = f": {where['code']}" if where.get("code") else ""
    return f" at line {where['line']} of {_short(where.get('file'))}{code}"


STACK_FILE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def _stack_position(run: Run, rank: int, script: Path):
    """(learner's line, source of that line, the torch function it waits in) from a faulthandler dump."""
    text = run.stack(rank)
    if not text:
        return None
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", text.strip())
    lines = script.read_text(errors="replace").splitlines()
    for block in blocks:
        frames = [m.groupdict() for m in map(STACK_FILE.match, block.splitlines()) if m]
        for i, fr in enumerate(frames):          # most recent call first
            if Path(fr["file"]) == script:
                # the torch function it waits in: the outermost torch frame below it that is not a decorator
                inner = next((f["func"] for f in reversed(frames[:i]) if "/torch/" in f["file"]
                              and f["func"] not in ("wrapper", "_wrapper")), None)
                n = int(fr["line"])
                code = lines[n - 1].strip() if 0 < n <= len(lines) else ""
                return {"line": n, "code": code, "file": fr["file"], "waiting_in": inner}
    return None


def _group(run: Run):
    """Per rank: (rank, world_size) the group gave it, or None."""
    out = []
    for r in range(run.nprocs):
        inits = [e for e in run.rec(r).get("init", []) if "world_size" in e]
        out.append((inits[-1]["rank"], inits[-1]["world_size"]) if inits else None)
    return out


def group_ok(run: Run) -> bool:
    g = _group(run)
    return all(g) and sorted(r for r, _ in g) == list(range(run.nprocs)) and all(w == run.nprocs for _, w in g)


def works(run: Run) -> bool:
    return run.result.ok and run.finished() and group_ok(run)


# ------------------------------------------------------------------------------------------ failures
@dataclass
class Failure:
    step: int | None       # the step the failure belongs to, if the probe saw where it happened
    message: str


def _cuda_error(text: str) -> bool:
    return bool(re.search(r"CUDA|cuda|NVIDIA|NCCL|device_ids|device ordinal", text))


PEER_GONE = re.compile(r"Connection (closed|reset) by peer|Broken pipe|recvBytes|SIGTERM", re.I)


def describe_failure(run: Run, script: Path) -> Failure | None:
    """What went wrong in a run that did not finish: which rank, what, where, its last lines."""
    if run.finished():
        return None   # the script ran to its end on every rank; anything after that is Step 6's business
    res = run.result
    exits = [run.rec(r).get("exit") or {} for r in range(run.nprocs)]
    crashed = [r for r in range(run.nprocs) if exits[r].get("code") not in (0, None)]
    hung = [r for r in range(run.nprocs) if not exits[r] and run.stack(r)]
    done = [r for r in range(run.nprocs) if run.exited_normally(r)]
    # a rank whose peer vanished only reports the other's failure: look for the one that failed first
    first = [r for r in crashed if not PEER_GONE.search(exits[r].get("error") or "")]
    if first:
        rank = res.failed_rank if res.failed_rank in first else first[0]
        ex = exits[rank]
        if ex.get("type") in ("SyntaxError", "IndentationError", "TabError"):
            return Failure(1, f"the script does not compile: {_first(ex['error'])}{_where(ex.get('where'))}\n"
                              "(every rank stops there: fix it and check again)")
        what = _first(ex["error"]) if ex.get("error") else (
            f"exited with code {ex['code']}" + (f": {_first(ex['message'])}" if ex.get("message") else ""))
        step = (ex.get("in") or {}).get("step")
        hint = ""
        if (step in (None, 2, 4)) and _cuda_error(ex.get("error") or ""):
            step = 4
            hint = ("\nWithout GPUs there is no CUDA: ask torch.cuda.is_available() before any torch.cuda call, "
                    "and give DDP device_ids only for a GPU model (on CPU: none).")
        return Failure(step, f"rank {rank} crashed: {what}{_where(ex.get('where'))}{hint}\n{_tail(run, rank)}")
    if crashed and done:
        # a collective on some ranks only: the others finished, so the waiting rank's connection dropped
        rank = crashed[0]
        ex = exits[rank]
        return Failure(None, f"rank {rank} waited in a collective{_where(ex.get('where'))}, but rank"
                             f"{'s' if len(done) > 1 else ''} {', '.join(map(str, done))} had finished without "
                             "calling it. A collective (barrier, all_reduce, ...) must be called by every rank, in the "
                             f"same order.\n{_tail(run, rank)}")
    if hung or res.timed_out or crashed:
        stuck = sorted(set(hung + crashed)) or res.stuck_ranks
        parts = []
        for rank in stuck:
            pos = _stack_position(run, rank, script) or (exits[rank].get("where") if rank in crashed else None)
            stalled = run.rec(rank).get("stalled")
            waited = f"waited {stalled['seconds']:.0f} s" if stalled else "waited"
            if pos and pos.get("line"):
                waits = f" (in torch's {pos['waiting_in']})" if pos.get("waiting_in") else ""
                parts.append(f"rank {rank} {waited} at line {pos['line']}: {pos.get('code', '')}{waits}")
            else:
                parts.append(f"rank {rank} {waited} (no stack trace)")
        if done:
            parts.append(f"rank{'s' if len(done) > 1 else ''} {', '.join(map(str, done))} had finished")
        return Failure(None, "deadlock: " + "; ".join(parts)
                             + ". A collective (barrier, all_reduce, ...) must be called by every rank, in the same "
                               "order; one called on some ranks only waits forever.\n" + _tail(run, stuck[0] if stuck else 0))
    rank = res.failed_rank if res.failed_rank is not None else 0
    code = res.ranks[rank].returncode
    return Failure(None, f"rank {rank} stopped with exit code {code} without a Python error "
                         f"(killed by a signal, or out of memory?)\n{_tail(run, rank)}")


# ------------------------------------------------------------------------------------------ the steps
# Each returns (ok, message), or None when the run stopped before the evidence for that step was there.

def step1(run: Run):
    n = run.nprocs
    recs = [run.rec(r) for r in range(n)]
    if not all(run.records):
        return None
    g = _group(run)
    if all(g):
        ranks, sizes = [r for r, _ in g], [w for _, w in g]
        if any(w != n for w in sizes):
            hint = " (is it hard-coded?)" if len(set(sizes)) == 1 and sizes[0] not in (1, n) else ""
            return False, (f"{n} processes were started, but they joined groups of world size {sizes}{hint}. "
                           f"Pass the world size the launcher gives ({ENV_HELP}).")
        if sorted(ranks) != list(range(n)):
            return False, (f"the processes got ranks {ranks}: each must have its own rank 0..{n - 1}. "
                           f"Take it from the launcher ({ENV_HELP}).")
        backends = sorted({e["backend"] for rec in recs for e in rec["init"] if "backend" in e})
        want = "nccl" if run.gpu else "gloo"
        if backends != [want]:
            return False, f"backend {backends}: use {want} {'between GPUs' if run.gpu else 'on CPUs'}."
        return True, f"{n} ranks ({run.style}-style launch) joined one {backends[0]} group: ranks {sorted(ranks)}, world size {n}"
    # some rank never got a group
    requested = [rec["init"][-1]["requested"] if rec.get("init") else None for rec in recs]
    if not any(requested):
        if any(rec.get("spawned") for rec in recs):
            return False, ("the script starts its own processes (torch.multiprocessing.spawn): under srun or torchrun "
                           "the launcher already starts one process per rank. Drop the spawn; each process joins the "
                           f"group itself ({ENV_HELP}).")
        if all(run.exited_normally(r) for r in range(n)):
            return False, (f"no rank called torch.distributed.init_process_group: the {n} processes trained as "
                           f"{n} separate serial runs. Find each process's rank and the world size "
                           f"({ENV_HELP}) and join the process group.")
        return None
    errors = [((run.rec(r).get("exit") or {}).get("in") or {}) for r in range(n)]
    errors = [(r, e.get("error")) for r, e in enumerate(errors) if e.get("call") == "init_process_group"]
    asked = ", ".join(f"rank={q.get('rank', 'env')} world_size={q.get('world_size', 'env')}" if q else "no call"
                      for q in requested)
    sizes = [q.get("world_size") for q in requested if q]
    if sizes and all(isinstance(w, int) and w != n for w in sizes):
        return False, (f"{n} processes were started, but they asked init_process_group for world_size={sizes[0]}"
                       f"{' (hard-coded?)' if sizes[0] not in (1, n) else ''}. Pass the world size the launcher gives "
                       f"({ENV_HELP}).\nAsked for: {asked}")
    ranks = [q.get("rank") for q in requested if q]
    if len(ranks) == n and all(isinstance(r, int) for r in ranks) and sorted(ranks) != list(range(n)):
        return False, (f"the processes asked for ranks {ranks}: each must have its own rank 0..{n - 1}. Take it from "
                       f"the launcher ({ENV_HELP}).")
    if errors:
        r, err = errors[0]
        hint = ""
        if "EADDRINUSE" in err or "address already in use" in err:
            hint = (" Two processes both acted as rank 0 (the one that opens MASTER_PORT): "
                    "each process needs its own rank and the full world size.")
        elif "environment variable" in err and "expected" in err:
            hint = (" With no rank/world_size arguments, init_process_group reads RANK and WORLD_SIZE, which "
                    f"torchrun sets but srun does not: read them yourself ({ENV_HELP}).")
        return False, f"init_process_group failed on rank {r}: {_first(err)}{hint}\nAsked for: {asked}"
    if all(run.exited_normally(r) for r in range(n)):
        return False, f"not every rank joined the process group (asked for: {asked})"
    return None


def _waiting_in_init(run: Run) -> str:
    sizes = [q["requested"].get("world_size") for r in range(run.nprocs) for q in run.rec(r).get("init", [])[-1:]]
    if any(isinstance(w, int) and w != run.nprocs for w in sizes):
        return (f" The ranks asked for world sizes {sizes} but {run.nprocs} processes were started: init waits for "
                f"ranks that never come. Pass the world size the launcher gives ({ENV_HELP}).")
    return ""


EPOCHS = int(SCRIPT_ARGS[SCRIPT_ARGS.index("--epochs") + 1])


def trained(run: Run, rank: int) -> bool:
    """Rank ``rank`` got past its training (finished, started saving, or ran every epoch)."""
    rec = run.rec(rank)
    if run.exited_normally(rank) or rec.get("phase") in ("save", "destroyed"):
        return True
    loader = _train_loader(rec)
    return bool(loader) and sum(it["done"] for it in loader["iters"]) >= EPOCHS and rec.get("optimizer_steps", 0) > 0


def step2(run: Run):
    if not all(trained(run, r) for r in range(run.nprocs)):
        return None
    n = run.nprocs
    steps = [run.rec(r)["optimizer_steps"] for r in range(n)]
    if not any(steps):
        return False, "no optimizer step was seen on any rank: does the script train (optimizer.step())?"
    params = [run.params(r) for r in range(n)]
    if any(p is None for p in params):
        return False, "could not read the trained parameters of every rank"
    if len({p.numel() for p in params}) > 1:
        return False, f"the ranks trained models of different sizes ({[p.numel() for p in params]} parameters)"
    diff = max(float((params[0] - p).abs().max()) for p in params[1:]) if n > 1 else 0.0
    scale = float(params[0].abs().max()) or 1.0
    ddp_made = [bool(run.rec(r)["ddp"]) for r in range(n)]
    ddp_used = [run.rec(r)["ddp_forward"] > 0 for r in range(n)]
    reduced = [run.rec(r)["collectives"].get("all_reduce:numel", 0) + run.rec(r)["collectives"].get("reduce_scatter:numel", 0)
               for r in range(n)]
    if diff > 1e-5 * scale + 1e-6:
        if all(ddp_made) and not any(ddp_used):
            why = ("the model is wrapped in DistributedDataParallel, but training calls the model inside it "
                   "(model.module(...)) or the unwrapped model, so backward averages nothing. Train through the wrapper.")
        elif not any(ddp_made):
            why = "nothing averaged the gradients: wrap the model in DistributedDataParallel (after moving it to its device)."
        else:
            why = "the gradients were not averaged the same way on every rank."
        return False, f"after {steps[0]} steps the parameters differ between ranks (largest difference {diff:.2e}): {why}"
    if all(ddp_made) and all(ddp_used):
        return True, f"parameters identical on all {n} ranks after {steps[0]} optimizer steps: DDP averaged the gradients"
    if all(x >= params[0].numel() for x in reduced):
        return True, (f"parameters identical on all {n} ranks after {steps[0]} optimizer steps: "
                      "the gradients were averaged with all_reduce")
    return False, ("the parameters are identical on all ranks only because every rank trained on the same data "
                   "in the same order; nothing averaged the gradients between ranks. Wrap the model in "
                   "DistributedDataParallel, so that backward averages them.")


def _train_loader(rec: dict):
    loaders = list(rec.get("loaders", {}).values())
    if not loaders:
        return None
    trained = [ld for ld in loaders if sum(it["steps"] for it in ld["iters"]) > 0]
    pool = trained or loaders
    return max(pool, key=lambda ld: (sum(it["steps"] for it in ld["iters"]), ld["dataset_len"] or 0))


def _shuffle_and_sampler(run: Run):
    for r in range(run.nprocs):
        for err in run.rec(r).get("loader_errors", []):
            if err.get("error") and "sampler" in err["error"] and "shuffle" in err["error"]:
                return (f"shuffle=True together with sampler={err.get('sampler')}: the DataLoader refuses both "
                        "(rank {r}). The sampler already shuffles (DistributedSampler's shuffle=True is its "
                        "default; set_epoch gives a new order each epoch): drop shuffle=True.").replace("{r}", str(r))
    return None


def step3(run: Run, more: Run | None = None):
    both = _shuffle_and_sampler(run)
    if both:
        return False, both
    n = run.nprocs
    loaders = [_train_loader(run.rec(r)) for r in range(n)]
    if not all(loaders):
        return None if not run.finished() else (False, "no DataLoader iteration was seen: the data must come from a DataLoader")
    epochs = min(len(ld["iters"]) for ld in loaders)
    if epochs == 0:
        return None
    size = loaders[0]["dataset_len"]
    for e in range(epochs):
        shards = [ld["iters"][e]["indices"] for ld in loaders]
        union = set().union(*map(set, shards))
        total = sum(len(s) for s in shards)
        overlap = total - len(union)
        if overlap > n - 1:
            if all(len(set(s)) >= size for s in shards):
                return False, (f"every rank trained on all {size} images in epoch {e + 1}: the ranks repeat each other's "
                               "work. Give the training DataLoader a DistributedSampler, so that each rank gets its own "
                               "1/world_size share.")
            return False, (f"the ranks' shards overlap in {overlap} images in epoch {e + 1} (shard sizes "
                           f"{[len(s) for s in shards]} of {size}): each rank needs a disjoint share "
                           "(DistributedSampler with the group's rank and world size)")
        if size and len(union) < size - (n - 1):
            return False, (f"together the ranks saw only {len(union)} of the {size} training images in epoch {e + 1}: "
                           "the shards must cover the data set (DistributedSampler with the group's rank and world size)")
    if epochs < 2:
        if not run.finished():
            return None
        return False, "only one epoch ran (--epochs 2 was asked for): cannot see whether the order changes"
    same = [ld["iters"][0]["indices"] == ld["iters"][1]["indices"] for ld in loaders]
    if all(same):
        calls = run.rec(0).get("set_epoch", [])
        if not calls:
            why = "call train_sampler.set_epoch(epoch) at the start of every epoch: without it the sampler repeats its order"
        elif len(set(map(str, calls))) == 1:
            why = f"set_epoch is called with the same value ({calls[0]}) every epoch: pass the epoch number"
        else:
            why = "set_epoch is called, but the sampler does not shuffle: keep DistributedSampler's shuffle=True"
        return False, f"each rank saw its images in exactly the same order in epoch 1 and epoch 2: {why}."
    msg = (f"{n} ranks saw disjoint shards ({'+'.join(str(len(ld['iters'][0]['indices'])) for ld in loaders)}) "
           f"covering all {size} images, in a new order each epoch")
    if more is not None and more.finished():
        extra = step3(more)
        if extra and not extra[0]:
            return False, f"with {more.nprocs} ranks: {extra[1]}"
        if extra:
            msg += f"; with {more.nprocs} ranks too"
    return True, msg


def step4(run: Run):
    n = run.nprocs
    seen = [run.rec(r).get("forward_devices", []) for r in range(n)]
    if not all(seen):
        return None if not run.finished() else (False, "no module call with parameters was seen")
    for r, pairs in enumerate(seen):
        bad = [p for p in pairs if p[0] != p[1]]
        if bad:
            return False, f"rank {r} called a layer on {bad[0][1]} with inputs on {bad[0][0]}: move the inputs to the model's device"
    if run.gpu:
        devices = [sorted({p[1] for p in pairs}) for pairs in seen]
        want = [[f"cuda:{r}"] for r in range(n)]   # one node: local rank = rank
        if devices != want:
            return False, (f"the ranks used devices {devices}; each rank must use its own GPU, cuda:<local rank> "
                           "(set device = cuda:LOCAL_RANK and torch.cuda.set_device(local_rank) before init)")
        late = [r for r in range(n) if any(not s["before_init"] for s in run.rec(r).get("set_device", []))]
        note = "" if not late else " (note: set the device before init_process_group)"
        return True, f"every rank computes on its own GPU ({', '.join(d[0] for d in devices)}), inputs on the model's device{note}"
    reads = sorted({k for r in range(n) for k in run.rec(r).get("env_reads", [])})
    local = [k for k in reads if k in ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")]
    honest = ("On CPU: inputs and model on 'cpu' in every call. That each rank uses its own GPU (cuda:<local rank>) "
              "can only be verified with 2 or more GPUs.")
    if not local:
        return False, ("the script never reads the local rank (LOCAL_RANK from torchrun, SLURM_LOCALID from srun): on a "
                       "GPU node every rank would put its model on the same GPU. Use cuda:<local rank> when there are GPUs.\n"
                       + honest)
    return True, f"the script reads the local rank ({', '.join(local)}). {honest}"


def step5(run: Run):
    if not run.finished():
        return None
    import torch
    from course_lib.model import Net
    saves = [s for r in range(run.nprocs) for s in run.rec(r).get("saves", [])]
    if not saves:
        return False, "no checkpoint was written with --save-model: save the model's state_dict on rank 0"
    writers = sorted({s["rank"] if s["rank"] is not None else s["launch_rank"] for s in saves})
    names = sorted({_short(s["path"]) for s in saves})
    if writers != [0]:
        if 0 in writers:
            return False, (f"ranks {writers} all wrote {', '.join(names)}: the copies are the same weights, written "
                           f"{len(writers)} times into one file (on a shared file system they collide). Save on rank 0 only.")
        return False, f"rank {writers} wrote {', '.join(names)}, rank 0 did not: let rank 0 write the checkpoint."
    last = [s for s in saves if s["rank"] in (0, None)][-1]
    path = Path(last["path"])
    if not path.is_file():
        return False, f"rank 0 saved {path.name}, but the file is not there"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - whatever was saved, say what it is
        return False, (f"{path.name} does not load as a state_dict ({last['type']} was saved; "
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


def _why_not(run: Run, script: Path, primary: Run, failure) -> str:
    """One line on why a launch style did not work."""
    if run is primary and failure is not None:
        return _first(failure.message, 300)
    f = describe_failure(run, script)
    if f is not None:
        return _first(f.message, 300)
    ok1 = step1(run)
    why = _first(ok1[1], 300) if ok1 and not ok1[0] else "the ranks did not form one group"
    return f"{why}" + (" (see Step 1)" if run is primary else "")


def step6(runs: dict, primary: Run, more: Run | None, script: Path, failure=None, failure_step=None):
    good = [s for s, run in runs.items() if works(run)]
    bad = [(s, _why_not(run, script, primary, failure)) for s, run in runs.items() if not works(run)]
    if not good and failure is not None:
        if failure_step == 6:
            return False, f"did not run to the end under {' or '.join(runs)}: {failure.message}"
        return False, f"did not run to the end under {' or '.join(runs)} (see Step {failure_step})"
    if bad:
        reads = sorted({k for run in runs.values() for r in range(run.nprocs) for k in run.rec(r).get("env_reads", [])})
        if len(bad) > 1 and len({why.replace(" (see Step 1)", "") for _, why in bad}) == 1:
            bad = [(" and ".join(s for s, _ in bad), bad[0][1])]   # the same reason everywhere: say it once
        text = (f"works under {' and '.join(good)} only" if good else "works under no launcher") + "; " + "; ".join(
            f"under {s}: {why}" for s, why in bad)
        if good and reads:
            text += f"\nThe script reads {', '.join(reads)}. {ENV_HELP}: support both."
        return False, text
    # every launch style tried works: now the shutdown, and more ranks
    n = primary.nprocs
    never = [r for r in range(n) if not primary.rec(r).get("destroy")]
    if never:
        return False, (f"works under {' and '.join(good)}, but rank{'s' if len(never) > 1 else ''} "
                       f"{', '.join(map(str, never))} never called dist.destroy_process_group(): leave the group at "
                       "the end (after `del model` and gc.collect()).")
    aborted = [(run.style, r.rank, r.returncode) for run in runs.values() for r in run.result.ranks if r.returncode]
    if aborted:
        s, r, c = aborted[0]
        return False, (f"under {s}, rank {r} finished the script, but then the process exited with code {c}: an "
                       "unclean shutdown. Drop the DDP model (del model; gc.collect()) before dist.destroy_process_group().")
    msg = f"works under {' and '.join(good)}"
    if more is not None:
        if not works(more):
            return False, f"works with {n} ranks but not with {more.nprocs} ({more.style}): {_why_not(more, script, None, None)}"
        msg += f", with {n} and {more.nprocs} ranks"
    msg += "; every rank leaves the process group"
    if any(d.get("ddp_alive") for r in range(n) for d in primary.rec(r).get("destroy", [])):
        msg += (" (note: the DDP model was still alive at destroy_process_group(); with Gloo that aborts now and then "
                "at exit: `del model; gc.collect()` first)")
    return True, msg


# ------------------------------------------------------------------------------------------ check
def check(path: str, timeout: float = 120, styles=("srun", "torchrun"), more_ranks: int | None = 3,
          steps=None, echo: bool = False, cache: bool = True, stall: float | None = None) -> Report:
    """Run the learner's DDP script and return one verdict per step (``steps``: only those, e.g. ``[3]``).

    ``timeout`` is the deadline of each multi-process run; a rank that waits longer than ``stall`` seconds in
    a collective counts as deadlocked (default: a quarter of ``timeout``, between 10 and 30 s). ``styles``: the launch styles to try (the first
    that works is the one Steps 1-5 are judged on); ``more_ranks``: also run with that many ranks (None: no).
    A repeated call on an unchanged file returns the cached verdicts (``cache=False``: run again).
    """
    script = Path(path).resolve()
    key = None
    if script.is_file():
        key = (str(script), hashlib.sha256(script.read_bytes()).hexdigest(), timeout, tuple(styles), more_ranks, stall)
    if cache and key in _CACHE:
        full = _CACHE[key]
    else:
        full = _check(script, path, timeout, tuple(styles), more_ranks, echo, stall)
        if key is not None:
            _CACHE[key] = full
    if steps is None:
        return full
    wanted = {STEP_NAMES[int(s)] for s in ([steps] if isinstance(steps, int) else steps)}
    report = Report("ddp", str(path), [v for v in full.verdicts if v.item in wanted], full.seconds)
    return report


def _check(script: Path, shown: str, timeout: float, styles: tuple, more_ranks, echo: bool, stall) -> Report:
    report = Report("ddp", str(shown))
    start = time.monotonic()
    if not script.is_file():
        for s in STEP_NAMES.values():
            report.add(s, False, f"no such file: {shown}")
        return report
    with tempfile.TemporaryDirectory(prefix="course-check-ddp-") as tmp:
        root = Path(tmp)
        data = _prepare_data(root)
        runs: dict = {}
        for style in styles:
            runs[style] = run_script(script, style, 2, root, data, timeout, echo, stall)
            failure = describe_failure(runs[style], script)
            if runs[style].result.timed_out or (failure and failure.message.startswith("deadlock")):
                break   # a deadlock would only repeat under the other launcher: no need to wait twice
        primary = next((runs[s] for s in runs if works(runs[s])), None)
        more = None
        if primary is not None and more_ranks and more_ranks != primary.nprocs:
            more = run_script(script, primary.style, more_ranks, root, data, timeout, echo, stall)
        if primary is None:
            primary = next((runs[s] for s in runs if runs[s].result.ok and runs[s].finished()), None) or runs[styles[0]]
        _verdicts(report, script, runs, primary, more)
    report.seconds = time.monotonic() - start
    return report


def _verdicts(report: Report, script: Path, runs: dict, primary: Run, more: Run | None):
    judged = {1: step1(primary), 2: step2(primary), 3: step3(primary, more), 4: step4(primary), 5: step5(primary)}
    if more is not None and judged[1] and judged[1][0] and not works(more):
        m = step1(more)
        if m and not m[0]:
            judged[1] = (False, f"with {more.nprocs} ranks: {m[1]}")
    failure = describe_failure(primary, script)
    if failure is not None:
        if judged[1] is None and failure.message.startswith("deadlock"):
            failure.message += _waiting_in_init(primary)
        # the step the probe saw it happen in; else the first step the run did not get far enough to judge
        target = failure.step
        if target is None or (judged[target] is not None and judged[target][0]):
            target = next((s for s in range(1, 6) if judged[s] is None), 6)
        if target < 6 and (judged[target] is None or judged[target][0]):
            judged[target] = (False, failure.message)
        for s in range(1, 6):
            if judged[s] is None:
                judged[s] = (False, f"not checked: the run stopped before this step could be seen (see Step {target})")
    judged[6] = step6(runs, primary, more, script, failure, target if failure is not None else None)
    for s in range(1, 7):
        ok, message = judged[s]
        report.add(STEP_NAMES[s], ok, message)


def main(argv=None) -> int:
    """``python -m course_lib.checks.ddp PATH``: the same as ``course check ddp PATH``."""
    import argparse
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path")
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--echo", action="store_true", help="show what every rank prints")
    args = p.parse_args(argv)
    report = check(args.path, timeout=args.timeout, echo=args.echo)
    print(report.text())
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
