"""ZeroOptimizer on a sub-group (course check zero, W = 4): ``ZeroOptimizer(..., group=g)`` takes one, as torch's
ZeroRedundancyOptimizer(process_group=) does, and a step() that calls the collectives without ``self.group`` runs
them over the whole world. Two groups of 2, {0, 1} and {2, 3}, each against torch's DDP over the same group;
whom each rank talked to is measured (course_lib.checking.p2p: peers are ranks of the group the call went to)."""
import copy

from course_lib.checking.case import flat
from course_lib.checking.p2p import P2PMeter
from course_lib.zero.zerocase import ATOL, _zero, batch, case_zero, make_model

HALF = 2
STEPS = 2


def halves(c):
    """This rank's group of the two halves, made once per launch (every rank makes every group, in one order)."""
    import torch.distributed as dist
    if "halves" not in c.cache:
        groups = [dist.new_group(list(range(lo, lo + HALF))) for lo in range(0, c.world, HALF)]
        c.cache["halves"] = groups[c.rank // HALF]
    return c.cache["halves"]


def group_problem(c, stage, collectives):
    """None when ZeroOptimizer(group=) on this rank's half of W=4 equals DDP over that half, talking only to its
    group; else why. Only W = 4 runs it."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    group = halves(c)
    members = [c.rank // HALF * HALF + i for i in range(HALF)]
    label = f"ZeroOptimizer(..., group=) with the {c.world} ranks in two groups of {HALF}, rank {c.r} in {members}"
    model = make_model()
    ref = DDP(copy.deepcopy(model), process_group=group)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    mine = copy.deepcopy(model)
    try:
        c.kw = {"group": group}
        zero = _zero(c, stage, torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, collectives, mine)
        for step in range(STEPS):
            x, y = batch(step, c.rank)
            F.mse_loss(ref(x), y).backward()
            ref_opt.step()
            ref_opt.zero_grad()
            F.mse_loss(mine(x), y).backward()
            error = None
            with P2PMeter() as p2p:
                try:
                    zero.step()
                except Exception as e:   # a shard sized by the world, not the group: said with where it went
                    error = e
            zero.zero_grad()
            c.take_counts()
            outside = sorted(p for p in p2p.sent_to | p2p.received_from if p != "any" and p >= HALF)
            if outside:
                raised = f" (step() then raised {type(error).__name__}: {error})" if error else ""
                return (f"{label}: rank {c.r} sent to or received from rank {outside[0]} of the whole world, "
                        f"outside its group of {HALF}{raised}: step() must pass self.group to reduce_scatter and "
                        "all_gather, so that only the group's ranks take part")
            if error:
                raise error
            diff = float((flat(mine.parameters()) - flat(ref.parameters())).abs().max())
            if diff > ATOL:
                return (f"{label}: after step {step + 1} the parameters differ from DDP's over the group (largest "
                        f"difference {diff:.3g}): step() must reduce-scatter and all-gather over self.group, with the "
                        "group's W and rank")
        return None
    finally:
        c.kw = {}
        del ref   # gloo: a live DDP model can abort the exit


def case_zero_on_groups(c, stage):
    """The ZeRO case (zerocase.case_zero), then at W = 4 the same ZeroOptimizer on a sub-group."""
    result = case_zero(c, stage)
    if c.world == 2 * HALF:
        c.agree_or_fail(group_problem(c, stage, c.collectives()))
    return result
