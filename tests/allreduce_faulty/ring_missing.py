# ring_allreduce not written at all (renamed).
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


def my_ring(tensor, group=None):
    W, r = dist.get_world_size(group), dist.get_rank(group)
    flat = tensor.view(-1)
    n = flat.numel()
    cuts = [n * i // W for i in range(W + 1)]
    ch = [flat[cuts[i]:cuts[i + 1]] for i in range(W)]
    for k in range(W - 1):
        out, inn = ch[(r - k) % W], ch[(r - k - 1) % W]
        tmp = torch.empty_like(inn)
        a = dist.isend(out, (r + 1) % W)
        b = dist.irecv(tmp, (r - 1) % W)
        a.wait(); b.wait()
        inn += tmp
    for k in range(W - 1):
        a = dist.isend(ch[(r + 1 - k) % W], (r + 1) % W)
        b = dist.irecv(ch[(r - k) % W], (r - 1) % W)
        a.wait(); b.wait()


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

