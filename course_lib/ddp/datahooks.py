"""The probe's hooks for Step 3 (data): every index each DataLoader iteration hands out (the sampler's
whole epoch), ``set_epoch`` calls, DataLoader errors (``shuffle=True`` with a sampler); and the ``digits`` data set
as ``SUBSET``, a small subset made when this module is imported."""
import itertools

from course_lib.ddp.datajudge import combined
from course_lib.ddp.recorder import Recorder, called, describe

MAX_INDICES = 1_000_000     # a sampler longer than this is recorded only in part (an infinite sampler)
TRAIN_IMAGES, TEST_IMAGES = 128, 64     # the digits subset each check trains on: seconds, not minutes


def _first_digits() -> dict:
    """split -> (images, targets): the first TRAIN_IMAGES / TEST_IMAGES of the ``digits`` splits."""
    from course_lib.data import load_digits_split
    subset = {}
    for split, n in (("train", TRAIN_IMAGES), ("test", TEST_IMAGES)):
        ds = load_digits_split(split)
        subset[split] = (ds.images[:n].clone(), ds.targets[:n].clone())
    return subset


# made once, at import: the check's fork server imports this module before it forks the ranks (ddp.check's PRELOAD),
# so no rank makes it again, and the checker's own process (which never imports this module) imports no torch
SUBSET = _first_digits()


def install(rec: Recorder):
    _hook_iterations(rec)
    _note_loader_errors(rec)
    _note_sampler(rec)
    _subset()


def _int_or_none(value):
    return value if isinstance(value, int) else None


def _take_epoch(it) -> list:
    """Every index the iterator's sampler will hand out this epoch; the iterator then replays them."""
    batches, flat = [], []
    source = it._sampler_iter
    try:
        for item in source:
            batches.append(item)
            flat.extend(item if isinstance(item, (list, tuple)) else [item])
            if len(flat) >= MAX_INDICES:
                break
    finally:
        it._sampler_iter = itertools.chain(batches, source)
    try:
        return [int(i) for i in flat]
    except (TypeError, ValueError):
        return []


def _in_base(dataset, indices: list):
    """(the data set under any ``Subset``s, ``indices`` as its own): a static shard (``Subset(train_set,
    range(rank, N, W))``) is judged by the images it holds, not by its positions 0..len-1."""
    import torch.utils.data as tud

    try:
        while isinstance(dataset, tud.Subset):
            indices, dataset = [int(dataset.indices[i]) for i in indices], dataset.dataset
    except (TypeError, ValueError, IndexError):
        return dataset, []   # odd indices: none recorded, no verdict from them
    return dataset, indices


def _described(loader, base) -> dict:
    """A loader's record, but for its iterations: the size of the data set under it and its sampler."""
    try:
        n = len(base)
    except TypeError:
        n = None
    return {"dataset_len": n, "sampler": type(loader.sampler).__name__,
            # a DistributedSampler's share: node-local numbers are right on one node only
            "replicas": _int_or_none(getattr(loader.sampler, "num_replicas", None)),
            "sampler_rank": _int_or_none(getattr(loader.sampler, "rank", None)),
            "sampler_seed": _int_or_none(getattr(loader.sampler, "seed", None))}


def _hook_iterations(rec: Recorder):
    """Each iteration over a DataLoader: its indices at the start, its batches, its end (the epoch's params)."""
    import torch.utils.data as tud
    from torch.utils.data import dataloader as dl

    numbers = {}   # id(loader) -> its key in the record: "0", "1", ... in the order of their first iteration
    datasets = {}  # id(base data set) -> (its number, the data set): held, so that no other one gets its id

    def record_epoch(it, loader):
        """Materialise this iteration's indices (the sampler's whole epoch) and note them under its loader's key."""
        if isinstance(loader.dataset, tud.IterableDataset):
            return   # no indices to record: the data set yields the samples itself
        base, indices = _in_base(loader.dataset, _take_epoch(it))
        # its place among the rank's iterations, and the collectives that combine values made so far: what the
        # ranks combined after a test loop (``datajudge.test_shards``)
        rec.data["iterations"] = rec.data.get("iterations", 0) + 1
        entry = {"indices": indices, "steps": 0, "done": False, "seq": rec.data["iterations"],
                 "combined": combined(rec.data["collectives"])}
        key = numbers.setdefault(id(loader), str(len(numbers)))
        if key not in rec.data["loaders"]:
            # a loader built anew each epoch on the same data set continues its epochs (``ddp.datajudge``)
            number = datasets.setdefault(id(base), (len(datasets), base))[0]
            rec.data["loaders"][key] = {"dataset": number, **_described(loader, base), "iters": []}
        rec.data["loaders"][key]["iters"].append(entry)
        it._course_probe_entry = entry
        rec.write()

    base = dl._BaseDataLoaderIter
    base_init, base_reset, base_next = base.__init__, base._reset, base.__next__

    def recording(start):   # an iteration's start (__init__, or _reset of a persistent-workers iterator)
        def started(self, loader, *args, **kwargs):
            start(self, loader, *args, **kwargs)
            record_epoch(self, loader)
        return started

    def next_(self):
        entry = getattr(self, "_course_probe_entry", None)
        try:
            batch = base_next(self)
        except StopIteration:
            if entry is not None and not entry["done"]:
                entry["done"] = True
                rec.current_iter = None
                rec.write_params()
                rec.write()
            raise
        if entry is not None:
            rec.current_iter = entry
        return batch

    base.__init__, base._reset, base.__next__ = recording(base_init), recording(base_reset), next_


def _note_loader_errors(rec: Recorder):
    """A DataLoader that refuses its arguments (shuffle=True with a sampler) leaves its error in the record."""
    import torch.utils.data as tud

    dl_init = tud.DataLoader.__init__

    def loader_init(self, *args, **kwargs):
        try:
            dl_init(self, *args, **kwargs)
        except BaseException as e:
            sampler = {**dict(zip(("dataset", "batch_size", "shuffle", "sampler"), args)), **kwargs}.get("sampler")
            rec.data["loader_errors"].append({"sampler": None if sampler is None else type(sampler).__name__,
                                              "error": describe(e)})
            rec.data["error_in"] = {"call": "DataLoader", "step": 3, "error": describe(e)}
            rec.write()
            raise

    tud.DataLoader.__init__ = loader_init


def _note_sampler(rec: Recorder):
    from torch.utils.data.distributed import DistributedSampler

    def note_epoch(self, epoch, *args, **kwargs):
        rec.data["set_epoch"].append(int(epoch) if isinstance(epoch, int) else repr(epoch))

    DistributedSampler.set_epoch = called("set_epoch", DistributedSampler.set_epoch, rec, note_epoch)
    DistributedSampler.__init__ = called("DistributedSampler", DistributedSampler.__init__, rec)


def _subset():
    """The script's ``digits`` is ``SUBSET``: the same few images on every rank."""
    import course_lib.data as data

    def load_digits_split(split: str):
        images, targets = SUBSET[split]
        return data.InMemoryDataset(images, targets, "digits", split)

    data.load_digits_split = load_digits_split
