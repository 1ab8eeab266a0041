"""Array files of the torchvision data sets (``<root>/<name>.npz``) and the claims benchmark on CIFAR-10.

* The same uint8 pixels written in torchvision's own formats (idx, CIFAR pickles, SVHN .mat;
  the md5 check of the tiny CIFAR/SVHN files is bypassed as in ``test_datasets.py``) and as an
  array file give bit-identical tensors, for every data set and normalisation.
* Every malformed or hostile array file is a one-line ``DataError`` naming the problem, and
  nothing in it is ever unpickled.
* ``python -m paper_claims --quick --dataset cifar10`` runs the papers' CIFAR-10 recipes on a tiny
  CIFAR-10 array file on the CPU and writes only where it is told to.
"""
from __future__ import annotations

import os
import pickle
import re
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
import torchvision.datasets.cifar
import torchvision.datasets.svhn

from fl.array_datasets import ARRAY_FORMATS
from fl.datasets import NORMALIZE_MODES, load_dataset
from landscape import DataError
from landscape.infra import reading
from paper_claims.definitions import DEFERRED

from fault_counts import tally
from test_hostile_files import SPECIAL, deadline

ROOT = Path(__file__).resolve().parents[1]


def images(rng: np.random.Generator, key: str, n: int) -> np.ndarray:
    """``n`` random uint8 images of data set ``key``, channels last."""
    return rng.integers(0, 256, size=(n, *ARRAY_FORMATS[key][0]), dtype=np.uint8)


def labelled(rng: np.random.Generator, key: str, per_class: int) -> tuple[np.ndarray, np.ndarray]:
    """``per_class`` random images of each class of ``key`` and their labels (int64)."""
    classes = ARRAY_FORMATS[key][1]
    y = np.repeat(np.arange(classes), per_class)
    return images(rng, key, len(y)), y


def write_arrays(root: Path, key: str, **arrays: np.ndarray) -> Path:
    """``root/<key>.npz`` holding ``arrays``."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{key}.npz"
    np.savez(path, **arrays)
    return path


def valid(rng: np.random.Generator, key: str = "cifar10") -> dict[str, np.ndarray]:
    """A small valid array file's arrays for ``key``."""
    (tx, ty), (vx, vy) = labelled(rng, key, 2), labelled(rng, key, 1)
    return {"train_x": tx, "train_y": ty, "test_x": vx, "test_y": vy}


# ---------------------------------------------------------------- torchvision's own formats, written here

