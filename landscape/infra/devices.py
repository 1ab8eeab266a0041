"""Device names: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``, validated once."""
from __future__ import annotations

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
