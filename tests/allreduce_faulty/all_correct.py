# All three correct, in a learner's style (the control: everything passes).
import torch
import torch.distributed as dist


def glob(group, r):
    # send/recv want global ranks, also inside a group
    return r if group is None else dist.get_global_rank(group, r)


def naive_allreduce(tensor, group=None):
    world = dist.get_world_size(group)
    if dist.get_rank(group) == 0:
        for src in range(1, world):
            other = torch.empty_like(tensor)
            dist.recv(other, glob(group, src), group)
            tensor += other
        for dst in range(1, world):
            dist.send(tensor, glob(group, dst), group)
    else:
        dist.send(tensor, glob(group, 0), group)
        dist.recv(tensor, glob(group, 0), group)


def ring_allreduce(tensor, group=None):
    W, r = dist.get_world_size(group), dist.get_rank(group)
    flat = tensor.view(-1)
    n = flat.numel()
    cuts = [n * i // W for i in range(W + 1)]
    ch = [flat[cuts[i]:cuts[i + 1]] for i in range(W)]
    for k in range(W - 1):
        out, inn = ch[(r - k) % W], ch[(r - k - 1) % W]
        tmp = torch.empty_like(inn)
        a = dist.isend(out, glob(group, (r + 1) % W), group)
        b = dist.irecv(tmp, glob(group, (r - 1) % W), group)
        a.wait(); b.wait()
        inn += tmp
    for k in range(W - 1):
        a = dist.isend(ch[(r + 1 - k) % W], glob(group, (r + 1) % W), group)
        b = dist.irecv(ch[(r - k) % W], glob(group, (r - 1) % W), group)
        a.wait(); b.wait()


def tree_allreduce(tensor, group=None):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    buf = torch.empty_like(tensor)
    mask = 1
    while mask < world:
        if rank & mask:
            dist.send(tensor, glob(group, rank - mask), group)
            break
        if rank + mask < world:
            dist.recv(buf, glob(group, rank + mask), group)
            tensor += buf
        mask <<= 1
    top = 1
    while top < world:
        top <<= 1
    mask = top if rank == 0 else rank & -rank
    if rank:
        dist.recv(tensor, glob(group, rank - mask), group)
    mask >>= 1
    while mask:
        if rank + mask < world:
            dist.send(tensor, glob(group, rank + mask), group)
        mask >>= 1

