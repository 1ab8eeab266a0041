"""fl.datasets: the embedded digits split and the torchvision loaders on tiny real-format files.

The torchvision files are written here in their real on-disk formats (idx ubyte, CIFAR
python pickles, SVHN .mat) and read back through torchvision's own dataset classes. The
only thing bypassed is the md5 check of CIFAR/SVHN files (their checksums are those of
the official full files, which a tiny test file cannot match): ``check_integrity`` in the
torchvision cifar/svhn modules is replaced by a plain existence check.
"""
from __future__ import annotations

import os
import pickle
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
import torchvision.datasets.cifar
import torchvision.datasets.svhn

import fl
from fl.datasets import DATASETS, NORMALIZATION, canonical_name, load_dataset
from landscape import ConfigError, DataError

from fault_counts import tally

RNG = np.random.default_rng(1234)


def _expected(pixels_nchw: np.ndarray, key: str) -> torch.Tensor:
    mean, std = (np.asarray(v, dtype=np.float64).reshape(1, -1, 1, 1) for v in NORMALIZATION[key])
    return torch.from_numpy(((pixels_nchw / 255.0 - mean) / std).astype(np.float32))


@pytest.fixture
def skip_md5(monkeypatch):
    """Replace the md5 comparison (only) by an existence check in the CIFAR/SVHN modules."""
    def exists(fpath, md5=None):
        return os.path.isfile(fpath)
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", exists)
    monkeypatch.setattr(torchvision.datasets.svhn, "check_integrity", exists)


# ---------------------------------------------------------------- digits

def test_digits_shapes_range_and_classes():
    from sklearn.datasets import load_digits

    b = load_dataset("digits")
    assert b.name == "digits" and b.num_classes == 10 and b.input_shape == (1, 8, 8)
    assert b.train_x.dtype == torch.float32 and b.train_y.dtype == torch.int64
    assert len(b.train_y) + len(b.test_y) == 1797 and len(b.test_y) == 360
    assert float(b.train_x.min()) == 0.0 and float(b.train_x.max()) == 1.0
    # the split is a partition of the full data set: same multiset of (image, label) rows
    raw = load_digits()
    full = np.concatenate([raw.images.reshape(-1, 64) / 16.0, raw.target[:, None]], axis=1)
    ours = np.concatenate([torch.cat([b.train_x, b.test_x]).reshape(-1, 64).double().numpy(),
                           torch.cat([b.train_y, b.test_y]).numpy()[:, None]], axis=1)
    np.testing.assert_allclose(full[np.lexsort(full.T[::-1])], ours[np.lexsort(ours.T[::-1])], atol=1e-7)


def test_bundle_datasets():
    b = load_dataset("digits")
    sub = b.train_dataset(np.array([5, 0, 7]))
    assert len(sub) == 3 and torch.equal(sub[1][0], b.train_x[0]) and sub[2][1] == b.train_y[7]
    assert len(b.train_dataset()) == len(b.train_y) and len(b.test_dataset()) == 360


def test_digits_split_is_stratified_and_fixed():
    a, b = load_dataset("digits"), load_dataset("digits")
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    n_class = torch.bincount(torch.cat([a.train_y, a.test_y]), minlength=10).numpy()
    n_test = torch.bincount(a.test_y, minlength=10).numpy()
    assert np.all(np.abs(n_test - 0.2 * n_class) <= 1)


def test_unknown_dataset_is_a_data_error():
    with pytest.raises(DataError, match="unknown dataset 'imagenet'.*digits"):
        load_dataset("imagenet")


@pytest.mark.parametrize("name, expected", [("mnist", "train-images-idx3-ubyte"),
                                            ("fashionmnist", "FashionMNIST"),
                                            ("cifar10", "data_batch_1"),
                                            ("cifar100", "cifar-100-python"),
                                            ("svhn", "train_32x32.mat")])
def test_missing_files_name_what_is_expected(tmp_path, name, expected):
    assert name in DATASETS
    with pytest.raises(DataError, match=rf"(?s){expected}.*download=True"):
        load_dataset(name, root=tmp_path)


def test_dataset_name_spellings():
    assert [canonical_name(n) for n in ("CIFAR-10", "Fashion_MNIST", "fmnist", "SVHN", "digits")] == \
        ["cifar10", "fashionmnist", "fashionmnist", "svhn", "digits"]
    assert set(map(canonical_name, DATASETS)) == set(DATASETS)


# ---------------------------------------------------------------- MNIST / Fashion-MNIST

