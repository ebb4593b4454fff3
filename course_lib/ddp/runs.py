"""What each rank of a launch under the probe did (``cluster.launch_one`` launches): a ``Run`` holds the launcher's
result and each rank's record (``rank-<N>.json``), stack dump and trained parameters.
"""
from dataclasses import dataclass
from pathlib import Path

from course_lib.runtime.job import read_json

SCRIPT_ARGS = ["--dataset", "digits", "--epochs", "2", "--save-model"]
EPOCHS = int(SCRIPT_ARGS[SCRIPT_ARGS.index("--epochs") + 1])


@dataclass
class Run:
    """One launch of the script under the probe: the launcher's result and each rank's record."""
    style: str
    nprocs: int
    result: object                  # course_lib.runtime.launch.LaunchResult
    folder: Path                    # the probe's records
    gpu: bool
    records: list

    def stack(self, rank: int) -> str:
        p = self.folder / f"stack-{rank}.txt"
        return p.read_text(errors="replace") if p.is_file() else ""

    def params(self, rank: int):
        """The rank's trained parameters, flat (a float32 numpy array), or None."""
        import numpy as np  # deferred: Step 2 alone reads them
        p = self.folder / f"params-{rank}.f32"
        return np.fromfile(p, dtype=np.float32) if p.is_file() else None

    def rec(self, rank: int) -> dict:
        return self.records[rank] or {}

    def exited_normally(self, rank: int) -> bool:
        ex = self.rec(rank).get("exit")
        return bool(ex) and ex.get("code") == 0

    def finished(self) -> bool:
        """Every rank ran the script to its end (whatever the process did after that)."""
        return all(self.exited_normally(r) for r in range(self.nprocs))


def start_env(gpu: bool) -> dict:
    """The variables of a probe launch that Python and torch read at start-up (the warm server gets them too)."""
    env = {"PYTHONDONTWRITEBYTECODE": "1"}
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""   # fewer GPUs than ranks: check on CPU, say so at Step 4
    return env


def group(run: Run):
    """Per rank: (rank, world_size) the group gave it, or None."""
    inits = [[e for e in run.rec(r).get("init", []) if "world_size" in e] for r in range(run.nprocs)]
    return [(i[-1]["rank"], i[-1]["world_size"]) if i else None for i in inits]


def grouped(root: Path, style: str) -> bool:
    """The 2 ranks of the launch ``style-2`` in ``root`` are, by their records so far, in one group (``group_ok``)."""
    folder = root / f"{style}-2"
    records = [read_json(folder / f"rank-{rank}.json") for rank in range(2)]
    return all(records) and group_ok(Run(style, 2, None, folder, False, records))


def group_ok(run: Run) -> bool:
    g = group(run)
    return all(g) and sorted(r for r, _ in g) == list(range(run.nprocs)) and all(w == run.nprocs for _, w in g)


def ended(run: Run) -> bool:
    """Every rank ran the script to its end in one whole group (whatever the processes did after that)."""
    return run.finished() and group_ok(run)


def works(run: Run) -> bool:
    return run.result.ok and ended(run)


def placement(nprocs: int, gpus: int, compared_with: int = 0) -> tuple[dict, str]:
    """(launch variables, what to say) for ``nprocs`` local ranks on this machine's ``gpus``, in a comparison
    whose largest run has ``compared_with`` ranks (its runs must all run on the same kind of device).

    The DDP script gives each rank ``cuda:LOCAL_RANK``: with fewer GPUs than ranks, rank 1 of 2 on a one-GPU
    machine fails at ``set_device(1)``, so the GPUs are hidden, as the DDP checker does; the message says so."""
    need = max(nprocs, compared_with)
    if gpus == 0 or gpus >= need:
        return {}, ""
    return start_env(False), (f"{need} ranks but {gpus} GPU(s) here: GPUs hidden (CUDA_VISIBLE_DEVICES=''), "
                              "the ranks run on CPU with gloo")


def train_on(script: Path, nprocs: int, args: list, timeout: float = 600, gpus: int | None = None,
             compared_with: int = 0, warm: bool = True):
    """Run ``script ARGS`` on ``nprocs`` ranks where the site runs them (course_lib.runs); rank 0's last epoch
    record (None, and why, if it failed). Prints one line: images/s, test accuracy, and where the ranks ran.
    ``gpus`` (default: the run's node's) and ``compared_with``: as ``placement`` takes them."""
    from course_lib import runs
    from course_lib.metrics import parse_epoch_lines

    # the GPUs of the node that runs the ranks: the site's where runs go to Slurm
    env, note = placement(nprocs, runs.node_gpus() if gpus is None else gpus, compared_with)
    lines = []
    with runs.workdir() as work:
        res = runs.launch([str(script), *args], nprocs=nprocs, timeout=timeout, cwd=work, env=env or None, warm=warm,
                          on_line=lambda r, line: lines.append(f"[rank {r}] {line}"))
    where = f" ({note})" if note else ""
    records = parse_epoch_lines("\n".join(lines), rank=0)
    if not res.ok or not records:
        print(f"{nprocs} rank(s): did not run through{where}: {res.summary()}")
        return None
    last = records[-1]
    print(f"{nprocs} rank(s): {last['images_per_s']:7.0f} images/s in total, {last['images_per_s_rank']:7.0f} per "
          f"rank, test accuracy {last['test_acc']:.1%} after {len(records)} epoch(s){where}")
    return last
