"""The models of a merge as sources of named tensors, read one tensor at a time.

A model-like becomes a :class:`Source`: an ``nn.Module`` or a state_dict is a mapping already in
memory; a ``.safetensors`` checkpoint is read tensor by tensor
(:class:`~landscape.space.safetensors_reader.SafetensorsReader`: memory-mapped, its stored SHA-256
checked when the merge finishes), so a merge holds one tensor per model at a time besides its
output; any other checkpoint (``.pt``/``.pth``) is read whole by
:func:`~landscape.space.checkpoints.load_state_dict` (``torch.load(weights_only=True)``, never
unpickled otherwise: a torch archive has no tensor-by-tensor reading). A ``module.``/``_orig_mod.``
prefix that the reference names lack is removed, as everywhere in the toolkit.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from ..infra.errors import ArchitectureMismatchError, CheckpointError, ConfigError
from ..infra.reading import check_file
from ..space.checkpoints import load_state_dict, removable_prefix
from ..space.safetensors_reader import SafetensorsReader


class Source:
    """One model's tensors by name.

    Parameters
    ----------
    label
        The model's name in messages and results.
    state
        Name -> tensor of a model in memory (None for a file read lazily).
    reader
        The open ``.safetensors`` file of a model read lazily.
    prefix
        The prefix its file's names carry and the reference's lack.

    Attributes
    ----------
    label
        The model's name.
    names
        Its tensors' names (prefix removed), in its own order.
    """

    def __init__(self, label: str, *, state: Mapping[str, torch.Tensor] | None = None,
                 reader: SafetensorsReader | None = None, prefix: str = ""):
        self.label = label
        self._state = state
        self._reader = reader
        self._prefix = prefix
        self.names: tuple[str, ...] = tuple(state) if state is not None else \
            tuple(n[len(prefix):] for n in reader.names)  # type: ignore[union-attr]

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of tensor ``name`` (a file's header is read, not its data).

        Parameters
        ----------
        name
            One of :attr:`names`.

        Returns
        -------
        tuple of int
        """
        if self._state is not None:
            return tuple(self._state[name].shape)
        return self._reader.shape(self._prefix + name)  # type: ignore[union-attr]

    def dtype(self, name: str) -> torch.dtype:
        """The dtype of tensor ``name``.

        Parameters
        ----------
        name
            One of :attr:`names`.

        Returns
        -------
        torch.dtype
        """
        if self._state is not None:
            return self._state[name].dtype
        return self._reader.dtype(self._prefix + name)  # type: ignore[union-attr]

    def read(self, name: str) -> torch.Tensor:
        """Tensor ``name``, detached (a file's tensor is read now).

        Parameters
        ----------
        name
            One of :attr:`names`.

        Returns
        -------
        torch.Tensor
        """
        if self._state is not None:
            return self._state[name].detach()
        return self._reader.read(self._prefix + name)  # type: ignore[union-attr]

    def verify(self) -> None:
        """Check a file's stored SHA-256 against its tensors (nothing for a model in memory).

        Raises
        ------
        CheckpointError
            The file's tensors do not match its stored SHA-256.
        """
        if self._reader is not None:
            self._reader.verify()

    def close(self) -> None:
        """Release a file (nothing for a model in memory)."""
        if self._reader is not None:
            self._reader.close()


def open_source(model: Any, label: str, reference_names: Sequence[str] | None) -> Source:
    """The :class:`Source` of a model-like.

    Parameters
    ----------
    model
        An ``nn.Module``, a state_dict or a checkpoint path.
    label
        Its name.
    reference_names
        The names a ``module.``/``_orig_mod.`` prefix is judged against (None: kept as is).

    Returns
    -------
    Source

    Raises
    ------
    CheckpointError
        A checkpoint is missing or unreadable.
    ConfigError
        ``model`` is none of the accepted kinds.
    """
    keys = list(reference_names or [])
    if isinstance(model, nn.Module):
        model = model.state_dict()
    if isinstance(model, Mapping):
        state = dict(model)
        prefix = removable_prefix(state, keys) if keys else ""
        return Source(label, state={k[len(prefix):]: v for k, v in state.items()})
    if not isinstance(model, (str, os.PathLike)):
        raise ConfigError(f"{label} is a {type(model).__name__}; a merge takes nn.Modules, state_dicts or "
                          "checkpoint paths")
    path = Path(model)
    if path.suffix != ".safetensors":
        return Source(label, state=load_state_dict(path, template_keys=keys or None))
    try:
        check_file(path, "checkpoint", CheckpointError, follow_links=True)  # a FIFO or a device: never read
    except FileNotFoundError:
        raise CheckpointError(path, "file not found") from None
    reader = SafetensorsReader(path)
    return Source(label, reader=reader, prefix=removable_prefix(reader.names, keys) if keys else "")


def check_compatible(sources: Sequence[Source], reference: Source, names: Sequence[str]) -> None:
    """Refuse sources that lack a tensor of ``names`` or hold it with another shape or dtype.

    Parameters
    ----------
    sources
        The other models (and the base).
    reference
        The model the others are compared with.
    names
        The tensors that must agree.

    Raises
    ------
    ArchitectureMismatchError
        A source misses tensors, has others, or has another shape; the message names it.
    ConfigError
        A tensor's dtype differs from the reference's (the message names the model and tensor).
    """
    wanted = set(names)
    for src in sources:
        have = set(src.names)
        missing = [n for n in names if n not in have]
        unexpected = [n for n in src.names if n not in wanted and n not in reference.names]
        wrong = [(n, reference.shape(n), src.shape(n)) for n in names
                 if n in have and src.shape(n) != reference.shape(n)]
        if missing or unexpected or wrong:
            raise ArchitectureMismatchError(missing, unexpected, wrong,
                                            f"{src.label} (compared with {reference.label})")
        for n in names:
            if src.dtype(n) != reference.dtype(n):
                raise ConfigError(f"{src.label}: {n} is {src.dtype(n)} but {reference.label} holds it as "
                                  f"{reference.dtype(n)}; cast the models to one dtype before merging")
