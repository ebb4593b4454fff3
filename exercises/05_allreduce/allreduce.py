"""All-reduce (sum) written three ways on point-to-point operations only.

AllReduce(sum): every rank r holds a tensor x_r; afterwards every rank holds x_0 + x_1 + ... + x_{W-1}.
Each function below is called on every rank of an initialised process group, sums *in place* and works
for any world size W, any number of elements n (also n < W, and n not divisible by W) and any dtype.

You may use only point-to-point operations: ``dist.send``, ``dist.recv``, ``dist.isend``, ``dist.irecv``,
``dist.batch_isend_irecv`` with ``dist.P2POp``. No ``dist.all_reduce``, ``reduce``, ``broadcast``, ...

Costs in the alpha-beta model (Thakur, Rabenseifner & Gropp 2005, "Optimization of collective
communication operations in MPICH"): a message of n bytes costs alpha + n * beta.
- naive: 2(W-1) alpha + 2(W-1) n beta      (rank 0 receives and sends everything, one message at a time)
- ring:  2(W-1) alpha + 2((W-1)/W) n beta  (reduce-scatter then all-gather; bandwidth-optimal)
- tree:  2 log2(W) (alpha + n beta)        (binomial tree; few steps, good for small messages)

Helpers you may use: ``peer(group, r)`` (the global rank that send/recv want for rank r of ``group``;
the same number when group is None), ``scratch(like, n)`` (a reusable receive buffer) and ``sendrecv``
(send and receive at once, without deadlock).

Check your work: ``course check allreduce exercises/05_allreduce/allreduce.py``.
"""
import torch
import torch.distributed as dist


def peer(group, rank):
    """The global rank of ``rank`` in ``group``: send/recv take global ranks, even with a group."""
    return rank if group is None else dist.get_global_rank(group, rank)


def naive_allreduce(tensor, group=None):
    """Reduce to rank 0, then rank 0 sends the sum to every other rank (the slides' inefficient algorithm)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    raise NotImplementedError("naive_allreduce: on rank 0, recv every other rank's tensor and add it; "
                              "then send the sum to ranks 1..W-1 (which recv it into `tensor`)")


_scratch = {}   # (dtype, device) -> receive buffer kept between calls


def scratch(like, n):
    """A receive buffer of n elements like ``like``, reused across calls.

    Allocating a fresh 32 MB buffer on every call costs page faults that show up in the benchmark.
    """
    key = (like.dtype, like.device)
    buf = _scratch.get(key)
    if buf is None or buf.numel() < n:
        buf = _scratch[key] = like.new_empty(n)
    return buf[:n]


def sendrecv(send_buf, dst, recv_buf, src, group):
    """Send to ``dst`` and receive from ``src`` at the same time.

    Both operations are posted before either is waited on. If every rank did a blocking send first,
    each would wait for a receive that nobody has posted yet: a deadlock. (Gloo's send waits for the
    matching receive even for one element; MPI and NCCL buffer small messages, so there the same
    mistake hangs only once messages are large.) ``dst`` and ``src`` are global ranks.
    """
    ops = []
    if send_buf.numel():      # an empty chunk (n < W) is skipped by both ends: each knows the sizes
        ops.append(dist.P2POp(dist.isend, send_buf, dst, group))
    if recv_buf.numel():
        ops.append(dist.P2POp(dist.irecv, recv_buf, src, group))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()


def ring_allreduce(tensor, group=None):
    """Ring all-reduce: W-1 reduce-scatter steps, then W-1 all-gather steps, one chunk per step.

    Rank r sends to r+1 and receives from r-1. After the reduce-scatter, rank r holds the full sum of
    chunk (r+1) % W; the all-gather passes these finished chunks round the ring.
    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if world == 1 or tensor.numel() == 0:
        return
    flat = tensor.view(-1)                            # a view: writing into it writes into `tensor`
    right, left = peer(group, (rank + 1) % world), peer(group, (rank - 1) % world)
    raise NotImplementedError("ring_allreduce: cut `flat` into W chunks (views; some empty when n < W), "
                              "then W-1 reduce-scatter steps (send chunk (rank-s)%W right, recv chunk "
                              "(rank-s-1)%W from the left and add it) and W-1 all-gather steps; use sendrecv")


def tree_allreduce(tensor, group=None):
    """Binomial-tree reduce to rank 0, then binomial-tree broadcast from rank 0: 2 ceil(log2 W) rounds.

    Round k (mask = 2**k) of the reduce: a rank whose bit k is set sends its partial sum to rank - mask
    and is done; a rank below it receives from rank + mask (if that exists) and adds. The broadcast
    runs the same tree backwards. Works for any W, not only powers of two.
    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if world == 1 or tensor.numel() == 0:
        return
    raise NotImplementedError("tree_allreduce: for mask = 1, 2, 4, ...: ranks with (rank & mask) send "
                              "to rank-mask and stop, the others recv from rank+mask (if < W) and add; "
                              "then broadcast the sum back down the same tree")
