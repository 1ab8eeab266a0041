"""Schema of the files of an FL run folder (``fl.store``), checked on every load and resume.

A damaged or hand-edited folder must give a clear ``CheckpointError`` naming the file, never
a silently different run:

* ``progress.json``: exactly ``{"round": R, "complete": bool}`` with ``R`` an integer in
  ``0..rounds`` (booleans, fractions, negatives, ``Infinity`` and strings such as ``"false"``
  are refused), ``complete`` true only when ``R == rounds``;
* ``metrics.jsonl`` records: ``round`` a non-negative integer; ``test_loss``, ``train_loss``,
  ``local_loss``, ``personal_loss`` finite numbers >= 0; accuracies in ``[0, 1]``; ``lr``
  finite and > 0; ``time`` finite and >= 0; ``clients`` a list of distinct client ids in
  range, and so is ``dropped`` (the refused clients of the round; ``dropped_reasons`` holds one
  line ``"client K: why"`` per refused client); any other field a finite number, a boolean, a
  string, null or a list of those;
* ``partition.npz``: arrays named ``train_00000 .. train_{K-1}`` and ``test_...`` alike, one
  pair per client and ``K`` equal to the configuration's ``clients``; 1-D integer arrays;
  indices ``>= 0`` and below the training-set size; no index used twice (within or across
  clients, training and local test splits together);
* client checkpoints: ``clients/round_RRRR/client_KKKKK.safetensors`` exactly (five digits,
  ``KKKKK < clients``), regular files in a regular folder;
* ``manifest.json``: the digests of the whole folder (:mod:`fl.manifest`), its own structure
  and digest checked when it is read, and the folder checked against it on load and resume.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from landscape.infra.errors import CheckpointError

CLIENT_FILE = re.compile(r"client_(\d{5})\.safetensors")
_NONNEG = ("test_loss", "train_loss", "local_loss", "personal_loss")
_UNIT = ("test_accuracy", "local_accuracy")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_progress(marker: Any, path: Path, rounds: int | None) -> tuple[int, bool]:
    """Validate a parsed ``progress.json``.

    Parameters
    ----------
    marker : Any
        The parsed JSON.
    path : Path
        The file, named in errors.
    rounds : int, optional
        The run's configured number of rounds (None: not known, no upper bound).

    Returns
    -------
    tuple[int, bool]
        The last complete round and whether the run is complete.

    Raises
    ------
    CheckpointError
        When the marker is not ``{"round": int in 0..rounds, "complete": bool}`` or claims
        completion before the last round.
    """
    hint = "; delete it to restart the run from round 0"
    if not isinstance(marker, dict) or set(marker) != {"round", "complete"}:
        raise CheckpointError(path, f"is not a progress marker {{\"round\": R, \"complete\": bool}}{hint}")
    r, complete = marker["round"], marker["complete"]
    if not _is_int(r) or r < 0 or (rounds is not None and r > rounds):
        bound = f"0..{rounds}" if rounds is not None else ">= 0"
        raise CheckpointError(path, f"round must be an integer in {bound}, got {r!r}{hint}")
    if not isinstance(complete, bool):
        raise CheckpointError(path, f"complete must be true or false, got {complete!r}{hint}")
    if complete and rounds is not None and r != rounds:
        raise CheckpointError(path, f"claims a complete run at round {r}, but the run has {rounds} rounds{hint}")
    return r, complete


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, str)) or _is_number(value)


def check_record(record: Any, path: Path, line: int, clients: int | None) -> dict[str, Any]:
    """Validate one ``metrics.jsonl`` record (see the module docstring).

    Parameters
    ----------
    record : Any
        The parsed JSON line.
    path : Path
        The file, named in errors.
    line : int
        1-based line number, named in errors.
    clients : int, optional
        The run's number of clients (None: client ids are not range-checked).

    Returns
    -------
    dict[str, Any]
        The record.

    Raises
    ------
    CheckpointError
        For a field of the wrong type or out of range.
    """
    where = f"line {line}"
    if not isinstance(record, dict) or not _is_int(record.get("round")) or record["round"] < 0:
        raise CheckpointError(path, f"{where} is not a round record (an object with an integer round >= 0)")
    for key, value in record.items():
        if key == "round":
            continue
        if key in _NONNEG or key == "time":
            ok = _is_number(value) and value >= 0
        elif key in _UNIT:
            ok = _is_number(value) and 0 <= value <= 1
        elif key == "lr":
            ok = _is_number(value) and value > 0
        elif key in ("clients", "dropped"):
            ok = (isinstance(value, list) and all(_is_int(k) and k >= 0 for k in value)
                  and len(set(value)) == len(value) and (clients is None or all(k < clients for k in value)))
        else:
            ok = _plain(value) or (isinstance(value, list) and all(_plain(v) for v in value))
        if not ok:
            raise CheckpointError(path, f"{where}: field {key!r} has an invalid value {value!r}; "
                                        "the file is damaged")
    return record


def check_partition(arrays: Mapping[str, np.ndarray], path: Path, clients: int | None,
                    num_samples: int | None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Validate the arrays of ``partition.npz`` and order them by client.

    Parameters
    ----------
    arrays : Mapping[str, np.ndarray]
        Name -> array as stored.
    path : Path
        The file, named in errors.
    clients : int, optional
        The configured number of clients (None: not checked).
    num_samples : int, optional
        Size of the training pool the indices point into (None: upper bound not checked).

    Returns
    -------
    tuple[list[np.ndarray], list[np.ndarray]]
        Training and local test index arrays (int64), one of each per client.

    Raises
    ------
    CheckpointError
        For missing, extra or misnamed arrays, a client count other than ``clients``, non
        1-D or non-integer arrays, indices out of range, or an index used twice.
    """
    count = sum(name.startswith("train_") for name in arrays)
    expected = {f"{kind}_{k:05d}" for kind in ("train", "test") for k in range(count)}
    if count == 0 or set(arrays) != expected:
        odd = sorted(set(arrays) ^ expected)
        raise CheckpointError(path, f"does not hold one train_KKKKK and one test_KKKKK index array per client "
                                    f"(unexpected or missing: {', '.join(odd[:4]) or 'no arrays'})")
    if clients is not None and count != clients:
        raise CheckpointError(path, f"holds index arrays of {count} clients, but the run has {clients} clients")
    train = [arrays[f"train_{k:05d}"] for k in range(count)]
    test = [arrays[f"test_{k:05d}"] for k in range(count)]
    for name, a in zip(sorted(expected), [arrays[n] for n in sorted(expected)]):
        if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
            raise CheckpointError(path, f"array {name} is not a 1-D integer index array")
    every = np.concatenate([np.asarray(a, dtype=np.int64) for a in train + test])
    if every.size and (every.min() < 0 or (num_samples is not None and every.max() >= num_samples)):
        bad = int(every.min()) if every.min() < 0 else int(every.max())
        limit = f"0..{num_samples - 1}" if num_samples is not None else ">= 0"
        raise CheckpointError(path, f"holds sample index {bad}, outside the training set ({limit})")
    if np.unique(every).size != every.size:
        raise CheckpointError(path, "uses some sample index more than once (within or across clients)")
    return [np.asarray(a, dtype=np.int64) for a in train], [np.asarray(a, dtype=np.int64) for a in test]


