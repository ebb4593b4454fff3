"""The verdicts of Steps 1-5 (what each step asks: ``course_lib.ddp.check``) from the probe's records of one run.

Each ``stepN(run)`` returns (ok, message), or None when the run stopped before the evidence for that
step was there (the failure is then reported at the step it stopped in).
"""
from pathlib import Path

from course_lib.ddp import averaging, logged, traffic
from course_lib.ddp.datajudge import set_epoch_differs, test_shards, train_loader
from course_lib.ddp.hooks import loads_into_net, stat_of
from course_lib.ddp.messages import ENV_HELP, first, short
from course_lib.ddp.runs import EPOCHS, Run, group


# ------------------------------------------------------------------------------------------ Step 1
def step1(run: Run):
    if not all(run.records):
        return None
    g = group(run)
    return _group_formed(run, g) if all(g) else _no_group(run)


def _group_formed(run: Run, g: list):
    """Every rank got a group: of the right size, with distinct ranks and the right backend?"""
    n = run.nprocs
    ranks, sizes = [r for r, _ in g], [w for _, w in g]
    if any(w != n for w in sizes):
        hint = " (is it hard-coded?)" if len(set(sizes)) == 1 and sizes[0] not in (1, n) else ""
        return False, (f"{n} processes were started, but they joined groups of world size {sizes}{hint}. "
                       f"Pass the world size the launcher gives ({ENV_HELP}).")
    if sorted(ranks) != list(range(n)):
        return False, (f"the processes got ranks {ranks}: each must have its own rank 0..{n - 1}. "
                       f"Take it from the launcher ({ENV_HELP}).")
    backends = sorted({e["backend"] for r in range(n) for e in run.rec(r)["init"] if "backend" in e})
    want = "nccl" if run.gpu else "gloo"
    if backends != [want]:
        return False, f"backend {backends}: use {want} {'between GPUs' if run.gpu else 'on CPUs'}."
    return True, (f"{n} ranks ({run.style}-style launch) joined one {backends[0]} group: ranks {sorted(ranks)}, "
                  f"world size {n}")


def _no_group(run: Run):
    """Some rank never got a group: it never asked, asked for the wrong thing, or init failed."""
    asked = requested(run)
    if not any(asked):
        return _never_asked(run)
    verdict = asked_wrong(run) or _init_failed(run, asked)
    if verdict is None and run.finished():
        return False, f"not every rank joined the process group (asked for: {_asked(asked)})"
    return verdict


def _never_asked(run: Run):
    n = run.nprocs
    if any(run.rec(r).get("spawned") for r in range(n)):
        return False, ("the script starts its own processes (torch.multiprocessing.spawn): under srun or torchrun "
                       "the launcher already starts one process per rank. Drop the spawn; each process joins the "
                       f"group itself ({ENV_HELP}).")
    if run.finished():
        return False, (f"no rank called torch.distributed.init_process_group: the {n} processes trained as "
                       f"{n} separate serial runs. Find each process's rank and the world size "
                       f"({ENV_HELP}) and join the process group.")
    return None


def _asked(asked: list) -> str:
    return ", ".join(f"rank={q.get('rank', 'env')} world_size={q.get('world_size', 'env')}" if q else "no call"
                     for q in asked)


def requested(run: Run) -> list:
    """What each rank asked init_process_group for (at its last call); None for a rank that did not ask."""
    return [run.rec(r)["init"][-1]["requested"] if run.rec(r).get("init") else None for r in range(run.nprocs)]


def asked_wrong(run: Run | None):
    """A world size or ranks that the ranks of ``run`` asked init_process_group for and that do not fit the launch;
    None where they fit or none asked. A rank that did not get as far as asking (it crashed before init, or was
    stopped when another did) is left out: what the others asked is still theirs."""
    asked = requested(run) if run is not None else []
    n = run.nprocs if run is not None else 0
    sizes = [q.get("world_size") for q in asked if q]
    if sizes and all(isinstance(w, int) and w != n for w in sizes):
        per_node = (run.rec(0).get("layout") or {}).get("per_node")
        hint = (" (one node's worth: torch.cuda.device_count() counts the GPUs this process sees on its node, "
                "LOCAL_WORLD_SIZE the ranks of its node; neither is the job's world size)"
                if sizes[0] == per_node and per_node > 1
                else " (hard-coded?)" if sizes[0] not in (1, n) else "")
        return False, (f"{n} processes were started, but they asked init_process_group for world_size={sizes[0]}"
                       f"{hint}. Pass the world size the launcher gives ({ENV_HELP}).\nAsked for: {_asked(asked)}")
    ranks = [q.get("rank") for q in asked if q]
    if len(ranks) == n and all(isinstance(r, int) for r in ranks) and sorted(ranks) != list(range(n)):
        return False, (f"the processes asked for ranks {ranks}: each must have its own rank 0..{n - 1}. Take it from "
                       f"the launcher ({ENV_HELP}).")
    return None


