"""Cases for the rank grid: ``rank_groups`` (pure Python, one process) and ``init_rank_groups`` (4 ranks)."""
from course_lib.checking.case import Fail
from course_lib.tp.grid import rank_group_cases, reference_rank_groups


def case_rank_groups(c):
    """rank_groups (pure Python) on every combination of rank_group_cases, against the reference grid."""
    cases = rank_group_cases()
    fn = c.need("rank_groups")
    diagnose_grids([(case, check_one_grid(fn, *case)) for case in cases])
    return (f"{len(cases)} (world, tp, dp, cp, pp, order) combinations match Megatron's RankGenerator, including "
            "orders where dp varies fastest")


def _canon(groups):
    return sorted(sorted(int(r) for r in g) for g in groups)


def _call(world, tp, dp, cp, pp, order):
    return f"rank_groups({world}, tp={tp}, dp={dp}, cp={cp}, pp={pp}, order={order!r})"


def _check_partition(call, kind, size, world, groups):
    """Each rank once in the groups of one kind, every group of the kind's size."""
    seen = sorted(r for g in groups for r in g)
    if seen != list(range(world)):
        extra = sorted({r for r in seen if seen.count(r) > 1})
        lost = sorted(set(range(world)) - set(seen))
        raise Fail(f"{call}: the {kind} groups must hold every rank exactly once "
                   f"({f'ranks {extra} appear twice' if extra else ''}{'; ' if extra and lost else ''}"
                   f"{f'ranks {lost} are missing' if lost else ''}); got {groups}")
    if any(len(g) != size for g in groups):
        raise Fail(f"{call}: every {kind} group must have {kind}={size} ranks; got {groups}")


def check_one_grid(fn, world, tp, dp, cp, pp, order):
    """The learner's grid for one combination, after the checks of its form (each rank once per kind, sizes)."""
    call = _call(world, tp, dp, cp, pp, order)
    sizes = {"tp": tp, "dp": dp, "cp": cp, "pp": pp}
    try:
        got = fn(world, tp=tp, dp=dp, cp=cp, pp=pp, order=order)
    except NotImplementedError:
        raise Fail("not written yet: rank_groups raises NotImplementedError") from None
    except Exception as e:
        raise Fail(f"{call} raised {type(e).__name__}: {e}") from e
    if not isinstance(got, dict) or not set(sizes) <= set(got):
        raise Fail(f"{call} must return a dict with keys 'tp', 'dp', 'cp', 'pp' (lists of rank lists); "
                   f"got {got!r:.200}")
    for kind, size in sizes.items():
        try:
            groups = [[int(r) for r in g] for g in got[kind]]
        except TypeError:
            raise Fail(f"{call}[{kind!r}] must be a list of lists of ranks; got {got[kind]!r:.200}") from None
        _check_partition(call, kind, size, world, groups)
    return {kind: _canon(got[kind]) for kind in sizes}


def diagnose_grids(results):
    """Compare every grid with the reference; name the mistake that explains ALL the differences, if one does."""
    def matches(got, args, order):
        want = reference_rank_groups(args[0], tp=args[1], dp=args[2], cp=args[3], pp=args[4], order=order)
        return all(got[k] == _canon(want[k]) for k in got)

    def reverse(order):
        return "-".join(reversed(order.split("-")))

    wrong = [(args, got) for args, got in results if not matches(got, args, args[5])]
    if not wrong:
        return
    args, got = wrong[0]
    want = reference_rank_groups(args[0], tp=args[1], dp=args[2], cp=args[3], pp=args[4], order=args[5])
    kind = next(k for k in got if got[k] != _canon(want[k]))
    example = f"{_call(*args)}: {kind} groups are {got[kind]}, expected {want[kind]}"
    if all(matches(got, a, reverse(a[5])) for a, got in wrong):
        raise Fail(f"in your grid the LAST name of order varies fastest; in Megatron's RankGenerator the FIRST does "
                   f"(with 'tp-cp-pp-dp', tp neighbours are consecutive ranks). {example}")
    if all(matches(got, a, "tp-cp-pp-dp") for a, got in results):
        raise Fail(f"the order argument is ignored (every grid is the default 'tp-cp-pp-dp' one). {example}")
    raise Fail(f"{example} (a {kind} group = the ranks that differ only in their {kind} coordinate; the first "
               f"name of order varies fastest)")


def _check_rank_group(call, kind, group, want, rank):
    """``group`` is a process group holding exactly the ranks ``want``, the same on every rank."""
    import torch
    import torch.distributed as dist
    try:
        got = sorted(dist.get_process_group_ranks(group))
    except Exception as e:
        raise Fail(f"{call}[{kind!r}] is not a process group of dist.new_group ({type(e).__name__}: {e})") from e
    if got != want:
        raise Fail(f"{call}: rank {rank}'s {kind} group holds ranks {got}, expected {want}")
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=group)
    if t.item() != sum(want):
        raise Fail(f"{call}: an all-reduce in rank {rank}'s {kind} group summed {t.item():g}, expected "
                   f"{sum(want)} (the groups were not created the same way on every rank)")


def case_init_groups(c):
    import torch.distributed as dist
    fn = c.need("init_rank_groups")
    world, rank = dist.get_world_size(), dist.get_rank()
    for sizes, order in (({"tp": 2, "dp": world // 2}, "tp-cp-pp-dp"), ({"tp": 2, "dp": world // 2}, "dp-tp-cp-pp")):
        call = f"init_rank_groups(tp={sizes['tp']}, dp={sizes['dp']}, order={order!r})"
        groups = fn(order=order, **sizes)
        if not isinstance(groups, dict) or not {"tp", "dp"} <= set(groups):
            raise Fail(f"{call} must return a dict with this rank's groups under 'tp', 'dp', 'cp', 'pp'; "
                       f"got {groups!r:.200}")
        grid = reference_rank_groups(world, order=order, **sizes)
        for kind in ("tp", "dp", "cp", "pp"):
            if kind not in groups:
                raise Fail(f"{call}: no {kind!r} group for rank {rank} (cp=pp=1 still has groups: one rank each)")
            _check_rank_group(call, kind, groups[kind], next(g for g in grid[kind] if rank in g), rank)