def _write_idx(path: Path, array: np.ndarray) -> None:
    """Write the idx format: magic (0, 0, type 0x08 = ubyte, ndim), big-endian dims, raw bytes."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


@pytest.mark.parametrize("name, folder", [("mnist", "MNIST"), ("fashionmnist", "FashionMNIST")])
def test_mnist_like_real_format(tmp_path, name, folder):
    raw = tmp_path / folder / "raw"
    raw.mkdir(parents=True)
    data = {}
    for split, n in (("train", 6), ("t10k", 4)):
        images = RNG.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = RNG.integers(0, 10, size=n, dtype=np.uint8)
        _write_idx(raw / f"{split}-images-idx3-ubyte", images)
        _write_idx(raw / f"{split}-labels-idx1-ubyte", labels)
        data[split] = (images, labels)
    b = load_dataset(name.upper(), root=tmp_path)
    assert b.name == name and b.num_classes == 10 and b.input_shape == (1, 28, 28)
    for (images, labels), x, y in ((data["train"], b.train_x, b.train_y), (data["t10k"], b.test_x, b.test_y)):
        assert x.dtype == torch.float32 and y.dtype == torch.int64
        torch.testing.assert_close(x, _expected(images[:, None].astype(np.float64), name))
        assert y.tolist() == labels.tolist()
    # download=True with the files present reads them without fetching anything
    again = load_dataset(name, root=tmp_path, download=True)
    assert torch.equal(again.train_x, b.train_x)


def _idx_header(type_code: int, shape: tuple[int, ...]) -> bytes:
    return struct.pack(">BBBB", 0, 0, type_code, len(shape)) + struct.pack(f">{len(shape)}I", *shape)


def _mnist_folder(root: Path, train: int = 6, test: int = 4) -> tuple[Path, dict]:
    """The four idx files of a small MNIST under ``root/MNIST/raw``; the folder and the arrays."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    data = {}
    for split, n in (("train", train), ("t10k", test)):
        images = RNG.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = RNG.integers(0, 10, size=n, dtype=np.uint8)
        _write_idx(raw / f"{split}-images-idx3-ubyte", images)
        _write_idx(raw / f"{split}-labels-idx1-ubyte", labels)
        data[split] = (images, labels)
    return raw, data


IMAGES, LABELS = "train-images-idx3-ubyte", "train-labels-idx1-ubyte"


def _replace(raw: Path, name: str, content: bytes) -> None:
    (raw / name).write_bytes(content)


def _tail_off(raw: Path, name: str, n: int) -> None:
    (raw / name).write_bytes((raw / name).read_bytes()[:-n])


def _gzipped(raw: Path, name: str) -> None:
    import gzip

    (raw / name).write_bytes(gzip.compress((raw / name).read_bytes()))


# each case: what is done to a good folder, the file named, the words of the one-line error
HOSTILE_IDX = {
    "100 images, 90 labels": (lambda raw: (_write_idx(raw / IMAGES, np.zeros((100, 28, 28))),
                                           _write_idx(raw / LABELS, np.zeros(90))),
                              IMAGES, f"holds 100 images, but {{raw}}/{LABELS} holds 90 labels"),
    "label 200 of 10 classes": (lambda raw: _write_idx(raw / LABELS, np.array([0, 1, 200, 3, 4, 5])),
                                LABELS, "holds the label 200, but mnist labels are 0..9"),
    "gzip not unpacked": (lambda raw: _gzipped(raw, IMAGES), IMAGES, "is gzip-compressed; unpack it"),
    "wrong magic number": (lambda raw: _replace(raw, IMAGES, b"P5\n28 28\n255\n" + bytes(784)), IMAGES,
                           "is not an idx file (its magic number is 50350a32, not 00000803)"),
    "empty file": (lambda raw: _replace(raw, LABELS, b""), LABELS, "its magic number is missing"),
    "float32 elements": (lambda raw: _replace(raw, LABELS, _idx_header(0x0D, (6,)) + bytes(24)), LABELS,
                         "holds elements of type 0x0d, but mnist labels are unsigned bytes (0x08)"),
    "labels file as images": (lambda raw: _replace(raw, IMAGES, (raw / LABELS).read_bytes()), IMAGES,
                              "has 1 dimension, but mnist images files have 3; is it the labels file?"),
    "truncated header": (lambda raw: _replace(raw, IMAGES, _idx_header(0x08, (6, 28, 28))[:9]), IMAGES,
                         "is truncated within its header (9 bytes of 16)"),
    "32 x 32 images": (lambda raw: _write_idx(raw / IMAGES, np.zeros((6, 32, 32))), IMAGES,
                       "holds images of 32 x 32 pixels, but mnist images are 28 x 28"),
    "truncated data": (lambda raw: _tail_off(raw, IMAGES, 100), IMAGES,
                       "its header declares 6 images (4,704 bytes) but it holds 4,604 bytes after the header"),
    "bytes past the declared sizes": (lambda raw: _replace(raw, LABELS, (raw / LABELS).read_bytes() + b"\x07"),
                                      LABELS, "declares 6 labels (6 bytes) but it holds 7 bytes"),
    "no images": (lambda raw: (_write_idx(raw / IMAGES, np.zeros((0, 28, 28))), _write_idx(raw / LABELS, np.zeros(0))),
                  IMAGES, "holds no images; a data set needs at least one per split"),
    "a FIFO": (lambda raw: ((raw / LABELS).unlink(), os.mkfifo(raw / LABELS)), LABELS,
               "is a FIFO (named pipe), not a regular file"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_IDX))
