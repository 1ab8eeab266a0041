"""Safe checkpoint loading and saving.

Never unpickles arbitrary objects: ``.pt``/``.pth`` files go through
``torch.load(weights_only=True)``, ``.safetensors`` through safetensors. Checkpoints
that wrap the weights (``{"state_dict": ...}``, ``{"model": ...}``) are unwrapped, and a
``module.``/``_orig_mod.`` prefix (DataParallel, torch.compile) is removed when the
template does not have it.
"""
from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Mapping, Sequence

import torch

from .errors import CheckpointError

WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "weights", "net")
PREFIXES = ("module.", "_orig_mod.")


def load_state_dict(path: str | os.PathLike, *, template_keys: Sequence[str] | None = None
                    ) -> dict[str, torch.Tensor]:
    """Read a state_dict from ``.pt``/``.pth`` (weights only) or ``.safetensors``."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(path, "file not found")
    if path.is_dir():
        raise CheckpointError(path, "is a directory; pass a checkpoint file (for an FL run use fl.load_run)")
    if path.stat().st_size == 0:
        raise CheckpointError(path, "file is empty")
    if path.suffix == ".safetensors":
        state = _load_safetensors(path)
    else:
        state = _load_torch(path)
    state = _unwrap(state, path)
    if template_keys is not None:
        state = strip_prefix(state, template_keys)
    return state


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(path, f"not a readable safetensors file (corrupt or truncated?): {exc}") from None


def _load_torch(path: Path) -> object:
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
    """``state`` without a prefix that every key has and no template key has."""
    keys = set(template_keys)
    for prefix in PREFIXES:
        if all(k.startswith(prefix) for k in state) and not any(k.startswith(prefix) for k in keys):
            state = {k[len(prefix):]: v for k, v in state.items()}
    return state


def save_state_dict(state: Mapping[str, torch.Tensor], path: str | os.PathLike) -> Path:
    """Write a state_dict atomically (temporary file, fsync, rename).

    The format follows the suffix: ``.safetensors`` (default for the FL engine) or
    ``.pt``/``.pth``. Tied tensors are stored as separate copies.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in state.items()}
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import save_file

            save_file(tensors, str(tmp))
        else:
            torch.save(tensors, str(tmp))
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
