"""The rank grid of the tensor-parallel exercise: Megatron's RankGenerator, written out independently, and the
combinations ``course check tp`` tries ``rank_groups`` on."""
import math
from itertools import permutations


def reference_rank_groups(world_size, tp=1, dp=1, cp=1, pp=1, order="tp-cp-pp-dp"):
    """Megatron-LM's RankGenerator (megatron/core/parallel_state.py), written out independently: each rank has a
    coordinate per name of ``order`` (the first name fastest); a group of kind k holds the ranks whose coordinates
    agree except along k. Names of size 1 may be missing from ``order``."""
    import numpy as np
    sizes = {"tp": tp, "dp": dp, "cp": cp, "pp": pp}
    names = order.lower().split("-")
    names += [n for n in sizes if n not in names]
    assert math.prod(sizes[n] for n in names) == world_size, (world_size, sizes)
    grid = np.arange(world_size).reshape([sizes[n] for n in reversed(names)])   # the first name: the last axis
    return {k: np.moveaxis(grid, len(names) - 1 - names.index(k), -1).reshape(-1, sizes[k]).tolist() for k in sizes}


def rank_group_cases():
    """(world, tp, dp, cp, pp, order) combinations: small grids, every order of 4 names, dp fastest, names left out."""
    cases = [(1, 1, 1, 1, 1, "tp-cp-pp-dp"), (8, 4, 2, 1, 1, "tp-cp-pp-dp"), (8, 2, 4, 1, 1, "tp-cp-pp-dp"),
             (4, 2, 2, 1, 1, "tp-dp"), (4, 2, 2, 1, 1, "dp-tp"), (8, 2, 4, 1, 1, "dp-tp"),
             (6, 2, 3, 1, 1, "tp-cp-pp-dp"), (6, 3, 2, 1, 1, "dp-tp-cp-pp"), (12, 2, 3, 2, 1, "tp-cp-pp-dp"),
             (2, 1, 1, 2, 1, "tp-cp-pp-dp"), (2, 1, 1, 1, 2, "pp-tp-cp-dp"), (4, 1, 2, 1, 2, "tp-cp-dp-pp")]
    for order in permutations(["tp", "cp", "pp", "dp"]):
        cases.append((16, 2, 2, 2, 2, "-".join(order)))
        cases.append((24, 2, 3, 1, 4, "-".join(order)))
        cases.append((24, 4, 2, 3, 1, "-".join(order)))
    return cases
