"""ZeRO stages 1 and 2, on a reduce-scatter and an all-gather of your own.

Data parallelism (DDP) keeps on every rank a whole copy of the parameters, of the gradients and of the
optimizer's state. ZeRO (Rajbhandari et al., 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models") drops the copies that are redundant:

- stage 1 shards the optimizer state: rank r keeps the state (Adam's two moments, SGD's momentum) only for
  its shard of the parameters and updates only that shard; an all-gather then gives every rank all the
  updated parameters;
- stage 2 also shards the gradients: once they are reduce-scattered, rank r keeps only its shard's
  gradient and frees the full-size ones.

Here all of a model's parameters are seen as one flat vector of n numbers, one parameter after the other,
and rank r owns the contiguous slice ``flat[start:stop]`` with ``(start, stop) = shard_range(n, r, W)``.

What you write (every TODO):
1. ``shard_range(n, rank, world)``: the slice this rank owns; every element owned by exactly one rank, in
   rank order, no shard longer than ceil(n / W).
2. ``reduce_scatter(flat, group=None)``: the sum over the ranks of ``flat``, but only this rank's shard of
   it. Point-to-point operations only: it is the first half of your ring all-reduce (notebook 05), ending
   with each rank holding the sum of its *own* chunk.
3. ``all_gather(shard, flat, group=None)``: every rank's shard into ``flat``, in place: the second half.
4. ``ZeroOptimizer``: the shard and the inner optimizer in ``__init__``, and ``step``.

``collectives="torch"`` makes ZeroOptimizer use the library's collectives instead of yours
(``torch_reduce_scatter``, ``torch_all_gather`` below), so that you can write and test it first.

Check your work: ``course check zero exercises/09_zero/zero.py``.
"""
import torch
import torch.distributed as dist

COLLECTIVES = "mine"     # "mine": your reduce_scatter / all_gather; "torch": the library's


def peer(group, rank):
    """The global rank of ``rank`` in ``group``: send/recv take global ranks, even with a group."""
    return rank if group is None else dist.get_global_rank(group, rank)


def sendrecv(send_buf, dst, recv_buf, src, group):
    """Send to ``dst`` and receive from ``src`` at once (both posted before either is waited on)."""
    ops = []
    if send_buf.numel():      # an empty shard (n < W) is skipped by both ends: each knows the sizes
        ops.append(dist.P2POp(dist.isend, send_buf, dst, group))
    if recv_buf.numel():
        ops.append(dist.P2POp(dist.irecv, recv_buf, src, group))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()


def shard_range(n, rank, world):
    """(start, stop): the slice of a flat vector of ``n`` elements that ``rank`` of ``world`` owns."""
    raise NotImplementedError("shard_range: split range(n) into W contiguous slices in rank order, "
                              "as the ring's chunks in notebook 05 (their sizes differ by at most 1)")


def shards(n, world):
    """Every rank's (start, stop)."""
    return [shard_range(n, r, world) for r in range(world)]


def reduce_scatter(flat, group=None):
    """Return this rank's shard of the sum of ``flat`` over the ranks (a tensor of its shard's size).

    ``flat`` (1-D) may be used as scratch space: it need not hold its input afterwards.
    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    chunks = [flat[a:b] for a, b in shards(flat.numel(), world)]   # views into flat
    if world == 1:
        return chunks[0].clone()
    right, left = peer(group, (rank + 1) % world), peer(group, (rank - 1) % world)
    raise NotImplementedError("reduce_scatter: W-1 ring steps with sendrecv: send a partial sum right, "
                              "receive one from the left and add it; choose the chunk indices so that "
                              "the last chunk received and added is chunks[rank]")
    return chunks[rank].clone()


def all_gather(shard, flat, group=None):
    """Write every rank's ``shard`` into its place in ``flat`` (1-D, the full size), in place."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    chunks = [flat[a:b] for a, b in shards(flat.numel(), world)]
    chunks[rank].copy_(shard)
    if world == 1:
        return
    right, left = peer(group, (rank + 1) % world), peer(group, (rank - 1) % world)
    raise NotImplementedError("all_gather: W-1 ring steps with sendrecv: pass the chunks round the ring, "
                              "receiving each straight into its place in flat")


# ---- the library's collectives (given) ------------------------------------------------------------------------
# torch's tensor collectives want equal pieces: pad every shard to ceil(n / W), then drop the padding.
_RS = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor    # new name in torch 2.13
_AG = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _padded(n, world):
    return -(-n // world)


def torch_reduce_scatter(flat, group=None):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    size, bounds = _padded(flat.numel(), world), shards(flat.numel(), world)
    padded = flat.new_zeros(size * world)
    for i, (a, b) in enumerate(bounds):
        padded[i * size: i * size + b - a] = flat[a:b]
    out = flat.new_empty(size)
    _RS(out, padded, group=group)
    a, b = bounds[rank]
    return out[: b - a].clone()


def torch_all_gather(shard, flat, group=None):
    world = dist.get_world_size(group)
    size, bounds = _padded(flat.numel(), world), shards(flat.numel(), world)
    mine = flat.new_zeros(size)
    mine[: shard.numel()] = shard
    out = flat.new_empty(size * world)
    _AG(out, mine, group=group)
    for i, (a, b) in enumerate(bounds):
        flat[a:b] = out[i * size: i * size + b - a]


# ---- ZeRO ------------------------------------------------------------------------------------------------------
def flatten(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def flat_grads(params):
    """All gradients as one new flat tensor (zeros for a parameter that got none)."""
    return flatten([p.grad if p.grad is not None else torch.zeros_like(p) for p in params])


def unflatten_into(flat, params):
    """Copy ``flat`` back into the parameters, in place."""
    for p, piece in zip(params, flat.split([p.numel() for p in params])):
        p.copy_(piece.view_as(p))


class ZeroOptimizer:
    """ZeRO stage 1 or 2 around any torch optimizer: ``zero.step()`` after ``loss.backward()`` does what DDP's
    averaged gradients and ``optimizer.step()`` do, holding optimizer state only for this rank's shard.

        zero = ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=2, lr=1e-3)
        loss.backward(); zero.step(); zero.zero_grad()

    ``self.optimizer`` is the inner optimizer (the checker measures its state); ``self.shard`` this rank's
    slice of the flattened parameters, the one tensor that optimizer updates.
    """

    def __init__(self, params, optimizer_class, stage=1, group=None, collectives=None, **defaults):
        if stage not in (1, 2):
            raise ValueError(f"stage must be 1 or 2, not {stage!r}")
        collectives = collectives or COLLECTIVES
        self.reduce_scatter, self.all_gather = {"mine": (reduce_scatter, all_gather),
                                                "torch": (torch_reduce_scatter, torch_all_gather)}[collectives]
        self.params = [p for p in params if p.requires_grad]
        self.stage, self.group = stage, group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.numel = sum(p.numel() for p in self.params)
        self.start, self.stop = shard_range(self.numel, self.rank, self.world)
        raise NotImplementedError("ZeroOptimizer: self.shard = a copy of this rank's slice of the flattened "
                                  "parameters; self.optimizer = optimizer_class([self.shard], **defaults)")

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        grads = flat_grads(self.params)
        raise NotImplementedError("step: reduce-scatter the gradients, average them as DDP does, give the "
                                  "shard its gradient (stage 2: free the full-size ones), step the inner "
                                  "optimizer, all-gather the updated shards into the parameters")