def _init_failed(run: Run, asked: list):
    """init_process_group raised on some rank: its error, with a hint for the usual causes."""
    errors = [((run.rec(r).get("exit") or {}).get("in") or {}) for r in range(run.nprocs)]
    errors = [(r, e.get("error")) for r, e in enumerate(errors) if e.get("call") == "init_process_group"]
    if not errors:
        return None
    r, err = errors[0]
    hint = ""
    if "EADDRINUSE" in err or "address already in use" in err:
        hint = (" Two processes both acted as rank 0 (the one that opens MASTER_PORT): "
                "each process needs its own rank and the full world size.")
    elif "environment variable" in err and "expected" in err:
        hint = (" With no rank/world_size arguments, init_process_group reads RANK and WORLD_SIZE, which "
                f"torchrun sets but srun does not: read them yourself ({ENV_HELP}).")
    return False, f"init_process_group failed on rank {r}: {first(err)}{hint}\nAsked for: {_asked(asked)}"


# ------------------------------------------------------------------------------------------ Step 2
def trained(run: Run, rank: int) -> bool:
    """Rank ``rank`` got past its training (finished, started saving, or ran every epoch)."""
    rec = run.rec(rank)
    if run.exited_normally(rank) or rec.get("phase") in ("save", "destroyed"):
        return True
    loader = train_loader(rec)
    return bool(loader) and sum(it["done"] for it in loader["iters"]) >= EPOCHS and rec.get("optimizer_steps", 0) > 0


def step2(run: Run, more: Run | None = None):
    """``more``: the run with more ranks, where it ran to its end (a loss divided by the world size is judged on
    both world sizes: a constant factor that equals 1/W on one of them may be the loss's own)."""
    if not all(trained(run, r) for r in range(run.nprocs)):
        return None
    n = run.nprocs
    steps = [run.rec(r)["optimizer_steps"] for r in range(n)]
    if not any(steps):
        return False, "no optimizer step was seen on any rank: does the script train (optimizer.step())?"
    params = [run.params(r) for r in range(n)]
    if any(p is None for p in params):
        return False, "could not read the trained parameters of every rank"
    if len({p.size for p in params}) > 1:
        return False, f"the ranks trained models of different sizes ({[p.size for p in params]} parameters)"
    detached = averaging.optimizer_off_ddp([run.rec(r) for r in range(n)])
    if detached:
        return False, detached
    diff = max(float(abs(params[0] - p).max()) for p in params[1:]) if n > 1 else 0.0
    scale = float(abs(params[0]).max()) or 1.0
    ddp_made = [bool(run.rec(r)["ddp"]) for r in range(n)]
    ddp_used = [run.rec(r)["ddp_forward"] > 0 for r in range(n)]
    if diff > 1e-5 * scale + 1e-6:
        why = ((_built_not_used(ddp_made, ddp_used) or _in_no_sync(run)
                or "the gradients were not averaged the same way on every rank.") if any(ddp_made)
               else "nothing averaged the gradients: wrap the model in DistributedDataParallel (after moving it to its "
                    "device).")
        return False, (f"after {steps[0]} steps the parameters differ between ranks (largest difference {diff:.2e}): "
                       f"{why}")
    # DDP averaged in backward unless every training forward ran inside no_sync() (then the script averaged itself)
    ddp_averaged = all(ddp_used) and all(f[1] < f[0] for f in (run.rec(r)["ddp_grad_forward"] for r in range(n)))
    summed = averaging.judge([run.rec(r) for r in range(n)]) == "summed"
    extra = traffic.judge([train_loader(run.rec(r)) for r in range(n)], params[0].size, ddp_averaged, summed)
    if extra:
        return False, extra
    scaled = ddp_averaged and more is not None and more.finished() and averaging.step_scaled(
        [run.rec(r) for r in range(n)], [more.rec(r) for r in range(more.nprocs)])
    scaled = scaled or logged.judge([run.rec(r) for r in range(n)])
    if scaled:
        return False, scaled
    if all(ddp_made) and ddp_averaged:
        return True, (f"parameters identical on all {n} ranks after {steps[0]} optimizer steps: "
                      "DDP averaged the gradients")
    reduced = [run.rec(r)["collectives"].get("all_reduce:numel", 0)
               + run.rec(r)["collectives"].get("reduce_scatter:numel", 0) for r in range(n)]
    if all(x >= params[0].size for x in reduced):
        if summed:
            return False, (f"the parameters are identical on all {n} ranks, but the first step used the sum of the "
                           f"ranks' gradients, not their mean: all_reduce sums by default, so every step's gradient "
                           f"is {n} times too large (with plain SGD, a learning rate {n} times larger). Divide the "
                           "reduced gradients by the world size, or wrap the model in DistributedDataParallel.")
        return True, (f"parameters identical on all {n} ranks after {steps[0]} optimizer steps: "
                      "the gradients were averaged with all_reduce"
                      + (" (DDP averaged none of them: every training forward ran inside model.no_sync())"
                         if all(ddp_used) else ""))
    return False, ("the parameters are identical on all ranks only because every rank trained on the same data "
                   "in the same order; nothing averaged the gradients between ranks. "
                   + (_built_not_used(ddp_made, ddp_used) or "Wrap the model in DistributedDataParallel, so that "
                                                             "backward averages them."))


