# A syntax error: the whole file fails to load.
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


def ring_allreduce(tensor, group=None)
    pass

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

