# Ring with chunk size n // W for every chunk: the last n % W elements are never reduced.
import torch
import torch.distributed as dist


def naive_allreduce(tensor, group=None):
    rank, size = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        tmp = torch.zeros_like(tensor)
        for i in range(1, size):
            dist.recv(tmp, src=i)
            tensor.add_(tmp)
        for i in range(1, size):
            dist.send(tensor, dst=i)
    else:
        dist.send(tensor, dst=0)
        dist.recv(tensor, src=0)


def ring_allreduce(tensor, group=None):
    rank, size = dist.get_rank(), dist.get_world_size()
    if size == 1:
        return
    data = tensor.view(-1)
    step_len = data.numel() // size                  # BUG: drops the remainder
    chunks = [data[i * step_len:(i + 1) * step_len] for i in range(size)]
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    for s in range(size - 1):
        send_c, recv_c = chunks[(rank - s) % size], chunks[(rank - s - 1) % size]
        buf = torch.empty_like(recv_c)
        reqs = [dist.isend(send_c, nxt), dist.irecv(buf, prv)]
        for r in reqs:
            r.wait()
        recv_c += buf
    for s in range(size - 1):
        send_c, recv_c = chunks[(rank + 1 - s) % size], chunks[(rank - s) % size]
        reqs = [dist.isend(send_c, nxt), dist.irecv(recv_c, prv)]
        for r in reqs:
            r.wait()


def tree_allreduce(tensor, group=None):
    rank, size = dist.get_rank(), dist.get_world_size()
    tmp = torch.empty_like(tensor)
    d = 1
    while d < size:
        if rank % (2 * d) == d:
            dist.send(tensor, rank - d)
            break
        if rank % (2 * d) == 0 and rank + d < size:
            dist.recv(tmp, rank + d)
            tensor += tmp
        d *= 2
    d = 1
    while d < size:
        d *= 2
    while d > 1:
        d //= 2
        if rank % (2 * d) == 0 and rank + d < size:
            dist.send(tensor, rank + d)
        elif rank % (2 * d) == d:
            dist.recv(tensor, rank - d)