def _built_not_used(ddp_made: list, ddp_used: list) -> str | None:
    """DDP(model) was built on every rank, but training never called it."""
    if all(ddp_made) and not any(ddp_used):
        return ("DistributedDataParallel was built but not used: train through the wrapper (`model = DDP(model)`, "
                "then `model(data)`). Training calls the plain model (or model.module), so backward averages "
                "nothing.")
    return None


def _in_no_sync(run: Run) -> str | None:
    """Training forward passes through DDP inside ``model.no_sync()``, counted (their backward reduces nothing)."""
    r = max(range(run.nprocs), key=lambda r: run.rec(r)["ddp_grad_forward"][1])
    m, k = run.rec(r)["ddp_grad_forward"]
    if not k:
        return None
    return (f"{k} of rank {r}'s {m} training forward passes through DistributedDataParallel ran inside "
            "`model.no_sync()`, and a backward after such a forward averages nothing: each rank stepped on its own "
            "gradients. Use no_sync only for the micro-batches before the last of an accumulation; the last one's "
            "backward, outside it, averages what was accumulated.")


# ------------------------------------------------------------------------------------------ Step 3
def _shuffle_and_sampler(run: Run):
    for r in range(run.nprocs):
        for err in run.rec(r).get("loader_errors", []):
            if err.get("error") and "sampler" in err["error"] and "shuffle" in err["error"]:
                return (f"shuffle=True together with sampler={err.get('sampler')}: the DataLoader refuses both "
                        f"(rank {r}). The sampler already shuffles (DistributedSampler's shuffle=True is its "
                        "default; set_epoch gives a new order each epoch): drop shuffle=True.")
    return None