def test_hostile_idx_files_are_refused_on_one_line_naming_the_file(tmp_path, case):
    """Each check of the idx format, on a real-format folder damaged one way.

    torchvision's own reader loads the first two cases (100 images with 90 labels; a label 200 of 10
    classes, which fails only in training, with an IndexError).
    """
    raw, _ = _mnist_folder(tmp_path)
    damage, name, words = HOSTILE_IDX[case]
    damage(raw)
    with pytest.raises(DataError) as info:
        load_dataset("mnist", root=tmp_path)
    message = str(info.value)
    assert message.startswith(f"{raw / name}: ") and words.format(raw=raw) in message and "\n" not in message
    tally("hostile files refused")


def test_an_out_of_range_label_stops_a_run_before_training(tmp_path):
    raw, _ = _mnist_folder(tmp_path, train=8)
    _write_idx(raw / LABELS, np.array([0, 1, 2, 3, 4, 5, 6, 200]))
    with pytest.raises(DataError, match=f"{raw / LABELS}: holds the label 200, but mnist labels are 0..9"):
        fl.run("fedavg", dataset="mnist", data_root=str(tmp_path), clients=2, rounds=1, out=tmp_path / "run",
               progress=False)
    assert not (tmp_path / "run" / "progress.json").exists()
    tally("hostile files refused")


