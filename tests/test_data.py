"""Data readers on good and broken files, the digits fallback, and the opt-in download."""
import gzip
import hashlib
import http.server
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from course_lib import data


def write_idx(path: Path, array: np.ndarray, magic: int, gz: bool = False, cut: int = 0):
    raw = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape) + array.tobytes()
    raw = raw[: len(raw) - cut] if cut else raw
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wb") as f:
            f.write(raw)
    else:
        path.write_bytes(raw)
    return path


def stage_mnist(root: Path, n_train=12, n_test=5, gz=False, sub="MNIST"):
    """A small but well-formed MNIST in torchvision's layout; labels are i % 10."""
    raw = root / sub / "raw"
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("test", n_test)):
        img_stem, lbl_stem = data.FILES[split]
        write_idx(raw / img_stem, rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), data.IMAGES_MAGIC, gz)
        write_idx(raw / lbl_stem, (np.arange(n) % 10).astype(np.uint8), data.LABELS_MAGIC, gz)
    return raw


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
def test_reads_mnist_in_torchvision_layout(tmp_path, gz):
    stage_mnist(tmp_path, gz=gz)
    train, test = data.load_dataset("mnist", tmp_path)
    assert (len(train), len(test)) == (12, 5)
    img, label = train[3]
    assert img.shape == (1, 28, 28) and img.dtype == torch.float32
    assert label.item() == 3 and train.targets.dtype == torch.int64
    # normalised with MNIST's mean/std: pixel 0 maps to -mean/std
    assert train.images.min().item() == pytest.approx(-0.1307 / 0.3081, abs=1e-5)


def test_auto_prefers_mnist_and_falls_back_to_digits(tmp_path, capsys):
    train, _ = data.load_dataset("auto", tmp_path)
    assert train.name == "digits"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "falling back to 'digits'" in err[0]
    stage_mnist(tmp_path)
    train, _ = data.load_dataset("auto", tmp_path)
    assert train.name == "mnist" and len(train) == 12


def test_digits_is_28x28_fixed_split_and_learnable():
    train, test = data.load_dataset("digits")
    assert (len(train), len(test)) == (1438, 359)
    assert train.images.shape[1:] == (1, 28, 28)
    assert set(train.targets.tolist()) == set(range(10))
    again, _ = data.load_dataset("digits")
    assert torch.equal(train.targets, again.targets)          # the split is fixed
    # digits are drawn in the middle 20x20 like MNIST: the 4-pixel border is background
    background = train.images.min().item()
    assert torch.all(train.images[:, :, :4, :] == background)
    assert train.images[:, :, 4:24, 4:24].max() > background + 2


def test_digits_are_scikit_learns_without_importing_it(monkeypatch):
    """The bundled file read directly gives exactly load_digits(), in a process that never imports sklearn;
    where the file is not found, load_digits() itself is used."""
    import importlib.util
    import subprocess
    import sys

    import numpy as np
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images, target = data.digits_8x8()
    assert np.array_equal(images, bunch.images) and np.array_equal(target, bunch.target)
    code = ("import sys; from course_lib import data; tr, te = data.load_dataset('digits'); "
            "print(len(tr), len(te), 'sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["1438", "359", "False"], out.stdout + out.stderr
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)   # the file cannot be found
    images, target = data.digits_8x8()
    assert np.array_equal(images, bunch.images) and np.array_equal(target, bunch.target)


@pytest.mark.parametrize("breakage, expect", [
    ("magic", "not an IDX images file"),
    ("truncated", "truncated or corrupt"),
    ("mismatch", "do not belong together"),
    ("tiny", "truncated (3 bytes)"),
    ("badgz", "cannot be read"),
])
def test_broken_files_give_one_clear_error(tmp_path, breakage, expect):
    raw = stage_mnist(tmp_path)
    images = raw / "train-images-idx3-ubyte"
    if breakage == "magic":
        write_idx(images, np.zeros((12, 28, 28), np.uint8), 0x0801)
    elif breakage == "truncated":
        write_idx(images, np.zeros((12, 28, 28), np.uint8), data.IMAGES_MAGIC, cut=100)
    elif breakage == "mismatch":
        write_idx(images, np.zeros((11, 28, 28), np.uint8), data.IMAGES_MAGIC)
    elif breakage == "tiny":
        images.write_bytes(b"\x00\x00\x08")
    elif breakage == "badgz":
        images.unlink()
        images.with_name(images.name + ".gz").write_bytes(b"this is not gzip data at all")
    with pytest.raises(data.DataError) as info:
        data.load_dataset("mnist", tmp_path)
    message = str(info.value)
    assert expect in message
    assert "train-images-idx3-ubyte" in message          # names the file
    assert "again" in message                            # and says what to do
    assert "\n" not in message


def test_missing_dataset_says_how_to_get_it(tmp_path):
    with pytest.raises(data.DataError, match="course download mnist"):
        data.load_dataset("mnist", tmp_path)
    with pytest.raises(data.DataError, match="unknown dataset"):
        data.load_dataset("cifar", tmp_path)


@pytest.mark.skipif(not data.DEBIAN_FASHION_DIR.is_dir(),
                    reason="Debian's dataset-fashion-mnist is not installed (make test installs it as root)")
def test_fashion_mnist_from_debian_package(tmp_path):
    train, test = data.load_dataset("fashion-mnist", tmp_path)
    assert (len(train), len(test)) == (60000, 10000)
    assert train.name == "fashion-mnist"
    assert torch.bincount(train.targets).tolist() == [6000] * 10


class _Files(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def file_server(tmp_path):
    """A real HTTP server on loopback serving tmp_path/www."""
    www = tmp_path / "www"
    www.mkdir()
    handler = lambda *a, **k: _Files(*a, directory=str(www), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield www, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_download_checks_sums_and_writes_atomically(tmp_path, file_server, monkeypatch):
    www, url = file_server
    stage_mnist(www, gz=True, sub=".")
    for f in (www / "raw").iterdir():
        f.rename(www / f.name)
    sums = {f.name: hashlib.md5(f.read_bytes()).hexdigest() for f in www.glob("*.gz")}
    monkeypatch.setitem(data.SOURCES, "mnist", ("MNIST", url, sums))
    folder = data.download_idx("mnist", tmp_path / "d")
    assert sorted(p.name for p in folder.iterdir()) == sorted(sums)
    assert len(data.load_dataset("mnist", tmp_path / "d")[0]) == 12

    # a corrupted file on the server: the download fails, and no file that looks complete is left behind
    target = folder / "train-labels-idx1-ubyte.gz"
    target.unlink()
    (www / "train-labels-idx1-ubyte.gz").write_bytes(b"garbage")
    with pytest.raises(data.DataError, match="checksum"):
        data.download_idx("mnist", tmp_path / "d")
    assert sorted(p.name for p in folder.iterdir()) == sorted(set(sums) - {target.name})
