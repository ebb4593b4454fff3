"""What notebook 07's bug-hunt scripts (exercises/07_bughunt/) share: the rank, a process group with a deadline, a
stack dump of every thread after a while (``py-spy dump`` from the rank itself), and ``summary``: which rank's
failure is the cause. ``python -m course_lib.bughunt`` is bug 5 where GPUs are (``BUG_GPUS_PER_TASK=1``).
"""
import datetime
import faulthandler
import os
import re

import torch
import torch.distributed as dist

from course_lib.core.rankkit import rank_env


def rank_world() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's variables, else srun's."""
    env = rank_env()
    return env.rank, env.world_size, env.local_rank


def setup(backend: str = os.environ.get("BUG_BACKEND", "gloo")) -> tuple[int, int, int]:
    """Join the group; a collective that waits longer than BUG_TIMEOUT seconds raises instead of hanging."""
    rank, world, local = rank_world()
    dump_after = float(os.environ.get("BUG_DUMP_AFTER", "0"))
    if dump_after:     # where is each rank after this long? (py-spy dump --pid, without py-spy)
        faulthandler.dump_traceback_later(dump_after, repeat=False, exit=False)
    timeout = datetime.timedelta(seconds=float(os.environ.get("BUG_TIMEOUT", "20")))
    if backend == "nccl":
        torch.cuda.set_device(local)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
    return rank, world, local


def teardown() -> None:
    faulthandler.cancel_dump_traceback_later()
    dist.destroy_process_group()


# errors that only say a rank waited for, or lost, another rank: a consequence, not a cause
WAITED = re.compile(r"waiting for clients|Connection closed by peer|Connection reset by peer|[Tt]imed out.*"
                    r"(?:waiting|[Ww]ait|collective|barrier|all_?reduce)|ProcessGroup.*[Tt]imeout|Broken pipe")
ERROR = re.compile(r"(?:\w+Error|Exception|error):|Timed out|timed out")


def summary(result, tail: int = 3) -> str:
    """The run's outcome with the rank whose failure is the cause: a rank whose only error is having waited for,
    or lost, another rank reports that other's failure; where every failed rank only waited, the errors cannot
    tell which rank is at fault, and the summary says so (the launcher's "first to exit" is a matter of timing)."""
    if result.ok:
        return result.summary(tail)
    own, waited = [], []
    for r in result.ranks:
        errors = [line.strip() for line in r.lines if ERROR.search(line)]
        if r.returncode not in (0, None) or errors:
            (waited if errors and all(WAITED.search(e) for e in errors) else own).append((r.rank, errors))
    codes = ", ".join(f"rank {r.rank}: {'stopped' if r.returncode is None else r.returncode}" for r in result.ranks)
    if own and all(any("Detected mismatch" in e for e in errors) for _, errors in own):
        head = (f"the ranks called different collectives (exit codes: {codes}): TORCH_DISTRIBUTED_DEBUG=DETAIL's "
                "check stopped every rank at once, so no rank failed first; each rank's own 'Rank N is running' "
                "names the collective it called")
    elif own:
        rank, errors = own[0]
        head = (f"rank {rank} failed on its own (exit codes: {codes}): " + (errors[-1][:200] if errors else
                "it exited with an error"))
        if waited:
            head += f"; rank(s) {[w for w, _ in waited]} only report(s) waiting for or losing another rank"
    else:
        head = (f"every rank that failed only waited for another (exit codes: {codes}): the errors cannot tell "
                "which rank is at fault, and which one exited first is a matter of timing; read where each rank "
                "waited (a stack dump) and what it waited in")
    # the launcher's summary without its own first line: the last lines of each rank that did not finish cleanly
    return "\n".join([head, *result.summary(tail).splitlines()[1:]])


def device_demo() -> None:
    rank, _, local = rank_world()
    if os.environ.get("BUG_GPUS_PER_TASK") == "1":   # each task sees its own GPU only, before CUDA starts
        os.environ["CUDA_VISIBLE_DEVICES"] = str(local)
    print(f"rank {rank}: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')} "
          f"device_count={torch.cuda.device_count()}", flush=True)
    device = torch.device(f"cuda:{local}")
    torch.zeros(1, device=device)
    print(f"rank {rank}: tensor on {device}", flush=True)


if __name__ == "__main__":
    device_demo()
