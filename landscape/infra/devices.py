"""Devices: names validated once, and reproducible GPU training.

Names are ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"`` and ``"mps"``.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from .errors import ConfigError


def resolve_device(device: str | torch.device) -> torch.device:
    """The ``torch.device`` for a device name, refusing names torch cannot use here.

    Parameters
    ----------
    device
        ``"auto"`` (CUDA when available, else CPU), a device name such as ``"cpu"`` or
        ``"cuda:0"``, or a ``torch.device``.

    Returns
    -------
    torch.device
        The device.

    Raises
    ------
    ConfigError
        The name is not a device (``"banana"``), or names an accelerator this machine lacks.
    """
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device {device!r} is not a device name: use 'auto', 'cpu', 'cuda' or "
                          "'cuda:<index>'") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {device!r} asked for a GPU but CUDA is not available on this "
                              "machine: use 'cpu' or 'auto'")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ConfigError(f"device {device!r}: this machine has {torch.cuda.device_count()} "
                              "CUDA device(s)")
    elif resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device {device!r}: MPS is not available on this machine")
    return resolved


@contextmanager
def reproducible(device: torch.device) -> Iterator[None]:
    """Deterministic cuDNN algorithms while the block trains on a CUDA device.

    Without it, cuDNN may pick convolution-backward algorithms that accumulate with atomic
    additions in a varying order, so two runs with the same seed drift apart (a CNN trained two
    FL rounds on an H200 differed by 4e-5 in its last layer). The previous settings are put back
    afterwards; on other devices nothing changes.

    Parameters
    ----------
    device : torch.device
        Where the block's work runs.

    Returns
    -------
    Iterator[None]
        A context manager.
    """
    if device.type != "cuda":
        yield
        return
    cudnn = torch.backends.cudnn
    saved = cudnn.deterministic, cudnn.benchmark
    cudnn.deterministic, cudnn.benchmark = True, False
    try:
        yield
    finally:
        cudnn.deterministic, cudnn.benchmark = saved
