# Ring that cuts the tensor with torch.chunk: fewer than W chunks when n is small (n=4, W=3 gives 2).
import torch
import torch.distributed as dist


def naive_allreduce(tensor, group=None):
    world = dist.get_world_size(group)
    if dist.get_rank(group) == 0:
        for src in range(1, world):
            other = torch.empty_like(tensor)
            dist.recv(other, src)
            tensor += other
        for dst in range(1, world):
            dist.send(tensor, dst)
    else:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)


def ring_allreduce(tensor, group=None):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if world == 1:
        return
    parts = list(torch.chunk(tensor.view(-1), world))    # BUG: may give fewer than `world` parts
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        s, r = (rank - step) % world, (rank - step - 1) % world
        incoming = torch.empty_like(parts[r])
        ops = [dist.P2POp(dist.isend, parts[s], right), dist.P2POp(dist.irecv, incoming, left)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        parts[r] += incoming
    for step in range(world - 1):
        s, r = (rank + 1 - step) % world, (rank - step) % world
        ops = [dist.P2POp(dist.isend, parts[s], right), dist.P2POp(dist.irecv, parts[r], left)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()


def tree_allreduce(tensor, group=None):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    buf = torch.empty_like(tensor)
    mask = 1
    while mask < world:
        if rank & mask:
            dist.send(tensor, rank - mask)
            break
        if rank + mask < world:
            dist.recv(buf, rank + mask)
            tensor += buf
        mask <<= 1
    top = 1
    while top < world:
        top <<= 1
    mask = top if rank == 0 else rank & -rank
    if rank:
        dist.recv(tensor, rank - mask)
    mask >>= 1
    while mask:
        if rank + mask < world:
            dist.send(tensor, rank + mask)
        mask >>= 1