class _Planted:
    """Unpickling this runs ``os.system``: what a hostile ``.pt`` file does."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _processed(root: Path, splits: dict[str, tuple]) -> Path:
    """The older MNIST cache of torchvision, ``MNIST/processed/{training,test}.pt``, as torch.save wrote it."""
    folder = root / "MNIST" / "processed"
    folder.mkdir(parents=True)
    for name, content in splits.items():
        torch.save(content, folder / name)
    return folder


def test_a_hostile_processed_file_is_refused_and_never_unpickled(tmp_path):
    marker = tmp_path / "code-ran"
    images, labels = torch.zeros(3, 28, 28, dtype=torch.uint8), torch.tensor([1, 2, 3])
    folder = _processed(tmp_path, {"training.pt": (images, _Planted(marker)), "test.pt": (images, labels)})
    with pytest.raises(DataError) as info:
        load_dataset("mnist", root=tmp_path)
    message = str(info.value)
    assert message.startswith(f"{folder / 'training.pt'}: is not a file of plain tensors (UnpicklingError: ")
    assert "GLOBAL posix.system" in message and "never unpickled" in message and f"delete {folder}" in message
    assert "weights_only" not in message and "\n" not in message and not marker.exists()
    tally("hostile files refused")


def test_processed_files_are_checked_like_idx_files(tmp_path):
    good = (torch.zeros(3, 28, 28, dtype=torch.uint8), torch.tensor([1, 2, 3]))
    cases = {"labels out of range": ((good[0], torch.tensor([1, 2, 10])), "holds the label 10"),
             "90 labels for 100 images": ((torch.zeros(100, 28, 28, dtype=torch.uint8), torch.zeros(90).long()),
                                          "holds 100 images but 90 labels"),
             "float images": ((good[0].float(), good[1]), "holds images torch.float32 (3, 28, 28)"),
             "a dict": ({"x": good[0]}, "holds dict, not the tensors (images, labels)")}
    for case, (content, words) in cases.items():
        root = tmp_path / case.replace(" ", "_")
        folder = _processed(root, {"training.pt": content, "test.pt": good})
        with pytest.raises(DataError, match=re.escape(words)) as info:
            load_dataset("mnist", root=root)
        assert str(info.value).startswith(f"{folder / 'training.pt'}: "), case
    tally("hostile files refused", len(cases))


def test_processed_files_still_load_and_idx_files_come_first(tmp_path):
    train = (torch.from_numpy(RNG.integers(0, 256, size=(5, 28, 28), dtype=np.uint8)), torch.tensor([0, 9, 3, 3, 1]))
    test = (torch.from_numpy(RNG.integers(0, 256, size=(2, 28, 28), dtype=np.uint8)), torch.tensor([4, 7]))
    _processed(tmp_path, {"training.pt": train, "test.pt": test})
    b = load_dataset("mnist", root=tmp_path)
    torch.testing.assert_close(b.train_x, _expected(train[0].numpy()[:, None].astype(np.float64), "mnist"))
    assert b.train_y.tolist() == [0, 9, 3, 3, 1] and b.test_y.tolist() == [4, 7]
    _, data = _mnist_folder(tmp_path)  # with all four idx files present, they are read instead
    assert load_dataset("mnist", root=tmp_path).train_y.tolist() == data["train"][1].tolist()


# ---------------------------------------------------------------- CIFAR-10 / CIFAR-100

def _pickle(path: Path, obj: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def test_cifar10_real_format(tmp_path, skip_md5):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rows, labels = [], []
    for i in range(1, 6):
        r = RNG.integers(0, 256, size=(2, 3072), dtype=np.uint8)
        y = [int(v) for v in RNG.integers(0, 10, size=2)]
        _pickle(folder / f"data_batch_{i}", {"data": r, "labels": y})
        rows.append(r)
        labels += y
    test_rows = RNG.integers(0, 256, size=(3, 3072), dtype=np.uint8)
    _pickle(folder / "test_batch", {"data": test_rows, "labels": [7, 0, 9]})
    _pickle(folder / "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})
    b = load_dataset("cifar10", root=tmp_path)
    assert b.num_classes == 10 and b.input_shape == (3, 32, 32)
    # a CIFAR row stores the red plane, then green, then blue, each row-major 32x32
    train = np.concatenate(rows).reshape(-1, 3, 32, 32).astype(np.float64)
    torch.testing.assert_close(b.train_x, _expected(train, "cifar10"))
    assert b.train_y.tolist() == labels and b.test_y.tolist() == [7, 0, 9]
    assert float(b.test_x[1, 2, 0, 5]) == pytest.approx(
        (test_rows[1, 2 * 1024 + 5] / 255 - 0.4465) / 0.2616, rel=1e-5)


def test_cifar100_real_format(tmp_path, skip_md5):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    train = RNG.integers(0, 256, size=(4, 3072), dtype=np.uint8)
    test = RNG.integers(0, 256, size=(2, 3072), dtype=np.uint8)
    _pickle(folder / "train", {"data": train, "fine_labels": [99, 0, 42, 5], "coarse_labels": [1, 2, 3, 4]})
    _pickle(folder / "test", {"data": test, "fine_labels": [3, 64], "coarse_labels": [0, 0]})
    _pickle(folder / "meta", {"fine_label_names": [f"f{i}" for i in range(100)]})
    b = load_dataset("cifar100", root=tmp_path)
    assert b.num_classes == 100
    assert b.train_y.tolist() == [99, 0, 42, 5] and b.test_y.tolist() == [3, 64]
    torch.testing.assert_close(b.test_x, _expected(test.reshape(-1, 3, 32, 32).astype(np.float64), "cifar100"))


def test_cifar_md5_check_is_kept_without_the_bypass(tmp_path):
    """Without the test bypass, tiny (non-official) batch files are refused before unpickling."""
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for f in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]:
        _pickle(folder / f, {"data": np.zeros((1, 3072), np.uint8), "labels": [0]})
    with pytest.raises(DataError, match="corrupted"):
        load_dataset("cifar10", root=tmp_path)


# ---------------------------------------------------------------- SVHN

def test_svhn_real_format(tmp_path, skip_md5):
    data = {}
    for split, y in (("train", [1, 10, 5]), ("test", [10, 2])):
        x = RNG.integers(0, 256, size=(32, 32, 3, len(y)), dtype=np.uint8)  # .mat layout: H, W, C, N
        scipy.io.savemat(tmp_path / f"{split}_32x32.mat", {"X": x, "y": np.array(y, dtype=np.uint8)[:, None]})
        data[split] = x
    b = load_dataset("svhn", root=tmp_path)
    assert b.num_classes == 10 and b.input_shape == (3, 32, 32)
    assert b.train_y.tolist() == [1, 0, 5] and b.test_y.tolist() == [0, 2]  # label 10 is digit 0
    torch.testing.assert_close(b.train_x, _expected(data["train"].transpose(3, 2, 0, 1).astype(np.float64), "svhn"))
    assert float(b.test_x[1, 2, 4, 9]) == pytest.approx((data["test"][4, 9, 2, 1] / 255 - 0.4728) / 0.1970, rel=1e-5)
    # the other normalisations: [0, 1] and FedGuCci's (x - 0.5) / 0.5
    plain = load_dataset("svhn", root=tmp_path, normalize="none")
    half = load_dataset("svhn", root=tmp_path, normalize="half")
    assert float(plain.test_x[1, 2, 4, 9]) == pytest.approx(data["test"][4, 9, 2, 1] / 255)
    torch.testing.assert_close(half.train_x, plain.train_x * 2 - 1)
    with pytest.raises(ConfigError, match="normalize must be"):
        load_dataset("svhn", root=tmp_path, normalize="zscore")
