"""Datasets for the course, held in memory as normalised tensors.

No torchvision here, so MNIST's IDX files are read directly, in torchvision's folder layout
(``<data-dir>/MNIST/raw/*-ubyte[.gz]``), which means a pre-staged torchvision download is found.
Three data sets:

- ``mnist``: 60,000 + 10,000 handwritten digits (IDX files; ``download_idx`` fetches them on request);
- ``fashion-mnist``: the same format; Debian's ``dataset-fashion-mnist`` puts it in /usr/share/datasets;
- ``digits``: scikit-learn's bundled 1,797 real handwritten 8x8 digits, upsampled to 28x28. Always there.

``load_dataset("auto")`` takes MNIST when it is present, else says so in one line and uses ``digits``.
Every problem with a file raises ``DataError`` with one message that names the file and the fix.
"""
import functools
import gzip
import hashlib
import os
import sys
import urllib.request
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from course_lib.core.atomic import atomic_writer

DATASETS = ("auto", "mnist", "fashion-mnist", "digits")
DEBIAN_FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")

# Mean and std of the training pixels in [0, 1]: the usual MNIST normalisation, per data set.
STATS = {"mnist": (0.1307, 0.3081), "fashion-mnist": (0.2860, 0.3530), "digits": (0.1307, 0.3081)}

# IDX files and the MD5 sums of the published .gz files (the ones torchvision checks).
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
SOURCES = {
    "mnist": ("MNIST", "https://ossci-datasets.s3.amazonaws.com/mnist/", {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    }),
    "fashion-mnist": ("FashionMNIST", "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/", {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    }),
}
IMAGES_MAGIC, LABELS_MAGIC = 0x00000803, 0x00000801


class DataError(RuntimeError):
    """A data file is missing, corrupt or does not match its partner; the message says what to do."""


def default_data_dir() -> Path:
    """``$COURSE_DATA_DIR``, else ~/.cache/multigpu-course/data (absolute, so jobs find it from any folder)."""
    return Path(os.environ.get("COURSE_DATA_DIR") or Path.home() / ".cache" / "multigpu-course" / "data")


class InMemoryDataset(Dataset):
    """Images ``[N, 1, 28, 28]`` (float32, normalised) and integer labels ``[N]``, all in memory."""

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, name: str, split: str):
        assert len(images) == len(targets)
        self.images, self.targets, self.name, self.split = images, targets, name, split

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index):
        return self.images[index], self.targets[index]

    def __repr__(self) -> str:
        return f"InMemoryDataset({self.name}/{self.split}, {len(self)} images)"


# ----------------------------------------------------------------------------- IDX files
def _find(folder: Path, stem: str) -> Path | None:
    return next((folder / n for n in (stem, stem + ".gz") if (folder / n).is_file()), None)


def _read_bytes(path: Path) -> bytes:
    try:
        return gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"{path}: cannot be read ({e}); delete it and stage or download it again") from None


def read_idx(path: Path, expect_magic: int) -> np.ndarray:
    """Read one IDX file (raw or .gz) into a uint8 array, checking its magic number and size."""
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 8:
        raise DataError(f"{path}: truncated ({len(raw)} bytes); delete it and stage or download it again")
    magic = int.from_bytes(raw[:4], "big")
    if magic != expect_magic:
        kind = "images" if expect_magic == IMAGES_MAGIC else "labels"
        raise DataError(f"{path}: not an IDX {kind} file (magic 0x{magic:08x}, expected 0x{expect_magic:08x});"
                        " the file is corrupt or misnamed: delete it and stage or download it again")
    ndim = raw[3]
    header = 4 + 4 * ndim
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    expected = header + int(np.prod(dims))
    if len(raw) != expected:
        raise DataError(f"{path}: {len(raw)} bytes, but its header {dims} needs {expected}: the file is "
                        "truncated or corrupt; delete it and stage or download it again")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def idx_folder(name: str, data_dir: Path) -> Path | None:
    """The folder holding ``name``'s IDX files, or None. Looks in torchvision's layout, then system paths."""
    sub = SOURCES[name][0]
    candidates = [Path(data_dir) / sub / "raw", Path(data_dir) / sub, Path(data_dir)]
    if name == "fashion-mnist":
        candidates.append(DEBIAN_FASHION_DIR)
    for folder in candidates:
        if all(_find(folder, stem) for stems in FILES.values() for stem in stems):
            return folder
    return None


def load_idx_split(folder: Path, name: str, split: str) -> InMemoryDataset:
    img_path, lbl_path = (_find(folder, stem) for stem in FILES[split])
    images = read_idx(img_path, IMAGES_MAGIC)
    labels = read_idx(lbl_path, LABELS_MAGIC)
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DataError(f"{img_path}: images are {images.shape[1:]}, expected 28x28; stage the right file")
    if len(images) != len(labels):
        raise DataError(f"{img_path} has {len(images)} images but {lbl_path} has {len(labels)} labels: "
                        "the two files do not belong together; stage both again")
    if labels.max(initial=0) > 9:
        raise DataError(f"{lbl_path}: labels outside 0..9; the file is corrupt: stage it again")
    return _as_dataset(images.astype(np.float32) / 255.0, labels, name, split)


