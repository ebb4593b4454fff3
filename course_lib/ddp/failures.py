"""What went wrong in a run that did not finish: a crash, a collective on some ranks only, a deadlock, a
process killed without a Python error. Each becomes one message naming the rank, where it was in the
learner's file and the last lines it printed."""
import re
from dataclasses import dataclass
from pathlib import Path

from course_lib.ddp.messages import ENV_HELP, first, ranks_text, tail, where
from course_lib.ddp.runs import Run
from course_lib.ddp.steps import requested

# errors of a rank whose peer (or the store on rank 0) went away: they report another rank's failure
PEER_GONE = re.compile(r"Connection (closed|reset) by peer|Broken pipe|recvBytes|SIGTERM|Failed to recv, got 0 bytes",
                       re.I)
STACK_FILE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
SAME_ORDER = "A collective (barrier, all_reduce, ...) must be called by every rank, in the same order"
# PyTorch's docs of new_group: every process of the job enters it, also one that is not in the new group
NEW_GROUP = (" dist.new_group is one of them: every rank of the job must call it, also a rank that is not in the new "
             "group, and make its groups in the same order.")
NO_CUDA = ("\nWithout GPUs there is no CUDA: ask torch.cuda.is_available() before any torch.cuda call, "
           "and give DDP device_ids only for a GPU model (on CPU: none).")
# torch's ValueError for device_ids with a model whose parameters are not on that one GPU (its last words, the
# devices the parameters are on, are the part that explains it: the crash is not cut before them)
DEVICE_IDS = re.compile(r"device_ids and output_device arguments only work")
DEVICE_IDS_HINT = ("\ndevice_ids names the one GPU the model already sits on: move the model there first "
                   "(model.to(local_rank)), then DDP(model, device_ids=[local_rank]); a model on the CPU takes none.")


@dataclass
class Failure:
    step: int | None       # the step the failure belongs to, if the probe saw where it happened
    message: str
    hint: str = ""         # what to do, also for the steps the failure hid (it sits in message too)


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
    firsts = [r for r in crashed if not PEER_GONE.search(exits[r].get("error") or "")]
    if firsts:
        return _crash(run, res.failed_rank if res.failed_rank in firsts else firsts[0], exits)
    if crashed and done:
        # a collective on some ranks only: the others finished, so the waiting rank's connection dropped
        rank = crashed[0]
        return Failure(None, f"rank {rank} waited in a collective{where(exits[rank].get('where'))}, but "
                             f"{ranks_text(done)} had finished without calling it. {SAME_ORDER}.\n{tail(run, rank)}")
    if hung or res.timed_out or crashed:
        return _deadlock(run, script, exits, sorted(set(hung + crashed)) or res.stuck_ranks, crashed, done)
    rank = res.failed_rank if res.failed_rank is not None else 0
    code = res.ranks[rank].returncode
    return Failure(None, f"rank {rank} stopped with exit code {code} without a Python error "
                         f"(killed by a signal, or out of memory?)\n{tail(run, rank)}")


def _crash(run: Run, rank: int, exits: list) -> Failure:
    """Rank ``rank`` raised (or exited non-zero) first: what, where, and the step the probe saw it in."""
    ex = exits[rank]
    if ex.get("type") in ("SyntaxError", "IndentationError", "TabError"):
        return Failure(1, f"the script does not compile: {first(ex['error'])}{where(ex.get('where'))}\n"
                          "(every rank stops there: fix it and check again)")
    what = first(ex["error"], 400) if ex.get("error") else (
        f"exited with code {ex['code']}" + (f": {first(ex['message'])}" if ex.get("message") else ""))
    step = (ex.get("in") or {}).get("step")
    hint = ""
    if step in (None, 2, 4) and re.search(r"CUDA|cuda|NVIDIA|NCCL|device_ids|device ordinal", ex.get("error") or ""):
        step, hint = 4, DEVICE_IDS_HINT if DEVICE_IDS.search(ex.get("error") or "") else NO_CUDA
    return Failure(step, f"rank {rank} crashed: {what}{where(ex.get('where'))}{hint}\n{tail(run, rank)}", hint)


def _deadlock(run: Run, script: Path, exits: list, stuck: list, crashed: list, done: list) -> Failure:
    """Ranks that waited for good: where each one waited, and which ranks had finished."""
    parts = []
    for rank in stuck:
        pos = stack_position(run, rank, script) or (exits[rank].get("where") if rank in crashed else None)
        stalled = run.rec(rank).get("stalled")
        waited = f"waited {stalled['seconds']:.0f} s" if stalled else "waited"
        if pos and pos.get("line"):
            waits = f" (in torch's {pos['waiting_in']})" if pos.get("waiting_in") else ""
            parts.append(f"rank {rank} {waited} at line {pos['line']}: {pos.get('code', '')}{waits}")
        else:
            parts.append(f"rank {rank} {waited} (no stack trace)")
    if done:
        parts.append(f"{ranks_text(done)} had finished")
    calls = {(run.rec(r).get("stalled") or {}).get("call") for r in stuck}
    made = [run.rec(r).get("collectives", {}).get("new_group", 0) for r in range(run.nprocs)]   # by rank
    hint = "" if "new_group" not in calls else NEW_GROUP + (
        f" Calls of new_group by rank: {made}." if len(set(made)) > 1 else "")
    return Failure(1 if "init_process_group" in calls else None, "deadlock: " + "; ".join(parts) + f". {SAME_ORDER}; "
                   f"one called on some ranks only waits forever.{hint}\n" + tail(run, stuck[0] if stuck else 0))


def stack_position(run: Run, rank: int, script: Path):
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


def waiting_in_init(run: Run) -> str:
    """A deadlock inside init_process_group: the world size asked for, when that is why."""
    sizes = [q.get("world_size") for q in requested(run) if q]
    if any(isinstance(w, int) and w != run.nprocs for w in sizes):
        return (f" The ranks asked for world sizes {sizes} but {run.nprocs} processes were started: init waits for "
                f"ranks that never come. Pass the world size the launcher gives ({ENV_HELP}).")
    return ""
