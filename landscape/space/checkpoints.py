"""Safe checkpoint loading and saving.

Never unpickles arbitrary objects: ``.pt``/``.pth`` files go through
``torch.load(weights_only=True)``, ``.safetensors`` through safetensors. Checkpoints
that wrap the weights (``{"state_dict": ...}``, ``{"model": ...}``) are unwrapped, and a
``module.``/``_orig_mod.`` prefix (DataParallel, torch.compile) is removed when the
template does not have it.

Corruption is detected, not loaded as wrong numbers: the CRC-32 of every record of a
``.pt`` zip archive is checked before ``torch.load``, and ``.safetensors`` files written
here carry a SHA-256 of their tensors in the header metadata (``DIGEST_KEY``), checked on
load (files from elsewhere have none: safetensors itself stores no checksum).
"""
from __future__ import annotations

import io
import os
import pickle
import zipfile
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import torch

from ..infra.errors import CheckpointError, ConfigError
from ..infra.files import write_atomic
from ..infra.reading import check_file, open_file
from .safetensors_reader import DIGEST_KEY, SafetensorsReader, state_digest

WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "weights", "net")
PREFIXES = ("module.", "_orig_mod.")
#: Suffixes :func:`save_state_dict` writes: safetensors, or a torch archive of plain tensors.
SAVE_SUFFIXES = (".safetensors", ".pt", ".pth")


