"""The ranks the GPU items launch, one worker per item: ``python -m course_lib.selftest.ranks NAME [ARGS]``.

    fork_rank            a rank of warm-fork-cuda (launched warm): a first CUDA op, ``fork_rank ...``
    fork_rank --control  warm-fork-cuda's control: init CUDA, fork, the child tries CUDA: ``fork_control ...``
    gloo_cuda            a rank of ddp-gloo-cuda: DDP with gloo on CUDA tensors, every rank on GPU 0
    nccl_one             the rank of nccl-1rank: NCCL's group bound to its GPU, and its collectives
    tp_nccl TP_PY        a rank of tp-nccl: the solution's tensor-parallel MLP against the serial MLP

Rank 0 of each prints one line a program can parse, ``NAME ok ...`` (``WRONG`` where the values are not right).
``COURSE_SELFTEST_CPU=1`` runs the collective workers on CPU over gloo: the tests run their logic so.
"""
import sys

# before this module imports torch: a rank forked by the warm server inherited it (fork_rank's warm=yes)
WARM = "torch" in sys.modules

import gc  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from course_lib.core.loader import import_path  # noqa: E402
from course_lib.core.rankkit import rank_env  # noqa: E402
from course_lib.tp.shards import load_column, load_row  # noqa: E402

CPU_FLAG = "COURSE_SELFTEST_CPU"
ELEMENTS = 1 << 20        # nccl_one: 4 MiB of fp32, a real kernel, not a launch of nothing
STEPS = 5                 # gloo_cuda: DDP steps
HIDDEN, FFN, BATCH = 64, 256, 8      # tp_nccl: the MLP
TOL = 1e-4


def _join(backend: str, device_of=lambda env: env.local_rank):
    """(rank env, device) after joining the group: ``backend`` on the rank's GPU, gloo on CPU under CPU_FLAG;
    NCCL bound to its GPU at init (``device_id``), as the course's DDP solution joins."""
    env = rank_env()
    cpu = os.environ.get(CPU_FLAG) == "1"
    device = torch.device("cpu") if cpu else torch.device("cuda", device_of(env))
    if not cpu:
        torch.cuda.set_device(device)
    backend = "gloo" if cpu else backend
    dist.init_process_group(backend, rank=env.rank, world_size=env.world_size,
                            device_id=device if backend == "nccl" else None)
    return env, device


