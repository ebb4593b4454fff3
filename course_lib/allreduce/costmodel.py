"""The alpha-beta cost model of all-reduce algorithms, and its fit to measured times.

Thakur, Rabenseifner & Gropp (2005), "Optimization of collective communication operations in MPICH":
sending a message of n bytes costs alpha + n*beta (alpha: latency per message, beta: seconds per byte),
reducing n bytes costs n*gamma. For an all-reduce of n bytes over W ranks:

    naive  (reduce to rank 0, then send to each)   2(W-1) alpha + 2(W-1) n beta       + (W-1) n gamma
    ring   (reduce-scatter, then all-gather)       2(W-1) alpha + 2((W-1)/W) n beta   + ((W-1)/W) n gamma
    tree   (binomial reduce, then broadcast)       2 L alpha    + 2 L n beta          + L n gamma,  L = ceil(log2 W)

In each line the gamma term is proportional to the beta term (half of it, per byte), so it folds into an
effective beta = beta + gamma/2, and every algorithm is T = a(W) alpha + b(W) n beta. Gloo's all-reduce
on CPU tensors is a ring, so ``gloo`` uses the ring model. busbw (nccl-tests' "bus bandwidth") rescales
algbw = n / T by 2(W-1)/W, the ring's share of data each rank must send, so that busbw is comparable
across W and close to the link speed for a bandwidth-optimal algorithm.
"""


def coefficients(algo: str, world: int) -> tuple[float, float]:
    """(a, b) with T = a * alpha + b * n * beta for an all-reduce of n bytes on ``world`` ranks."""
    w = world
    if algo == "naive":
        return 2 * (w - 1), 2 * (w - 1)
    if algo in ("ring", "gloo"):
        return 2 * (w - 1), 2 * (w - 1) / w
    if algo == "tree":
        steps = (w - 1).bit_length()      # ceil(log2 W): the rounds of a binomial tree
        return 2 * steps, 2 * steps
    raise ValueError(f"no cost model for {algo!r} (naive, ring, tree, gloo)")


def predict(algo: str, world: int, nbytes: float, alpha: float, beta: float) -> float:
    """Modelled seconds for one all-reduce of ``nbytes`` bytes."""
    a, b = coefficients(algo, world)
    return a * alpha + b * nbytes * beta


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s (nccl-tests): the data size over the time."""
    return nbytes / seconds


def busbw(nbytes: float, seconds: float, world: int) -> float:
    """Bus bandwidth in bytes/s (nccl-tests, all-reduce): algbw * 2(W-1)/W."""
    return algbw(nbytes, seconds) * 2 * (world - 1) / world


def fit(rows, algo: str) -> tuple[float, float]:
    """Least-squares (alpha, beta) >= 0 for one algorithm from rows of {algo, ranks, bytes, seconds}.

    Relative errors are minimised (each equation divided by the measured time), so that microsecond
    latencies at 4 KiB count as much as the bandwidth at 64 MiB.
    """
    import numpy as np
    from scipy.optimize import nnls
    mine = [r for r in rows if r["algo"] == algo and r["ranks"] > 1]
    if len(mine) < 2:
        raise ValueError(f"need at least two measurements of {algo} with more than one rank to fit")
    A = np.array([[coefficients(algo, r["ranks"])[0], coefficients(algo, r["ranks"])[1] * r["bytes"]]
                  for r in mine]) / np.array([[r["seconds"]] for r in mine])
    scale = np.linalg.norm(A, axis=0)           # alpha ~ 1e-4 s, beta ~ 1e-9 s/B: solve in unit columns
    x, _ = nnls(A / scale, np.ones(len(mine)))
    alpha, beta = x / scale
    return float(alpha), float(beta)


def ddp_bucket_bytes(model, bucket_cap_mb: float = 25) -> list[int]:
    """The bytes of each gradient bucket DDP builds for ``model`` with its defaults: torch's own assignment (the
    function DDP calls, over the parameters in reverse order), a first bucket of 1 MiB, then ``bucket_cap_mb``.
    Each bucket is one all-reduce, so the model charges one latency per bucket, not one per step."""
    import torch.distributed as dist

    params = [p for p in model.parameters() if p.requires_grad][::-1]
    caps = [dist._DEFAULT_FIRST_BUCKET_BYTES, int(bucket_cap_mb * 2**20)]
    buckets, _ = dist._compute_bucket_assignment_by_size(params, caps, [False] * len(params))
    return [sum(params[i].numel() * params[i].element_size() for i in bucket) for bucket in buckets]
