"""Reading a ``.safetensors`` checkpoint one tensor at a time, its stored SHA-256 checked as the tensors pass.

safetensors stores no checksum; files written here carry the SHA-256 of their tensors in the
header metadata (:data:`DIGEST_KEY`, :func:`state_digest`: names, dtypes, shapes and bytes in
name order). :class:`SafetensorsReader` opens a file with ``safetensors.safe_open`` (the tensors
are memory-mapped, nothing is read up front), gives names, shapes and dtypes from the header, and
reads tensors on request, feeding each to the digest in name order; :meth:`SafetensorsReader.verify`
completes the digest (reading, and dropping, any tensor not read yet) and compares it with the
stored one. So a merge that holds one tensor per model at a time still detects a damaged file,
and :func:`landscape.space.checkpoints.load_state_dict` uses the same reader.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Mapping

import torch

from ..infra.errors import CheckpointError

#: safetensors metadata entry holding :func:`state_digest` of the file's tensors.
DIGEST_KEY = "landscape.sha256"
#: safetensors' dtype names (header ``dtype``) -> torch dtypes.
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


def digest_update(h: Any, name: str, tensor: torch.Tensor) -> None:
    """Feed one named tensor to a SHA-256 as :func:`state_digest` does.

    Parameters
    ----------
    h
        A ``hashlib.sha256()`` object.
    name
        The tensor's name.
    tensor
        The tensor (any device).
    """
    t = tensor.detach().cpu().contiguous().reshape(-1)
    h.update(f"{name}:{t.dtype}:{tuple(tensor.shape)};".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def state_digest(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over the names, dtypes, shapes and bytes of ``state``'s tensors, in name order.

    Parameters
    ----------
    state
        A state_dict (any device).

    Returns
    -------
    str
        Hexadecimal digest (stored under :data:`DIGEST_KEY` in ``.safetensors`` files).
    """
    h = hashlib.sha256()
    for name in sorted(state):
        digest_update(h, name, state[name])
    return h.hexdigest()


class SafetensorsReader:
    """One ``.safetensors`` file, read tensor by tensor (use as a context manager).

    Parameters
    ----------
    path
        The file (checked to be a readable regular file by the caller).

    Attributes
    ----------
    path
        The file.
    metadata
        The header's metadata (empty when there is none).
    names
        The tensors' names, sorted.

    Raises
    ------
    CheckpointError
        The file is not a readable safetensors file.
    """

    def __init__(self, path: str | os.PathLike):
        from safetensors import safe_open

        self.path = Path(path)
        try:
            self._file = safe_open(str(self.path), framework="pt", device="cpu")
            self.metadata: dict[str, str] = self._file.metadata() or {}
            self.names: tuple[str, ...] = tuple(sorted(self._file.keys()))
        except Exception as exc:  # SafetensorError, OSError, ValueError, RuntimeError
            raise self._unreadable(exc) from None
        self._hash = hashlib.sha256()
        self._hashed = 0  # names[:_hashed] are in the digest, in order
        self._in_order = True

    def __enter__(self) -> "SafetensorsReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Release the file (its memory map)."""
        self._file.__exit__(None, None, None)

    def _unreadable(self, exc: Exception) -> CheckpointError:
        return CheckpointError(self.path, f"not a readable safetensors file (corrupt or truncated?): {exc}")

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of tensor ``name``, from the header.

        Parameters
        ----------
        name
            A name of :attr:`names`.

        Returns
        -------
        tuple of int
        """
        return tuple(self._file.get_slice(name).get_shape())

    def dtype(self, name: str) -> torch.dtype:
        """The dtype of tensor ``name``, from the header (a dtype torch has no name for is read).

        Parameters
        ----------
        name
            A name of :attr:`names`.

        Returns
        -------
        torch.dtype
        """
        found = DTYPES.get(self._file.get_slice(name).get_dtype())
        return found if found is not None else self._get(name).dtype

    def _get(self, name: str) -> torch.Tensor:
        try:
            return self._file.get_tensor(name)
        except Exception as exc:  # a truncated body fails when the tensor is read
            raise self._unreadable(exc) from None

    def read(self, name: str) -> torch.Tensor:
        """Tensor ``name`` (on CPU), fed to the running digest.

        Reading in name order costs one pass; a tensor skipped over is read once for the digest
        and dropped; reading out of order makes :meth:`verify` read the file again.

        Parameters
        ----------
        name
            A name of :attr:`names`.

        Returns
        -------
        torch.Tensor
        """
        tensor = self._get(name)
        if self._in_order and DIGEST_KEY in self.metadata:
            at = self.names.index(name)
            if at < self._hashed:
                self._in_order = False
            else:
                for skipped in self.names[self._hashed:at]:
                    digest_update(self._hash, skipped, self._get(skipped))
                digest_update(self._hash, name, tensor)
                self._hashed = at + 1
        return tensor

    def verify(self, required: str | None = None) -> None:
        """Check the stored SHA-256 against the tensors (and against ``required``).

        Parameters
        ----------
        required
            The SHA-256 the file must carry (a run folder's manifest entry), or None.

        Raises
        ------
        CheckpointError
            ``required`` is given and the file carries no digest or another one; the tensors
            do not match the stored digest (damaged on disk or in transfer).
        """
        expected = self.metadata.get(DIGEST_KEY)
        if required is not None and expected is None:
            raise CheckpointError(self.path, f"carries no SHA-256 of its tensors ({DIGEST_KEY}): it was re-saved "
                                             "by another tool or put in place of the file written here; restore "
                                             "the original")
        if required is not None and expected != required:
            raise CheckpointError(self.path, "is not the checkpoint recorded here: its SHA-256 differs from the one "
                                             "recorded when it was written (another model put in its place?); "
                                             "restore it")
        if expected is None:
            return
        if not self._in_order:
            self._hash, self._hashed, self._in_order = hashlib.sha256(), 0, True
        for name in self.names[self._hashed:]:
            digest_update(self._hash, name, self._get(name))
        self._hashed = len(self.names)
        if self._hash.hexdigest() != expected:
            raise CheckpointError(self.path, "is corrupt: its tensors do not match the SHA-256 stored when it was "
                                             "written (damaged on disk or in transfer); restore it from a good copy")