def _as_dataset(pixels01: np.ndarray, labels: np.ndarray, name: str, split: str) -> InMemoryDataset:
    mean, std = STATS[name]
    images = (torch.from_numpy(np.ascontiguousarray(pixels01)).unsqueeze(1) - mean) / std
    return InMemoryDataset(images.float().contiguous(), torch.from_numpy(labels.astype(np.int64)), name, split)


# ----------------------------------------------------------------------------- digits
DIGITS_TEST_FRACTION = 0.2


def digits_8x8() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits: images [1797, 8, 8] (0..16) and labels [1797].

    The file scikit-learn's ``load_digits`` reads, read the same way without importing scikit-learn (that
    import costs a second of CPU in every rank that loads the data); ``load_digits`` where the file has moved."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")   # finds the package without running it
    folders = (spec.submodule_search_locations or []) if spec else []
    csv = Path(next(iter(folders), "/nonexistent")) / "datasets" / "data" / "digits.csv.gz"
    if not csv.is_file():
        from sklearn.datasets import load_digits
        bunch = load_digits()
        return bunch.images, bunch.target
    data = np.loadtxt(csv, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


@functools.cache   # once per process: train and test are cut from the same upsampled set
def _digits_28x28() -> tuple[np.ndarray, np.ndarray]:
    images, target = digits_8x8()
    pixels = torch.from_numpy(images.astype(np.float32) / 16.0).unsqueeze(1)   # [N,1,8,8] in [0,1]
    pixels = torch.nn.functional.interpolate(pixels, size=(20, 20), mode="bilinear", align_corners=False)
    return torch.nn.functional.pad(pixels, (4, 4, 4, 4)).clamp_(0, 1).squeeze(1).numpy(), target


def load_digits_split(split: str) -> InMemoryDataset:
    """scikit-learn's 8x8 digits drawn as MNIST draws digits: 20x20 in the middle of a 28x28 frame."""
    pixels, target = _digits_28x28()
    order = np.random.default_rng(0).permutation(len(pixels))   # a fixed split, the same everywhere
    n_test = int(len(order) * DIGITS_TEST_FRACTION)
    idx = order[n_test:] if split == "train" else order[:n_test]
    return _as_dataset(pixels[idx], target[idx], "digits", split)


# ----------------------------------------------------------------------------- entry point
def resolve(name: str, data_dir: Path | str | None = None, quiet: bool = False) -> tuple[str, Path | None]:
    """Which data set ``name`` means here, and the folder of its files (None for digits)."""
    if name not in DATASETS:
        raise DataError(f"unknown dataset '{name}': choose one of {', '.join(DATASETS)}")
    data_dir = Path(data_dir) if data_dir else default_data_dir()
    if name == "digits":
        return "digits", None
    folder = idx_folder("mnist" if name == "auto" else name, data_dir)
    if folder is not None:
        return ("mnist" if name == "auto" else name), folder
    if name == "auto":
        if not quiet:
            print(f"[data] no MNIST in {data_dir}; falling back to 'digits' (1,797 small real digits, "
                  "bundled with scikit-learn)", file=sys.stderr, flush=True)
        return "digits", None
    hint = ("apt-get install dataset-fashion-mnist, or " if name == "fashion-mnist" else "")
    raise DataError(f"no {name} IDX files in {data_dir}/{SOURCES[name][0]}/raw: {hint}run "
                    f"`course download {name} --data-dir {data_dir}` where there is internet, "
                    "or use --dataset digits")


def load_dataset(name: str = "auto", data_dir: Path | str | None = None, quiet: bool = False
                 ) -> tuple[InMemoryDataset, InMemoryDataset]:
    """(train, test) for ``name`` in DATASETS; raises DataError with a message a learner can act on."""
    name, folder = resolve(name, data_dir, quiet)
    if name == "digits":
        return load_digits_split("train"), load_digits_split("test")
    return load_idx_split(folder, name, "train"), load_idx_split(folder, name, "test")


# ----------------------------------------------------------------------------- opt-in download
def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_idx(name: str, data_dir: Path | str | None = None, base_url: str | None = None) -> Path:
    """Fetch ``name``'s four .gz files into torchvision's layout, checking each MD5 sum.

    Each file is written to a temporary name and renamed only once its checksum matches, so an
    interrupted or corrupted download never leaves a file that looks complete.
    """
    sub, url, md5s = SOURCES[name]
    folder = Path(data_dir or default_data_dir()) / sub / "raw"
    folder.mkdir(parents=True, exist_ok=True)
    for fname, md5 in md5s.items():
        target = folder / fname
        if not (target.is_file() and _md5(target) == md5):
            _fetch((base_url or url) + fname, target, md5)
    return folder


def _fetch(url: str, target: Path, md5: str) -> None:
    """``url`` into ``target``, which appears only if the MD5 sum of what came is ``md5``."""
    try:
        with atomic_writer(target, "wb") as out, urllib.request.urlopen(url, timeout=60) as r:
            digest = hashlib.md5(usedforsecurity=False)
            for block in iter(lambda: r.read(1 << 20), b""):
                out.write(block)
                digest.update(block)
            if digest.hexdigest() != md5:
                raise DataError(f"{target.name}: checksum {digest.hexdigest()} does not match {md5}; "
                                "the download is corrupt, try again")
    except OSError as e:
        raise DataError(f"downloading {url} failed ({e}); check the network or "
                        f"stage the files in {target.parent} by hand") from None