def step3(run: Run, more: Run | None = None):
    both = _shuffle_and_sampler(run)
    if both:
        return False, both
    loaders = [train_loader(run.rec(r)) for r in range(run.nprocs)]
    if not all(loaders):
        if not run.finished():
            return None
        return False, "no DataLoader iteration was seen: the data must come from a DataLoader"
    epochs = min(len(ld["iters"]) for ld in loaders)
    if epochs == 0:
        return None
    verdict = _shards(run.nprocs, loaders, epochs)
    if verdict:
        return verdict
    if epochs < 2:
        if not run.finished():
            return None
        return False, "only one epoch ran (--epochs 2 was asked for): cannot see whether the order changes"
    if all(ld["iters"][0]["indices"] == ld["iters"][1]["indices"] for ld in loaders):
        return False, ("each rank saw its images in exactly the same order in epoch 1 and epoch 2: "
                       f"{_no_new_order(run)}.")
    tested = test_shards([run.rec(r) for r in range(run.nprocs)])
    if tested:
        return False, tested
    sizes = "+".join(str(len(ld["iters"][0]["indices"])) for ld in loaders)
    msg = (f"{run.nprocs} ranks saw disjoint shards ({sizes}) "
           f"covering all {loaders[0]['dataset_len']} images, in a new order each epoch")
    if more is not None and more.finished():
        extra = step3(more)
        if extra and not extra[0]:
            return False, f"with {more.nprocs} ranks: {extra[1]}"
        if extra:
            msg += f"; with {more.nprocs} ranks too"
    return True, msg


def _shards(n: int, loaders: list, epochs: int):
    """Each epoch's shards: disjoint, and together the whole data set? None when they are."""
    size = loaders[0]["dataset_len"]
    for e in range(epochs):
        shards = [ld["iters"][e]["indices"] for ld in loaders]
        union = set().union(*map(set, shards))
        overlap = sum(len(s) for s in shards) - len(union)
        if overlap > n - 1:
            built = _sampler_shares(n, loaders)
            if all(len(set(s)) >= size for s in shards):
                if built:
                    return False, (f"every rank trained on all {size} images in epoch {e + 1}: {built}. Give it "
                                   f"the job's world size ({n}) and each rank's global rank, not its node's: "
                                   "node-local numbers are right on one node only.")
                return False, (f"every rank trained on all {size} images in epoch {e + 1}: the ranks repeat each "
                               "other's work. Give the training DataLoader a DistributedSampler, so that each rank "
                               "gets its own 1/world_size share.")
            told = set_epoch_differs(loaders)
            return False, (f"the ranks' shards overlap in {overlap} images in epoch {e + 1} (shard sizes "
                           f"{[len(s) for s in shards]} of {size}): "
                           + (told or "each rank needs a disjoint share (DistributedSampler with the group's rank "
                                      "and world size)" + (f"; {built}" if built else "")))
        if size and len(union) < size - (n - 1):
            return False, (f"together the ranks saw only {len(union)} of the {size} training images in epoch "
                           f"{e + 1}: the shards must cover the data set (DistributedSampler with the group's rank "
                           "and world size)")
    return None


def _sampler_shares(n: int, loaders: list) -> str:
    """What is wrong with the ranks' DistributedSamplers, in words: the numbers they were built with, or their
    seeds; "" when there is none or nothing to blame."""
    pairs = [(ld.get("replicas"), ld.get("sampler_rank")) for ld in loaders]
    if any(ld.get("sampler") != "DistributedSampler" or None in p for ld, p in zip(loaders, pairs)):
        return ""
    if pairs != [(n, r) for r in range(n)]:
        if len(set(pairs)) == 1:
            return "every rank's DistributedSampler was built with num_replicas={} and rank={}".format(*pairs[0])
        return "the DistributedSamplers were built with " + ", ".join(
            f"num_replicas={k}, rank={r} (rank {i})" for i, (k, r) in enumerate(pairs))
    seeds = [ld.get("sampler_seed") for ld in loaders]
    if None not in seeds and len(set(seeds)) > 1:
        return (f"the DistributedSamplers have the right num_replicas and rank but different seeds ({seeds}): each "
                "shuffles its own permutation of the data set and takes its share of that. Give every rank the "
                "same seed")
    return ""


def _no_new_order(run: Run) -> str:
    """Why every epoch repeated the same order."""
    calls = run.rec(0).get("set_epoch", [])
    if not calls:
        return ("call train_sampler.set_epoch(epoch) at the start of every epoch: without it the sampler repeats "
                "its order")
    if len(set(map(str, calls))) == 1:
        return f"set_epoch is called with the same value ({calls[0]}) every epoch: pass the epoch number"
    return "set_epoch is called, but the sampler does not shuffle: keep DistributedSampler's shuffle=True"