def _said(env, name: str, ok: bool, rest: str) -> int:
    """Rank 0 prints ``NAME ok|WRONG REST``; the group is left; the exit code."""
    if env.rank == 0:
        print(f"{name} {'ok' if ok else 'WRONG'} {rest}", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


# CUDA cannot be used in a child forked from a process that had initialised it (torch marks it a bad fork); the
# warm fork server imports torch but runs no torch op, so its children should be clean.
def _try_cuda() -> str:
    """"ok" or the error of a first CUDA op in this process."""
    try:
        x = torch.ones(1024, device="cuda")
        torch.cuda.synchronize()
        return "ok" if x.sum().item() == 1024 else "wrong sum"
    except Exception as e:  # noqa: BLE001 - the error is the finding
        return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"


def fork_rank(argv: list[str]) -> int:
    """One rank: is it a bad fork, does a CUDA op run? ``--control``: the same in a child forked after CUDA was
    initialised here (it must be refused)."""
    if argv == ["--control"]:
        parent = _try_cuda()                  # initialises CUDA in this process
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            os.write(write, f"bad_fork={'yes' if torch.cuda._is_in_bad_fork() else 'no'} cuda={_try_cuda()}".encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            said = f.read()
        os.waitpid(pid, 0)
        print(f"fork_control parent_cuda={parent} child: {said}", flush=True)
        return 0
    bad = torch.cuda._is_in_bad_fork()
    result = _try_cuda()
    print(f"fork_rank rank={os.environ.get('RANK', os.environ.get('SLURM_PROCID', '?'))} "
          f"warm={'yes' if WARM else 'no'} bad_fork={'yes' if bad else 'no'} cuda={result}", flush=True)
    return 0 if result == "ok" else 1


def gloo_cuda(_argv) -> int:
    """NCCL refuses two ranks on one GPU, gloo does not (it copies CUDA tensors through the host): a few DDP steps,
    each rank on its own batch; then every rank's parameters must be equal and an all-reduce give the sum."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from course_lib.model import Net

    env, device = _join("gloo", lambda env: env.local_rank % torch.cuda.device_count())
    torch.manual_seed(0)                                  # the same start; DDP broadcasts rank 0's anyway
    model = DDP(Net().to(device), device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator(device="cpu").manual_seed(100 + env.rank)   # each rank its own data
    for _ in range(STEPS):
        x = torch.randn(32, 1, 28, 28, generator=gen).to(device)
        y = torch.randint(0, 10, (32,), generator=gen).to(device)
        opt.zero_grad()
        F.nll_loss(model(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    copies = [torch.empty_like(flat) for _ in range(env.world_size)]
    dist.all_gather(copies, flat)                          # CUDA tensors through gloo
    spread = max((c - flat).abs().max().item() for c in copies)
    ones = torch.full((1000,), float(env.rank + 1), device=device)
    dist.all_reduce(ones)
    want = env.world_size * (env.world_size + 1) / 2
    ok = spread == 0.0 and bool((ones == want).all())
    del model, opt                 # drop DDP before the group (see DESIGN: gloo + DDP shutdown)
    gc.collect()
    return _said(env, "gloo_cuda", ok, f"ranks={env.world_size} device={device} param_spread={spread:.3g} "
                                       f"allreduce={ones[0].item():g} (want {want:g})")


def nccl_one(_argv) -> int:
    """What one GPU can show of NCCL: a group bound to the GPU (``device_id``) whose all-reduce, broadcast and
    barrier give the right values; with one rank nothing crosses between GPUs."""
    env, device = _join("nccl")
    x = torch.full((ELEMENTS,), float(env.rank + 1), device=device)
    dist.all_reduce(x)
    b = torch.arange(8, dtype=torch.float32, device=device) * (1 if env.rank == 0 else 0)
    dist.broadcast(b, src=0)
    dist.barrier()             # with device_id bound, NCCL's barrier needs no guess of the rank's GPU
    want = env.world_size * (env.world_size + 1) / 2
    ok = bool((x == want).all()) and b.tolist() == list(map(float, range(8)))
    version = "" if device.type == "cpu" else ".".join(map(str, torch.cuda.nccl.version()))
    return _said(env, "nccl_one", ok, f"backend={dist.get_backend()} ranks={env.world_size} device={device} "
                                      f"nccl={version or 'n/a'} allreduce={x[0].item():g} (want {want:g}) "
                                      f"broadcast={'ok' if b[7].item() == 7 else 'WRONG'}")


def tp_nccl(argv: list[str]) -> int:
    """The solution's (``argv[0]``) Column/RowParallelLinear, loaded with this rank's shards of a serial MLP, over
    NCCL: output, input gradient and weight-gradient shards against the serial ones."""
    tp = import_path(argv[0], "tp_under_check")
    env, device = _join("nccl")
    torch.manual_seed(0)   # the same serial MLP and batch on every rank
    fc1 = torch.nn.Linear(HIDDEN, FFN).to(device)
    fc2 = torch.nn.Linear(FFN, HIDDEN).to(device)
    x = torch.randn(BATCH, HIDDEN, device=device, requires_grad=True)
    F.gelu(fc2(F.gelu(fc1(x)))).square().sum().backward()
    col = tp.ColumnParallelLinear(HIDDEN, FFN).to(device)
    row = tp.RowParallelLinear(FFN, HIDDEN).to(device)
    part = FFN // env.world_size
    s = slice(env.rank * part, (env.rank + 1) * part)
    load_column(col, fc1, env.world_size, env.rank)       # this rank's shards of the serial weights
    load_row(row, fc2, env.world_size, env.rank)
    xp = x.detach().clone().requires_grad_(True)
    out = row(F.gelu(col(xp)))
    F.gelu(out).square().sum().backward()
    serial_out = fc2(F.gelu(fc1(x)))
    errors = {"output": (out - serial_out).abs().max().item(),
              "input grad": (xp.grad - x.grad).abs().max().item(),
              "fc1 grad shard": (col.weight.grad - fc1.weight.grad[s]).abs().max().item(),
              "fc2 grad shard": (row.weight.grad - fc2.weight.grad[:, s]).abs().max().item()}
    worst = torch.tensor([max(errors.values())], device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)          # NCCL on a CUDA tensor
    shown = ", ".join(f"{k} {v:.2g}" for k, v in errors.items())
    return _said(env, f"tp_{dist.get_backend()}", worst.item() <= TOL,
                 f"ranks={env.world_size} max_error={worst.item():.3g} (rank 0: {shown})")


if __name__ == "__main__":
    sys.exit({"fork_rank": fork_rank, "gloo_cuda": gloo_cuda, "nccl_one": nccl_one,
              "tp_nccl": tp_nccl}[sys.argv[1]](sys.argv[2:]))
