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
    ### BEGIN SOLUTION
    # STUB: raise NotImplementedError("naive_allreduce: on rank 0, recv every other rank's tensor and add it; "
    # STUB:                           "then send the sum to ranks 1..W-1 (which recv it into `tensor`)")
    if world == 1 or tensor.numel() == 0:
        return
    if rank == 0:
        incoming = torch.empty_like(tensor)          # same dtype: an int64 sum stays exact
        for src in range(1, world):
            dist.recv(incoming, src=peer(group, src), group=group)
            tensor += incoming                       # in place: the caller's tensor holds the sum
        for dst in range(1, world):
            dist.send(tensor, dst=peer(group, dst), group=group)
    else:
        dist.send(tensor, dst=peer(group, 0), group=group)
        dist.recv(tensor, src=peer(group, 0), group=group)
    ### END SOLUTION


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
    ### BEGIN SOLUTION
    # STUB: raise NotImplementedError("ring_allreduce: cut `flat` into W chunks (views; some empty when n < W), "
    # STUB:                           "then W-1 reduce-scatter steps (send chunk (rank-s)%W right, recv chunk "
    # STUB:                           "(rank-s-1)%W from the left and add it) and W-1 all-gather steps; use sendrecv")
    n = flat.numel()
    bounds = [i * n // world for i in range(world + 1)]   # chunk i is flat[bounds[i]:bounds[i+1]]
    chunks = [flat[bounds[i]:bounds[i + 1]] for i in range(world)]   # views, not copies
    incoming = scratch(tensor, max(c.numel() for c in chunks))
    # reduce-scatter: each step adds the left neighbour's partial sum of one chunk into ours
    for step in range(world - 1):
        send_i, recv_i = (rank - step) % world, (rank - step - 1) % world
        buf = incoming[: chunks[recv_i].numel()]
        sendrecv(chunks[send_i], right, buf, left, group)
        chunks[recv_i] += buf
    # all-gather: pass the finished chunks on; receive straight into place, no copy
    for step in range(world - 1):
        send_i, recv_i = (rank + 1 - step) % world, (rank - step) % world
        sendrecv(chunks[send_i], right, chunks[recv_i], left, group)
    ### END SOLUTION


def tree_allreduce(tensor, group=None):
    """Binomial-tree reduce to rank 0, then binomial-tree broadcast from rank 0: 2 ceil(log2 W) rounds.

    Round k (mask = 2**k) of the reduce: a rank whose bit k is set sends its partial sum to rank - mask
    and is done; a rank below it receives from rank + mask (if that exists) and adds. The broadcast
    runs the same tree backwards. Works for any W, not only powers of two.
    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if world == 1 or tensor.numel() == 0:
        return
    ### BEGIN SOLUTION
    # STUB: raise NotImplementedError("tree_allreduce: for mask = 1, 2, 4, ...: ranks with (rank & mask) send "
    # STUB:                           "to rank-mask and stop, the others recv from rank+mask (if < W) and add; "
    # STUB:                           "then broadcast the sum back down the same tree")
    incoming = torch.empty_like(tensor)
    mask = 1
    while mask < world:                               # reduce towards rank 0
        if rank & mask:
            dist.send(tensor, dst=peer(group, rank - mask), group=group)
            break
        if rank + mask < world:
            dist.recv(incoming, src=peer(group, rank + mask), group=group)
            tensor += incoming
        mask <<= 1
    # broadcast: receive from the rank we sent to (rank 0 receives nothing), then feed our subtree
    if rank == 0:
        mask = 1
        while mask < world:
            mask <<= 1
    else:
        mask = rank & -rank                           # lowest set bit: the round in which we sent
        dist.recv(tensor, src=peer(group, rank - mask), group=group)
    mask >>= 1
    while mask:
        if rank + mask < world:
            dist.send(tensor, dst=peer(group, rank + mask), group=group)
        mask >>= 1
    ### END SOLUTION
