"""Step 3's view of a rank's loaders (``datahooks`` records them): which one it trained on, and why the ranks' shares
of it may disagree (``steps.step3`` judges them).
"""


def train_loader(rec: dict):
    """The loader the rank trained on: the one with the most optimizer steps (then the largest data set). Loaders
    built anew each epoch on the same data set (a new DistributedSampler and DataLoader per epoch) count as one, their
    iterations its epochs; the rank's ``set_epoch`` calls come with it."""
    loaders = list(rec.get("loaders", {}).values())
    if not loaders:
        return None
    trained = [ld for ld in loaders if _steps(ld) > 0]
    merged: dict = {}
    for ld in trained:   # in the order of their first iteration
        key = ld.get("dataset", id(ld))
        if key in merged:
            merged[key] = {**merged[key], "iters": merged[key]["iters"] + ld["iters"]}
        else:
            merged[key] = ld
    best = max(list(merged.values()) or loaders, key=lambda ld: (_steps(ld), ld["dataset_len"] or 0))
    return {**best, "set_epoch": rec.get("set_epoch", [])}


def _steps(loader: dict) -> int:
    return sum(it["steps"] for it in loader["iters"])


def set_epoch_differs(loaders: list) -> str | None:
    """The ranks' DistributedSamplers were told different epochs (set_epoch on some ranks only): in words, else None."""
    if any(ld.get("sampler") != "DistributedSampler" for ld in loaders):
        return None
    calls = [ld.get("set_epoch", []) for ld in loaders]
    if all(c == calls[0] for c in calls):
        return None
    callers = [r for r, c in enumerate(calls) if c]
    never = [r for r, c in enumerate(calls) if not c]
    if never:
        told = (f"rank{'s' if len(never) > 1 else ''} {', '.join(map(str, never))} never called set_epoch (rank "
                f"{callers[0]} called it with {calls[callers[0]]})")
    else:
        told = "the ranks called set_epoch with different epochs (" + "; ".join(
            f"rank {r}: {c}" for r, c in enumerate(calls)) + ")"
    return (f"{told}: a DistributedSampler shuffles with seed + epoch, so ranks at different epochs take their shares "
            "of different permutations, and the shares overlap. Call train_sampler.set_epoch(epoch) on every rank, "
            "with the same epoch")


COMBINING = ("all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "gather", "all_gather_object",
             "reduce_scatter", "reduce_scatter_tensor")


def combined(collectives: dict) -> int:
    """How many calls to the collectives that combine the ranks' values a rank's record counts (barriers do not)."""
    return sum(collectives.get(name, 0) for name in COMBINING)


def test_shards(records: list) -> str | None:
    """Step 3's failure when the ranks evaluated disjoint shares of a data set they did not train on (the test
    loader with a DistributedSampler) and no rank combined anything from that loop to the next: each printed its
    share's loss and accuracy."""
    n = len(records)
    for key, first in (records[0].get("loaders") or {}).items():
        loaders = [(r.get("loaders") or {}).get(key) for r in records]
        if any(ld is None or not ld["iters"] or any(it["steps"] for it in ld["iters"]) for ld in loaders):
            continue
        shards = [set(ld["iters"][0]["indices"]) for ld in loaders]
        size = first.get("dataset_len") or 0
        if not all(0 < len(s) < size for s in shards) or len(set().union(*shards)) <= max(map(len, shards)):
            continue   # every rank saw all of it (or the same part): nothing to combine
        if any(_combined_after(rec, ld["iters"][0]) for rec, ld in zip(records, loaders)):
            continue
        sizes = "+".join(str(len(s)) for s in shards)
        return (f"the ranks evaluated different shares of the {size} test images ({sizes}, a "
                f"{first.get('sampler')} on the test DataLoader), and no rank combined the results: no all_reduce "
                "or all_gather from the test loop until the next epoch. Each rank prints the test loss and accuracy "
                f"of its share alone, and a test() that divides by len(test_loader.dataset), all {size}, reports "
                f"about 1/{n} of the accuracy. Evaluate the whole test set on every rank (a DataLoader without a "
                "sampler, as the serial script does), or all_reduce the summed loss and the correct count, then "
                "divide by the test set's size.")
    return None


def _combined_after(rec: dict, entry: dict) -> bool:
    """The rank combined values between the start of the iteration ``entry`` and the start of its next one (or the
    end of its record)."""
    later = [it for ld in (rec.get("loaders") or {}).values() for it in ld["iters"]
             if it.get("seq", 0) > entry.get("seq", 0)]
    until = min(later, key=lambda it: it["seq"])["combined"] if later else combined(rec.get("collectives", {}))
    return until > entry.get("combined", 0)
