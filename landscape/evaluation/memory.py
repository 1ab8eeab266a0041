"""Memory budgets of the evaluation engine: chunk sizes, activation sizes, out-of-memory errors."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..infra.estimate import output_bytes
from .inputs import call_model, input_length

#: Most points in one chunk, whatever the budget (bounds the host-side bookkeeping).
MAX_CHUNK = 256


def default_budget(device: torch.device) -> int:
    """Bytes a chunk may use: half the free memory of a CUDA device, 1 GiB elsewhere.

    Parameters
    ----------
    device
        The evaluation device.

    Returns
    -------
    int
    """
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.5)
    return 1 << 30


def is_out_of_memory(exc: BaseException) -> bool:
    """True for CUDA (and CPU allocator) out-of-memory errors.

    Parameters
    ----------
    exc
        An exception raised while evaluating a chunk.

    Returns
    -------
    bool
    """
    text = str(exc)
    return (isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in text
            or "can't allocate memory" in text)


def activation_bytes(module: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> int:
    """Twice the bytes of every module output in one forward pass of the largest batch.

    Parameters
    ----------
    module
        The model (on the evaluation device).
    batches
        Its evaluation batches.

    Returns
    -------
    int
        An estimate of the activation memory of one point (forward outputs plus working space).
    """
    largest = max(batches, key=lambda b: input_length(b[0]))[0]
    with torch.no_grad():
        return 2 * output_bytes(module, lambda: call_model(module, largest))


def fitting_chunk(space_size: int, dtype: torch.dtype, budget: int, per_point_extra: int = 0) -> int:
    """Points per chunk that fit ``budget``: three flat vectors per point plus ``per_point_extra``.

    Parameters
    ----------
    space_size
        Length of a flat vector.
    dtype
        Evaluation dtype.
    budget
        Bytes available.
    per_point_extra
        Further bytes per point (vmap's activations).

    Returns
    -------
    int
        Between 1 and :data:`MAX_CHUNK`.
    """
    per_point = space_size * torch.tensor([], dtype=dtype).element_size() * 3 + per_point_extra
    return int(max(1, min(MAX_CHUNK, budget // max(per_point, 1))))