# ------------------------------------------------------------------------------------------ Step 4
def step4(run: Run, devices=None):
    """``devices``: the verdict of the simulated multi-node GPUs (``cluster.devices``), None if not seen."""
    n = run.nprocs
    seen = [run.rec(r).get("forward_devices", []) for r in range(n)]
    if not all(seen):
        return None if not run.finished() else (False, "no module call with parameters was seen")
    for r, pairs in enumerate(seen):
        bad = [p for p in pairs if p[0] != p[1]]
        if bad:
            return False, (f"rank {r} called a layer on {bad[0][1]} with inputs on {bad[0][0]}: move the inputs to "
                           "the model's device")
    if not run.gpu:
        return devices or _reads_local_rank(run)
    used = [sorted({p[1] for p in pairs}) for pairs in seen]
    if used != [[f"cuda:{r}"] for r in range(n)]:   # one node: local rank = rank
        return False, (f"the ranks used devices {used}; each rank must use its own GPU, cuda:<local rank> "
                       "(set device = cuda:LOCAL_RANK and torch.cuda.set_device(local_rank) before init)")
    if devices and not devices[0]:
        return devices
    late = [r for r in range(n) if any(not s["before_init"] for s in run.rec(r).get("set_device", []))]
    note = " (note: set the device before init_process_group)" if late else BARE_CUDA
    return True, (f"every rank computes on its own GPU ({', '.join(d[0] for d in used)}), inputs on the model's "
                  f"device{note}")


# a bare "cuda" is the current device, which Step 1's set_device(local_rank) made each rank's own: a starter that still
# says torch.device("cuda") passes Step 4 before the learner reached it, so a pass says why (here and on the simulated
# nodes, ddp.cluster)
BARE_CUDA = (" (where the script still says torch.device(\"cuda\"), that is the current device, which Step 1's "
             "torch.cuda.set_device(local_rank) made each rank's own GPU: so this step can pass before you reach it; "
             "cuda:LOCAL_RANK says it outright)")


def _reads_local_rank(run: Run):
    """Without GPUs, the most that can be seen: does the script read the local rank at all?"""
    reads = sorted({k for r in range(run.nprocs) for k in run.rec(r).get("env_reads", [])})
    local = [k for k in reads if k in ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")]
    honest = ("On CPU: inputs and model on 'cpu' in every call. That each rank uses its own GPU (cuda:<local rank>) "
              "can only be verified with 2 or more GPUs.")
    if not local:
        return False, ("the script never reads the local rank (LOCAL_RANK from torchrun, SLURM_LOCALID from srun): "
                       "on a GPU node every rank would put its model on the same GPU. Use cuda:<local rank> when "
                       "there are GPUs.\n" + honest)
    return True, f"the script reads the local rank ({', '.join(local)}). {honest}"


# ------------------------------------------------------------------------------------------ Step 5
def step5(run: Run, left_the_group: bool = False):
    """The checkpoint: once the run finished, or once a rank failed while leaving the group (Step 6: every save
    was made by then)."""
    if not (left_the_group or run.finished()):
        return None
    saves = [s for r in range(run.nprocs) for s in run.rec(r).get("saves", [])]
    if not saves:
        return False, "no checkpoint was written with --save-model: save the model's state_dict on rank 0"
    writers = sorted({s["rank"] if s["rank"] is not None else s["launch_rank"] for s in saves})
    names = sorted({short(s["path"]) for s in saves})
    if writers != [0]:
        if 0 in writers and len(names) > 1:
            return False, (f"ranks {writers} each wrote a checkpoint ({', '.join(names)}): the same weights "
                           f"{len(writers)} times over. Save once, on rank 0 (a name built from the local rank would "
                           "also repeat on every node of a shared file system).")
        if 0 in writers:
            return False, (f"ranks {writers} all wrote {', '.join(names)}: the copies are the same weights, written "
                           f"{len(writers)} times into one file (on a shared file system they collide). "
                           "Save on rank 0 only.")
        return False, f"rank {writers} wrote {', '.join(names)}, rank 0 did not: let rank 0 write the checkpoint."
    last = [s for s in saves if s["rank"] in (0, None)][-1]
    path, seen = Path(last["path"]), last.get("loads")
    if seen and seen["stat"] == stat_of(path):   # the probe's verdict on this very file
        return tuple(seen["verdict"])
    return loads_into_net(path, last["type"])
