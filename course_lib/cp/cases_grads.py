"""``reduce_shared_grads``: the weights are replicated over dp and cp, so their gradients are averaged over both.
First gradients made up per rank (each mistake gives its own numbers), then one training step of a tiny attention
model over dp x cp with the checker's own cp attention, against one process on the whole batch."""
from course_lib.checking.case import Fail
from course_lib.cp import reference
from course_lib.cp.train import forward, model
from course_lib.tp.numerics import close, diff, rand

SHAPES = ((3, 2), (4,))


def _made_up(seed, rank):
    return [rand(seed + 10 * rank + i, *shape) for i, shape in enumerate(SHAPES)]


def case_reduce(c):
    import torch
    import torch.distributed as dist
    fn = c.need("reduce_shared_grads")
    world = dist.get_world_size()
    grads = {r: _made_up(7, r) for r in range(world)}
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES] + [torch.nn.Parameter(torch.zeros(2))]
    for p, g in zip(params, grads[c.rank]):
        p.grad = g.clone()
    fn(params, c.dp_group, c.cp_group)
    if params[2].grad is not None:
        raise Fail("reduce_shared_grads gave a parameter without a grad one: skip those (p.grad is None)")
    members = {"dp": dist.get_process_group_ranks(c.dp_group), "cp": dist.get_process_group_ranks(c.cp_group)}
    everyone = c.shared                                # this rank's dp x cp block: the ranks with its weights

    def mean_over(ranks, divide):
        return [sum(grads[r][i] for r in ranks) / divide for i in range(len(SHAPES))]
    want = mean_over(everyone, len(everyone))
    got = [p.grad for p in params[:2]]
    if all(close(g, w) for g, w in zip(got, want)):
        return None
    n = c.dp * c.cp
    alone = ("not reduced at all: each rank kept its own gradient" if c.dp > 1 else
             "not reduced over cp: each rank kept its own gradient (dp = 1 here, so a reduction over dp_group alone "
             "does nothing); the weights are replicated over cp and each cp rank saw only its S / cp tokens: "
             "all-reduce over cp_group as well")
    named = [(alone, grads[c.rank]),
             (f"summed, not averaged: divide by dp * cp = {n}", mean_over(everyone, 1)),
             ("averaged over dp only: the weights are replicated over cp too, and each cp rank saw only its "
              "S / cp tokens; all-reduce over cp_group as well", mean_over(members["dp"], c.dp)),
             ("averaged over cp only: all-reduce over dp_group too", mean_over(members["cp"], c.cp)),
             (f"reduced over dp and cp but divided by dp = {c.dp} only", mean_over(everyone, c.dp)),
             (f"reduced over dp and cp but divided by cp = {c.cp} only", mean_over(everyone, c.cp)),
             (f"averaged over all {world} ranks of the world, not over this rank's dp x cp ranks {everyone}: here "
              f"dp x cp is not the whole world (the other ranks hold other weights, e.g. another tensor-parallel "
              f"shard); all-reduce over dp_group and over cp_group (group=...) and divide by dp * cp = {n}",
              mean_over(range(world), world))]
    for text, values in named:
        if n > 1 and all(close(g, w) for g, w in zip(got, values)):
            raise Fail(f"the gradients are {text}")
    raise Fail(f"the gradients are not the mean over the dp x cp ranks; {diff(got[0], want[0])}")


def case_train_step(c):
    import torch.nn.functional as F
    fn = c.need("reduce_shared_grads")
    seq_len, features = 4 * c.cp, 4
    pos = reference.positions(seq_len, c.cp, c.r, balanced=True)
    data = [(rand(50 + d, 2, seq_len, features), rand(60 + d, 2, seq_len, features)) for d in range(c.dp)]
    net = model(features, 3)   # the same weights in every rank and in the serial model
    x, y = data[c.dp_rank]
    local = forward(net, x[:, pos], lambda q, k, v: reference.cp_attention(q, k, v, pos, c.cp_group))
    F.mse_loss(local, y[:, pos]).backward()         # the mean over this rank's own tokens
    fn(list(net.parameters()), c.dp_group, c.cp_group)
    serial = model(features, 3)
    loss = sum(F.mse_loss(forward(serial, xs, reference.serial), ys) for xs, ys in data) / c.dp
    loss.backward()
    for (name, p), s in zip(net.named_parameters(), serial.parameters()):
        if not close(p.grad, s.grad):
            ratio = (p.grad.norm() / s.grad.norm()).item() if p.grad is not None else float("nan")
            raise Fail(f"one training step (dp={c.dp} x cp={c.cp}, balanced split, each rank's loss the mean over "
                       f"its tokens): {name}.grad differs from one process on the whole batch ({diff(p.grad, s.grad)}; "
                       f"norm ratio {ratio:.3g})")
    return None