def load_state_dict(path: str | os.PathLike, *, template_keys: Sequence[str] | None = None,
                    digest: str | None = None) -> dict[str, torch.Tensor]:
    """Read a state_dict from ``.pt``/``.pth`` (weights only) or ``.safetensors``.

    Never unpickles arbitrary objects; checks the archive's CRC-32 (``.pt``) or the stored
    SHA-256 (``.safetensors`` written here); unwraps ``{"state_dict": ...}``-style wrappers.

    Parameters
    ----------
    path
        The checkpoint file.
    template_keys
        Parameter names of the model the state is for; a ``module.``/``_orig_mod.`` prefix
        that every key has and no template key has is removed (see :func:`strip_prefix`).
    digest
        The SHA-256 the file must carry (a run folder's manifest entry): a ``.safetensors``
        file without a stored digest, with another one, or of another format is refused.

    Returns
    -------
    dict of str to torch.Tensor
        The state_dict, on CPU.

    Raises
    ------
    CheckpointError
        If the file is missing, a directory, empty, not a checkpoint (text, an unknown
        format), corrupt or truncated, holds pickled objects other than tensors, or holds no
        state_dict, or does not carry ``digest``.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(path, "file not found")
    if path.is_dir():
        raise CheckpointError(path, "is a directory; pass a checkpoint file (for an FL run use fl.load_run)")
    with open_file(path, "checkpoint", CheckpointError, follow_links=True) as fh:  # a FIFO or a device: never read
        head = fh.read(64)
    if not head:
        raise CheckpointError(path, "file is empty")
    _check_format(path, head)
    if path.suffix == ".safetensors":
        state = _load_safetensors(path, digest)
    elif digest is not None:
        raise CheckpointError(path, "is not a .safetensors file with a stored SHA-256, as expected here")
    else:
        state = _load_torch(path)
    state = _unwrap(state, path)
    if template_keys is not None:
        state = strip_prefix(state, template_keys)
    return state


def stored_digest(path: str | os.PathLike) -> str | None:
    """The SHA-256 a ``.safetensors`` file carries in its metadata (:data:`DIGEST_KEY`).

    Read from its header without loading the tensors.

    Parameters
    ----------
    path
        The checkpoint file (must be a regular file).

    Returns
    -------
    str or None
        The stored digest; None when the file carries none (written elsewhere or re-saved).

    Raises
    ------
    CheckpointError
        If the file is missing, a link, not a regular file, or not a readable safetensors file.
    """
    path = Path(path)
    try:
        check_file(path, "checkpoint", CheckpointError)  # a link, FIFO or device: refused, never read
    except FileNotFoundError:
        raise CheckpointError(path, "file not found") from None
    with SafetensorsReader(path) as reader:
        return reader.metadata.get(DIGEST_KEY)


def _load_safetensors(path: Path, required: str | None) -> dict[str, torch.Tensor]:
    with SafetensorsReader(path) as reader:
        state = {name: reader.read(name) for name in reader.names}
        reader.verify(required)
    return state


def _check_archive(path: Path) -> None:
    """Verify the CRC-32 of every record of a zip checkpoint (torch does not)."""
    try:
        if not zipfile.is_zipfile(path):
            return  # legacy or damaged beyond recognition: torch.load reports it
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.is_dir() or info.external_attr & 0x10:  # torch.save writes no folders
                    raise zipfile.BadZipFile(f"record {info.filename!r} is marked as a folder")
                if info.CRC == 0 and info.file_size > 0:
                    continue  # written with torch's CRC-32 disabled: nothing to check
                with archive.open(info) as record:  # reading to the end checks the CRC-32
                    while record.read(1 << 20):
                        pass
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, NotImplementedError, UnicodeDecodeError) as exc:
        raise CheckpointError(path, f"truncated or corrupt checkpoint archive: {exc}") from None


def _check_format(path: Path, head: bytes) -> None:
    """Refuse a file that neither torch.save nor safetensors can have written.

    Judged by its first bytes ``head`` (text, an image, ...).
    """
    if path.suffix == ".safetensors" and head[8:9] == b"{":  # the header's length, then its JSON
        return
    if path.suffix != ".safetensors" and head.startswith((b"PK\x03\x04", b"\x80")):  # zip, or legacy pickle
        return
    text = b"\x00" not in head and "\ufffd" not in head.decode("utf-8", errors="replace")[:-4]
    kind = "a text file" if text else "of an unknown format (or damaged)"
    raise CheckpointError(path, f"is not a checkpoint: it is {kind} (it starts with {head[:24]!r}); accepted: "
                                ".pt/.pth files written by torch.save and .safetensors files")


def _load_torch(path: Path) -> object:
    _check_archive(path)
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            path, "contains pickled Python objects that are not plain tensors; refusing to unpickle "
                  f"it (weights_only=True). Re-save it as a state_dict or .safetensors. Detail: "
                  f"{str(exc).splitlines()[0]}") from None
    except (zipfile.BadZipFile, EOFError) as exc:
        raise CheckpointError(path, f"truncated or corrupt checkpoint: {exc}") from None
    except RuntimeError as exc:
        raise CheckpointError(path, f"cannot be read as a PyTorch checkpoint (corrupt or truncated?): "
                                    f"{str(exc).splitlines()[0]}") from None
    except Exception as exc:  # torch raises assorted errors on garbage input
        raise CheckpointError(path, f"cannot be read as a PyTorch checkpoint: {type(exc).__name__}: "
                                    f"{str(exc).splitlines()[0] if str(exc) else ''}") from None


def _unwrap(obj: object, path: Path) -> dict[str, torch.Tensor]:
    if isinstance(obj, torch.nn.Module):  # cannot happen with weights_only, kept for clarity
        obj = obj.state_dict()
    if isinstance(obj, Mapping) and not _is_state(obj):
        for key in WRAPPER_KEYS:
            inner = obj.get(key)
            if isinstance(inner, Mapping) and _is_state(inner):
                obj = inner
                break
    if not isinstance(obj, Mapping) or not _is_state(obj):
        raise CheckpointError(path, "does not hold a state_dict (a mapping from names to tensors); "
                                    f"top-level type {type(obj).__name__}")
    return dict(obj)


def _is_state(obj: Mapping) -> bool:
    return len(obj) > 0 and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())


def strip_prefix(state: dict[str, torch.Tensor], template_keys: Sequence[str]) -> dict[str, torch.Tensor]:
    """``state`` without a prefix that every key has and no template key has.

    Parameters
    ----------
    state
        A state_dict, possibly saved from ``DataParallel`` (``module.``) or ``torch.compile``
        (``_orig_mod.``).
    template_keys
        Parameter names of the model the state is for.

    Returns
    -------
    dict of str to torch.Tensor
        The state with such prefixes (:data:`PREFIXES`) removed; the same tensors.
    """
    prefix = removable_prefix(state, template_keys)
    return {k[len(prefix):]: v for k, v in state.items()} if prefix else state


def removable_prefix(keys: Iterable[str], template_keys: Sequence[str]) -> str:
    """The prefix :func:`strip_prefix` removes from ``keys``: ``""``, or one or more of :data:`PREFIXES`.

    Parameters
    ----------
    keys
        Names of a state_dict.
    template_keys
        Parameter names of the model the state is for.

    Returns
    -------
    str
        Every prefix of :data:`PREFIXES`, in order, that every key has (after the ones before)
        and no template key has.
    """
    names, template = list(keys), set(template_keys)
    removed = ""
    for prefix in PREFIXES:
        if all(k.startswith(removed + prefix) for k in names) and not any(k.startswith(prefix) for k in template):
            removed += prefix
    return removed


def check_save_path(path: str | os.PathLike) -> Path:
    """Refuse a checkpoint destination whose suffix names no format :func:`save_state_dict` writes.

    Parameters
    ----------
    path
        The destination.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    ConfigError
        If the suffix is not ``.safetensors``, ``.pt`` or ``.pth``.
    """
    path = Path(path)
    if path.suffix not in SAVE_SUFFIXES:
        raise ConfigError(f"{path}: a checkpoint is written as .safetensors, .pt or .pth (the suffix picks the "
                          f"format), got {repr(path.suffix) if path.suffix else 'no suffix'}; rename the file")
    return path


def save_state_dict(state: Mapping[str, torch.Tensor] | torch.nn.Module, path: str | os.PathLike) -> Path:
    """Write a state_dict atomically (temporary file, fsync, rename).

    The format follows the suffix: ``.safetensors`` (default for the FL engine; with the
    SHA-256 of the tensors in its metadata) or ``.pt``/``.pth``. Tied tensors are stored as
    separate copies. The file is serialised in memory first and written with
    :func:`landscape.infra.files.write_atomic`: never through a link, and a full disk or a
    read-only location gives a clear :class:`FileWriteError` while the old file stays.

    Parameters
    ----------
    state
        The state_dict to save (copied to CPU, contiguous), or a module (its ``state_dict()``).
    path
        Destination; its suffix picks the format.

    Returns
    -------
    pathlib.Path
        The path written.

    Raises
    ------
    ConfigError
        If the suffix is not one of :data:`SAVE_SUFFIXES`, or ``state`` is neither a mapping of
        tensors nor a module (nothing is written).
    FileWriteError
        If the file cannot be written (full disk, read-only location, a link in the way).
    """
    path = check_save_path(path)
    if isinstance(state, torch.nn.Module):
        state = state.state_dict()
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"save_state_dict saves a module or a mapping of names to tensors, got "
                          f"{type(state).__name__}")
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in state.items()}
    if path.suffix == ".safetensors":
        from safetensors.torch import save

        data: bytes | memoryview = save(tensors, metadata={DIGEST_KEY: state_digest(tensors)})
    else:
        buffer = io.BytesIO()
        torch.save(tensors, buffer)
        data = buffer.getbuffer()
    write_atomic(path, data)
    return path