def client_files(folder: Path, clients: int | None) -> dict[int, Path]:
    """The client checkpoints in a round folder, by client id, with strict names.

    Parameters
    ----------
    folder : Path
        ``<run>/clients/round_RRRR``.
    clients : int, optional
        The run's number of clients (None: ids are not range-checked).

    Returns
    -------
    dict[int, Path]
        Client id -> checkpoint path, sorted by id.

    Raises
    ------
    CheckpointError
        When the folder or an entry is a symbolic link, or an entry's name is not
        ``client_KKKKK.safetensors`` with ``KKKKK < clients`` (temporary files of a writer,
        ``.*.tmp-*``, are skipped).
    """
    if folder.is_symlink():
        raise CheckpointError(folder, "is a symbolic link; a run folder must hold its own round folders")
    found: dict[int, Path] = {}
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(".") and ".tmp-" in entry.name:
            continue
        match = CLIENT_FILE.fullmatch(entry.name)
        if entry.is_symlink() or not entry.is_file() or match is None:
            raise CheckpointError(entry, "is not a client checkpoint of this run (expected regular files "
                                         "named client_KKKKK.safetensors, five digits); remove it")
        k = int(match.group(1))
        if clients is not None and k >= clients:
            raise CheckpointError(entry, f"names client {k}, but the run has {clients} clients (0..{clients - 1})")
        found[k] = entry
    return found


def refuse_links(paths: Sequence[Path]) -> None:
    """Raise when any of ``paths`` is a symbolic link (nothing is written or read through it).

    Parameters
    ----------
    paths : Sequence[Path]
        Expected files and folders of a run folder.

    Raises
    ------
    CheckpointError
        Naming the first link.
    """
    for p in paths:
        if p.is_symlink():
            raise CheckpointError(p, "is a symbolic link; a run folder's files and folders must be its own "
                                     "(refusing to read or write through it); remove the link")
