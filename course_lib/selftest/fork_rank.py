"""The ranks of the warm-fork-cuda item, and its control: does CUDA work in a process made by fork()?

CUDA cannot be used in a child forked from a process that had initialised it: torch marks such a child
(``torch.cuda._is_in_bad_fork()``) and its first CUDA call raises "Cannot re-initialize CUDA in forked
subprocess". The warm fork server imports torch but runs no torch op, so its children should be clean.

    python -m course_lib.selftest.fork_rank            # one rank (launched warm): CUDA op, prints fork_rank ...
    python -m course_lib.selftest.fork_rank --control  # init CUDA, fork, the child tries CUDA: prints fork_control ...

Each prints one line a program can parse. ``warm=yes`` means torch was already imported when the rank began
(it was forked from the warm server, not started cold).
"""
import sys

WARM = "torch" in sys.modules      # before this module imports torch: a warm-forked rank inherited it

import os  # noqa: E402

import torch  # noqa: E402


def _try_cuda() -> str:
    """"ok" or the error of a first CUDA op in this process."""
    try:
        x = torch.ones(1024, device="cuda")
        torch.cuda.synchronize()
        return "ok" if x.sum().item() == 1024 else "wrong sum"
    except Exception as e:  # noqa: BLE001 - the error is the finding
        return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"


def rank() -> int:
    bad = torch.cuda._is_in_bad_fork()
    result = _try_cuda()
    print(f"fork_rank rank={os.environ.get('RANK', os.environ.get('SLURM_PROCID', '?'))} "
          f"warm={'yes' if WARM else 'no'} bad_fork={'yes' if bad else 'no'} cuda={result}", flush=True)
    return 0 if result == "ok" else 1


def control() -> int:
    parent = _try_cuda()                  # initialises CUDA in this process
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                          # the child: what a rank forked after CUDA init would meet
        os.close(read)
        line = f"bad_fork={'yes' if torch.cuda._is_in_bad_fork() else 'no'} cuda={_try_cuda()}"
        os.write(write, line.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        said = f.read()
    os.waitpid(pid, 0)
    print(f"fork_control parent_cuda={parent} child: {said}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(control() if sys.argv[1:] == ["--control"] else rank())