def write_torchvision(root: Path, key: str, train: tuple[np.ndarray, np.ndarray],
                      test: tuple[np.ndarray, np.ndarray]) -> None:
    """The splits (channels-last uint8 images, labels) in torchvision's on-disk format of ``key``."""
    root.mkdir(parents=True)
    if key in ("mnist", "fashionmnist"):
        raw = root / {"mnist": "MNIST", "fashionmnist": "FashionMNIST"}[key] / "raw"
        raw.mkdir(parents=True)
        for prefix, (x, y) in (("train", train), ("t10k", test)):
            for kind, array in (("images-idx3", x[..., 0]), ("labels-idx1", y)):
                header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
                (raw / f"{prefix}-{kind}-ubyte").write_bytes(header + array.astype(np.uint8).tobytes())
    elif key == "svhn":  # .mat layout (H, W, C, N); digit 0 is stored as label 10
        for split, (x, y) in (("train", train), ("test", test)):
            scipy.io.savemat(root / f"{split}_32x32.mat", {"X": x.transpose(1, 2, 3, 0),
                                                            "y": np.where(y == 0, 10, y).astype(np.uint8)[:, None]})
    else:  # CIFAR python batches: rows of 3072 bytes, the red plane, then green, then blue
        def dump(path: Path, obj: dict) -> None:
            path.write_bytes(pickle.dumps(obj))

        def rows(x: np.ndarray) -> np.ndarray:
            return x.transpose(0, 3, 1, 2).reshape(len(x), -1)

        label = "labels" if key == "cifar10" else "fine_labels"
        folder = root / ("cifar-10-batches-py" if key == "cifar10" else "cifar-100-python")
        folder.mkdir(parents=True)
        if key == "cifar10":
            for i, part in enumerate(np.array_split(np.arange(len(train[1])), 5), start=1):
                dump(folder / f"data_batch_{i}", {"data": rows(train[0][part]), label: train[1][part].tolist()})
            dump(folder / "test_batch", {"data": rows(test[0]), label: test[1].tolist()})
            dump(folder / "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})
        else:
            for split, (x, y) in (("train", train), ("test", test)):
                dump(folder / split, {"data": rows(x), label: y.tolist(), "coarse_labels": (y // 5).tolist()})
            dump(folder / "meta", {"fine_label_names": [f"f{i}" for i in range(100)]})


@pytest.fixture
def skip_md5(monkeypatch):
    """Replace torchvision's md5 comparison (only) by an existence check for the CIFAR/SVHN files written here."""
    def exists(fpath, md5=None):
        return os.path.isfile(fpath)
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", exists)
    monkeypatch.setattr(torchvision.datasets.svhn, "check_integrity", exists)


@pytest.mark.parametrize("key", sorted(ARRAY_FORMATS))
def test_array_file_gives_the_same_tensors_as_torchvision(tmp_path, skip_md5, key):
    rng = np.random.default_rng(7)
    train, test = labelled(rng, key, 3), labelled(rng, key, 1)
    write_torchvision(tmp_path / "tv", key, train, test)
    write_arrays(tmp_path / "npz", key, train_x=train[0], train_y=train[1], test_x=test[0], test_y=test[1])
    for normalize in NORMALIZE_MODES:
        a = load_dataset(key, root=tmp_path / "tv", normalize=normalize)
        b = load_dataset(key, root=tmp_path / "npz", normalize=normalize)
        assert (b.name, b.num_classes, b.input_shape) == (a.name, a.num_classes, a.input_shape)
        for name in ("train_x", "train_y", "test_x", "test_y"):
            ta, tb = getattr(a, name), getattr(b, name)
            assert ta.dtype == tb.dtype and torch.equal(ta, tb), (normalize, name)
    assert b.train_y.tolist() == train[1].tolist() and b.input_shape[0] == ARRAY_FORMATS[key][0][2]


def test_array_file_comes_first_and_downloads_nothing(tmp_path):
    rng = np.random.default_rng(8)
    arrays = valid(rng)
    write_arrays(tmp_path, "cifar10", **arrays)
    b = load_dataset("CIFAR-10", root=tmp_path, download=True)
    assert sorted(os.listdir(tmp_path)) == ["cifar10.npz"]  # no torchvision folder, nothing fetched
    mean, std = (np.asarray(v).reshape(1, 3, 1, 1) for v in ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)))
    expected = (arrays["test_x"].transpose(0, 3, 1, 2) / 255.0 - mean) / std
    np.testing.assert_allclose(b.test_x.numpy(), expected, rtol=0, atol=1e-5)
    # without the array file, the torchvision error says where the arrays may go
    with pytest.raises(DataError, match=r"save the arrays as .*cifar100\.npz"):
        load_dataset("cifar100", root=tmp_path)


# ---------------------------------------------------------------- malformed and hostile files

def _drop(key: str):
    return lambda a: {k: v for k, v in a.items() if k != key}


BAD_ARRAYS = {
    "missing array": (_drop("test_y"), "has no array test_y; an array file holds train_x, train_y, test_x, test_y"),
    "float images": (lambda a: {**a, "train_x": a["train_x"] / 255.0},
                     "train_x has dtype float64, but images are uint8"),
    "channels first": (lambda a: {**a, "test_x": a["test_x"].transpose(0, 3, 1, 2)},
                       r"test_x has shape \(10, 3, 32, 32\), but cifar10 images are \(N, 32, 32, 3\).*transpose"),
    "wrong size": (lambda a: {**a, "train_x": a["train_x"][:, :28, :28]}, "cifar10 images are \\(N, 32, 32, 3\\)"),
    "flat images": (lambda a: {**a, "train_x": a["train_x"].reshape(20, -1)}, "train_x has shape \\(20, 3072\\)"),
    "label too large": (lambda a: {**a, "train_y": np.where(a["train_y"] == 3, 10, a["train_y"])},
                        "train_y holds the label 10, but cifar10 labels are 0..9"),
    "negative label": (lambda a: {**a, "test_y": a["test_y"] - 1}, "test_y holds the label -1, but cifar10 labels"),
    "float labels": (lambda a: {**a, "train_y": a["train_y"].astype(np.float32)}, "train_y has dtype float32"),
    "boolean labels": (lambda a: {**a, "test_y": a["test_y"] > 4}, "test_y has dtype bool"),
    "2-d labels": (lambda a: {**a, "train_y": a["train_y"][:, None]}, r"shape \(20, 1\), but labels are integers"),
    "lengths differ": (lambda a: {**a, "train_y": a["train_y"][:-1]}, "train_x holds 20 images but train_y 19 labels"),
    "empty split": (lambda a: {**a, "test_x": a["test_x"][:0], "test_y": a["test_y"][:0]}, "test_x holds no images"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARRAYS))
def test_malformed_array_file_is_a_one_line_data_error(tmp_path, case):
    change, words = BAD_ARRAYS[case]
    path = write_arrays(tmp_path, "cifar10", **change(valid(np.random.default_rng(9))))
    with pytest.raises(DataError, match=words) as info:
        load_dataset("cifar10", root=tmp_path)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)
    tally("bad inputs rejected")


def test_mnist_without_a_channel_axis_is_told_to_add_one(tmp_path):
    rng = np.random.default_rng(10)
    arrays = valid(rng, "mnist")
    write_arrays(tmp_path, "mnist", **{**arrays, "train_x": arrays["train_x"][..., 0]})
    with pytest.raises(DataError, match=r"mnist images are \(N, 28, 28, 1\).*save x\[\.\.\., None\]"):
        load_dataset("mnist", root=tmp_path)
    tally("bad inputs rejected")


class Trap:
    """Unpickling it creates the file ``path``: proof that something was unpickled."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def bomb(path: Path) -> None:
    """An archive whose train_x header declares 300 GB of pixels (none are stored)."""
    arrays = valid(np.random.default_rng(11))
    with zipfile.ZipFile(path, "w") as zf:
        with zf.open("train_x.npy", "w") as member:
            np.lib.format.write_array_header_1_0(member, {"descr": "|u1", "fortran_order": False,
                                                          "shape": (10**8, 32, 32, 3)})
        for k in ("train_y", "test_x", "test_y"):
            with zf.open(f"{k}.npy", "w") as member:
                np.lib.format.write_array(member, arrays[k])


def single_array(path: Path) -> None:
    """One .npy array (not an archive) under the .npz name."""
    with open(path, "wb") as fh:
        np.save(fh, np.zeros((2, 32, 32, 3), np.uint8))


def truncated(path: Path) -> None:
    """The first 5,000 bytes of a valid archive (its central directory is gone)."""
    np.savez(path, **valid(np.random.default_rng(14)))
    path.write_bytes(path.read_bytes()[:5000])


def damaged(path: Path) -> None:
    """A valid archive with one byte of train_x's pixels flipped (its CRC no longer matches)."""
    np.savez(path, **valid(np.random.default_rng(12)))
    data = bytearray(path.read_bytes())
    data[len(data) // 4] ^= 0xFF
    path.write_bytes(bytes(data))


HOSTILE = {
    "object array": (lambda p, trap: np.savez(p, **{**valid(np.random.default_rng(13)),
                                                   "train_y": np.array([Trap(trap)] * 20, dtype=object)}),
                     "the array train_y holds Python objects \\(dtype object\\), which are never unpickled"),
    "a pickle": (lambda p, trap: p.write_bytes(pickle.dumps({"train_x": Trap(trap)})), "is not an .npz archive"),
    "text": (lambda p, trap: p.write_text("train_x,train_y\n1,2\n"), "is not an .npz archive"),
    "empty file": (lambda p, trap: p.write_bytes(b""), "is not an .npz archive"),
    "truncated": (lambda p, trap: truncated(p), "is not an .npz archive"),
    "damaged pixels": (lambda p, trap: damaged(p), "an array is damaged .*CRC"),
    "single array": (lambda p, trap: single_array(p), "is a single .npy array, not an .npz archive"),
    "size bomb": (lambda p, trap: bomb(p), r"the array train_x declares shape \(100000000, 32, 32, 3\) \(.*\) but "
                  "holds .*; the file is truncated or forged"),
    "broken link": (lambda p, trap: p.symlink_to(p.parent / "elsewhere.npz"), "is a link to a missing file"),
    **{kind: (lambda p, trap, make=make: make(p), re.escape(words)) for kind, (make, words) in SPECIAL.items()},
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_array_file_is_refused_without_unpickling(tmp_path, case):
    make, words = HOSTILE[case]
    path, trap = tmp_path / "cifar10.npz", tmp_path / "unpickled"
    make(path, trap)
    with deadline(30), pytest.raises(DataError, match=words) as info:
        load_dataset("cifar10", root=tmp_path)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)
    assert not trap.exists()
    tally("hostile files refused" if case in SPECIAL or case in ("object array", "a pickle", "size bomb",
                                                                 "broken link") else "corrupt inputs tried")


def test_arrays_larger_than_a_data_file_are_refused_before_they_are_read(tmp_path, monkeypatch):
    """Compressed zeros: a small file whose arrays unpack past the limit (lowered here to 50 kB)."""
    arrays = {k: np.zeros_like(v) for k, v in valid(np.random.default_rng(15)).items()}
    path = tmp_path / "cifar10.npz"
    np.savez_compressed(path, **arrays)
    assert path.stat().st_size < 50_000 < sum(a.nbytes for a in arrays.values())
    monkeypatch.setitem(reading.LIMITS, "data file", (50_000, "lowered for the test"))
    with pytest.raises(DataError, match=r"its arrays take 90.2 KiB, more than a data file can be \(48.8 KiB: lowered"):
        load_dataset("cifar10", root=tmp_path)
    tally("hostile files refused")


# ---------------------------------------------------------------- python -m paper_claims on CIFAR-10 arrays

@pytest.fixture(scope="module")
def cifar10_root(tmp_path_factory) -> Path:
    """A tiny CIFAR-10 array file: 4 training and 2 test images per class, random pixels (seeded)."""
    rng = np.random.default_rng(0)
    (tx, ty), (vx, vy) = labelled(rng, "cifar10", 4), labelled(rng, "cifar10", 2)
    root = tmp_path_factory.mktemp("cifar10-arrays")
    write_arrays(root, "cifar10", train_x=tx, train_y=ty, test_x=vx, test_y=vy)
    return root


def cifar10_paths() -> set[str]:
    """Paths under the repository's runs/ that name CIFAR-10."""
    return {str(Path(d) / f) for d, dirs, files in os.walk(ROOT / "runs") for f in dirs + files if "cifar10" in f}


def run_claims(tmp_path: Path, data_root: Path, only: list[str]) -> str:
    """``python -m paper_claims --quick --dataset cifar10`` from the repository root; the page it wrote.

    Checks that it exits 0 within the timeout and writes nothing outside ``tmp_path`` (the
    repository's runs/ and docs/claims.md, the default data folder, the data root).
    """
    before = cifar10_paths()
    env = {**os.environ, "LANDSCAPE_DATA": str(tmp_path / "default-data")}
    doc = tmp_path / "claims.md"
    cmd = [sys.executable, "-m", "paper_claims", "--quick", "--dataset", "cifar10",
           "--data-root", str(data_root), "--device", "cpu", "--seeds", "0", "1", "--only", *only,
           "--cache", str(tmp_path / "runs"), "--doc", str(doc)]
    started = time.time()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    print(f"paper_claims --only {' '.join(only)}: {time.time() - started:.1f} s")
    assert sorted(os.listdir(tmp_path)) == ["claims.md", "runs"]
    assert cifar10_paths() == before and str(tmp_path) not in (ROOT / "docs" / "claims.md").read_text("utf-8")
    assert sorted(os.listdir(data_root)) == ["cifar10.npz"]
    text = doc.read_text(encoding="utf-8")
    assert "# The papers' claims, measured on cifar10" in text and "QUICK MODE" in text
    return text


def test_claims_quick_runs_the_fedgucci_and_floco_cifar10_recipes(tmp_path, cifar10_root):
    text = run_claims(tmp_path, cifar10_root, ["fedgucci", "floco"])
    assert "fedgucci-cifar10" in text and "floco-cifar10" in text
    assert "\n| 1a |" in text and "\n| 5a |" in text and "\n| 4a |" not in text
    runs = sorted(os.listdir(tmp_path / "runs"))
    held_out = [r for r in runs if "local_test_fraction0.1" in r]
    controls = "not trained: FedGuCci's own arm has not finished" not in text  # 4 quick rounds may leave it so
    if controls and "1c" not in DEFERRED:
        # 2 seeds x (FedGuCci, FedAvg, FedAvg lr x 1.05, FedAvg at 3 lrs with held-out data; FLOCO, Ditto whose
        # global model is FedAvg's), and FedAvg on the full data at each lr a seed chose other than the recipe's
        assert len(held_out) == 6 and 16 <= len(runs) <= 18
    else:  # 2 seeds x (FedGuCci, FedAvg; FLOCO, Ditto), and FedAvg lr x 1.05 when 1b is trained
        assert not held_out and len(runs) == 8 + 2 * (controls and "1b" not in DEFERRED)
    assert all(r.endswith("-quick") and "-cifar10-" in r for r in runs)
    assert not [r for r in runs if r.startswith("floco-cifar10-fedavg")]


def test_claims_quick_runs_the_ima_cifar10_recipe(tmp_path, cifar10_root):
    text = run_claims(tmp_path, cifar10_root, ["ima"])
    assert "ima-cifar10" in text and "\n| 4a |" in text and "\n| 1a |" not in text
    assert all(r.startswith("ima-cifar10-") for r in os.listdir(tmp_path / "runs"))
