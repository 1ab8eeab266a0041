"""Flat-vector views of a module's weights.

A :class:`ParameterSpace` is built from a template module. It lists every floating-point
tensor of the module's ``state_dict`` (parameters *and* buffers such as BatchNorm running
statistics) in a fixed order, so that any compatible model becomes one flat vector and
back. Non-float buffers (``num_batches_tracked``) are not part of the vector; they are
kept from the template. Geometry (norms, inner products, plane bases) is measured on the
parameter entries only (``param_mask``); buffers travel along with the same coefficients.
"""
from __future__ import annotations

import hashlib
import os
from typing import Iterable, Mapping, Sequence, Union

import torch
from torch import nn

from ..infra.errors import (
    ArchitectureMismatchError,
    CheckpointError,
    ConfigError,
    MetaDeviceError,
    NonFiniteWeightsError,
)
from .tensor_spec import TensorSpec

ModelLike = Union[nn.Module, Mapping[str, torch.Tensor], str, os.PathLike[str]]


class ParameterSpace:
    """Ordered layout of a module's floating-point state as one flat vector.

    Parameters
    ----------
    module
        The template module; every compatible model (same names and shapes) maps to a flat
        vector of this space.

    Attributes
    ----------
    module
        The template module.
    entries
        One :class:`TensorSpec` per floating-point tensor, in ``state_dict`` order.
    size
        Length of the flat vector.
    param_mask
        Boolean mask over the flat vector, True on parameter entries (geometry is measured there).
    has_buffers
        Whether the vector holds floating-point buffers (e.g. BatchNorm statistics).
    fixed
        Non-float tensors (``num_batches_tracked``), kept from the template.
    aliases
        Name -> name of the tensor it is tied to (tied weights are stored once).
    frozen
        Names of parameters with ``requires_grad=False``.

    Raises
    ------
    ConfigError
        If the module has no floating-point parameters or buffers.
    MetaDeviceError
        If the module is on the meta device (shapes only, no weights).
    """

    def __init__(self, module: nn.Module):
        if any(t.is_meta for t in module.state_dict().values()):
            raise MetaDeviceError(type(module).__name__)
        self.module = module
        param_names = {name for name, _ in module.named_parameters(remove_duplicate=False)}
        #: names of parameters with ``requires_grad=False`` (excluded from curvature by default)
        self.frozen = frozenset(name for name, p in module.named_parameters(remove_duplicate=False)
                                if not p.requires_grad)
        state = module.state_dict(keep_vars=True)
        entries: list[TensorSpec] = []
        fixed: dict[str, torch.Tensor] = {}
        self.aliases: dict[str, str] = {}
        seen: dict[int, str] = {}
        offset = 0
        for name, tensor in state.items():
            ident = id(tensor)
            if ident in seen:  # tied weights appear under several names
                self.aliases[name] = seen[ident]
                continue
            seen[ident] = name
            if not torch.is_floating_point(tensor):
                fixed[name] = tensor.detach().clone()
                continue
            kind = "parameter" if name in param_names else "buffer"
            entries.append(TensorSpec(name, tuple(tensor.shape), kind, offset, tensor.numel()))
            offset += tensor.numel()
        if offset == 0:
            raise ConfigError("the template module has no floating-point parameters or buffers")
        self.entries: tuple[TensorSpec, ...] = tuple(entries)
        self.fixed = fixed
        self.size = offset
        mask = torch.zeros(offset, dtype=torch.bool)
        for e in entries:
            if e.kind == "parameter":
                mask[e.offset:e.offset + e.numel] = True
        self.param_mask = mask
        self.has_buffers = bool((~mask).any())
        self._by_name = {e.name: e for e in entries}

    # ------------------------------------------------------------------ layout
    @property
    def names(self) -> list[str]:
        """Names of the entries of the flat vector, in order."""
        return [e.name for e in self.entries]

    def layout_digest(self) -> str:
        """Digest of names, shapes and kinds: two spaces with equal digests are compatible.

        Returns
        -------
        str
            The first 16 hexadecimal digits of a SHA-256.
        """
        text = ";".join(f"{e.name}:{e.shape}:{e.kind}" for e in self.entries)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def select(self, patterns: Sequence[str] | str | None, *, include_frozen: bool = False) -> torch.Tensor:
        """Boolean mask over the flat vector of the parameter entries to differentiate.

        Parameters
        ----------
        patterns
            ``fnmatch`` globs of parameter names (``"fc.*"``, ``"*.weight"``); ``None``
            selects every parameter.
        include_frozen
            Also select parameters with ``requires_grad=False`` (default: they are left out,
            as curvature is about the trainable parameters).

        Returns
        -------
        torch.Tensor
            Boolean mask of length ``size``.

        Raises
        ------
        ConfigError
            Nothing is selected.
        """
        from fnmatch import fnmatch

        if isinstance(patterns, str):
            patterns = [patterns]
        mask = torch.zeros(self.size, dtype=torch.bool)
        for e in self.entries:
            if e.kind != "parameter" or (e.name in self.frozen and not include_frozen):
                continue
            if patterns is None or any(fnmatch(e.name, p) for p in patterns):
                mask[e.offset:e.offset + e.numel] = True
        if not mask.any():
            what = "no trainable parameter" if patterns is None else f"no trainable parameter matches {list(patterns)}"
            raise ConfigError(f"{what}; names are {self.names[:10]}... (frozen parameters are left out "
                              "unless include_frozen=True)")
        return mask

    # --------------------------------------------------------------- conversion
    def check_state(self, state: Mapping[str, torch.Tensor], source: str = "state_dict") -> None:
        """Raise :class:`ArchitectureMismatchError` listing missing, unexpected, wrong-shape keys.

        Parameters
        ----------
        state
            A state_dict to be read into this space.
        source
            What the state came from (a path, a class name), for the error message.

        Raises
        ------
        ArchitectureMismatchError
            If keys are missing or unexpected, or shapes differ.
        CheckpointError
            If a tensor where the template holds floating-point weights is integer or boolean.
        """
        expected = {e.name: e.shape for e in self.entries}
        expected.update({k: tuple(v.shape) for k, v in self.fixed.items()})
        missing = [k for k in expected if k not in state]
        # optional keys: aliases of tied weights and num_batches_tracked-like counters
        missing = [k for k in missing if k not in self.fixed]
        unexpected = [k for k in state if k not in expected and k not in self.aliases]
        wrong = [(k, expected[k], tuple(state[k].shape)) for k in expected
                 if k in state and tuple(state[k].shape) != tuple(expected[k])]
        if missing or unexpected or wrong:
            raise ArchitectureMismatchError(missing, unexpected, wrong, source)
        not_float = [f"{e.name} ({state[e.name].dtype})" for e in self.entries
                     if not torch.is_floating_point(state[e.name])]
        if not_float:
            raise CheckpointError(source, f"integer or boolean tensors where the template holds floating-point "
                                          f"weights: {', '.join(not_float[:4])}{' ...' if len(not_float) > 4 else ''};"
                                          " they are not cast silently: save the weights as floating point")

    def flatten(self, state: Mapping[str, torch.Tensor], *, dtype: torch.dtype = torch.float32,
                check_finite: bool = True, source: str = "state_dict") -> torch.Tensor:
        """One flat vector (on CPU) from a state_dict that matches this space.

        Parameters
        ----------
        state
            A state_dict with this space's names and shapes.
        dtype
            dtype of the vector.
        check_finite
            Refuse weights that are NaN or infinite.
        source
            What the state came from, for error messages.

        Returns
        -------
        torch.Tensor
            Flat vector of length :attr:`size`.

        Raises
        ------
        ArchitectureMismatchError, CheckpointError
            See :meth:`check_state`.
        NonFiniteWeightsError
            If ``check_finite`` and a tensor holds NaN or inf (the message names them).
        MetaDeviceError
            If a tensor is on the meta device (no weights).
        """
        self.check_state(state, source)
        if any(state[e.name].is_meta for e in self.entries):
            raise MetaDeviceError(source)
        parts = [state[e.name].detach().reshape(-1).to("cpu", dtype) for e in self.entries]
        vec = torch.cat(parts)
        if check_finite and not torch.isfinite(vec).all():
            bad = [e.name for e in self.entries
                   if not torch.isfinite(vec[e.offset:e.offset + e.numel]).all()]
            raise NonFiniteWeightsError(bad, source)
        return vec

    def unflatten(self, vec: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views into ``vec`` (last dimension = space size) keyed by state_dict name.

        A leading batch dimension is kept: ``vec`` of shape (P, D) gives tensors (P, *shape) for ``vmap``.

        Parameters
        ----------
        vec
            Flat vector(s), last dimension :attr:`size`.

        Returns
        -------
        dict of str to torch.Tensor
            One view per entry (no copy; non-float tensors and aliases are not included).
        """
        return {e.name: e.view(vec) for e in self.entries}

    def state_dict(self, vec: torch.Tensor) -> dict[str, torch.Tensor]:
        """A complete state_dict (copies, CPU) for a flat vector: loadable into the template.

        Parameters
        ----------
        vec
            Flat vector of length :attr:`size`.

        Returns
        -------
        dict of str to torch.Tensor
            Every entry, the template's non-float tensors and the tied-weight aliases.
        """
        out = {k: v.detach().clone().cpu() for k, v in self.unflatten(vec).items()}
        for name, tensor in self.fixed.items():
            out[name] = tensor.clone()
        for alias, target in self.aliases.items():
            out[alias] = out[target]
        return out

    def to_vector(self, model: ModelLike, *, dtype: torch.dtype = torch.float32,
                  check_finite: bool = True) -> torch.Tensor:
        """Flat vector of a model-like: ``nn.Module``, state_dict, or checkpoint path.

        A ``module.``/``_orig_mod.`` prefix (DataParallel, torch.compile) is removed from
        modules and mappings as from files.

        Parameters
        ----------
        model
            An ``nn.Module``, a state_dict, a checkpoint path, or a flat vector of this space
            (returned as is, detached, on CPU).
        dtype
            dtype of the vector.
        check_finite
            Refuse weights that are NaN or infinite.

        Returns
        -------
        torch.Tensor
            Flat vector of length :attr:`size`, on CPU.

        Raises
        ------
        ConfigError
            If a flat vector has the wrong shape.
        CheckpointError
            If a checkpoint cannot be read (see :func:`~landscape.space.checkpoints.load_state_dict`).
        ArchitectureMismatchError, NonFiniteWeightsError
            See :meth:`flatten`.
        """
        from .checkpoints import load_state_dict, strip_prefix

        if isinstance(model, torch.Tensor):
            if model.shape != (self.size,):
                raise ConfigError(f"a flat vector must have shape ({self.size},), got {tuple(model.shape)}")
            return model.detach().to("cpu", dtype)
        keys = [e.name for e in self.entries]
        if isinstance(model, nn.Module):
            return self.flatten(strip_prefix(model.state_dict(), keys), dtype=dtype, check_finite=check_finite,
                                source=type(model).__name__)
        if isinstance(model, Mapping):
            return self.flatten(strip_prefix(dict(model), keys), dtype=dtype, check_finite=check_finite)
        state = load_state_dict(model, template_keys=keys)
        return self.flatten(state, dtype=dtype, check_finite=check_finite, source=str(model))

    def stack(self, models: Iterable[ModelLike], *, dtype: torch.dtype = torch.float32,
              check_finite: bool = True) -> torch.Tensor:
        """Stacked flat vectors, shape (n_models, size).

        Parameters
        ----------
        models
            Model-likes (see :meth:`to_vector`).
        dtype
            dtype of the vectors.
        check_finite
            Refuse weights that are NaN or infinite.

        Returns
        -------
        torch.Tensor
            ``(n_models, size)`` on CPU.

        Raises
        ------
        ConfigError
            If no model is given.
        """
        vecs = [self.to_vector(m, dtype=dtype, check_finite=check_finite) for m in models]
        if not vecs:
            raise ConfigError("no models given")
        return torch.stack(vecs)

    # ----------------------------------------------------------------- geometry
    def dot(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Inner product over parameter entries (buffers excluded).

        Parameters
        ----------
        a, b
            Flat vectors (or batches of them, last dimension :attr:`size`).

        Returns
        -------
        torch.Tensor
            The float64 inner product (one per batch element).
        """
        m = self.param_mask.to(a.device)
        return (a[..., m].double() * b[..., m].double()).sum(-1)

    def norm(self, a: torch.Tensor) -> torch.Tensor:
        """Euclidean norm over parameter entries (buffers excluded).

        Parameters
        ----------
        a
            Flat vector (or a batch of them).

        Returns
        -------
        torch.Tensor
            The float64 norm (one per batch element).
        """
        return self.dot(a, a).sqrt()


def vector_digest(vec: torch.Tensor) -> str:
    """SHA-256 of a vector's bytes (dtype and shape included).

    Parameters
    ----------
    vec
        Any tensor (any device).

    Returns
    -------
    str
        Hexadecimal digest.
    """
    arr = vec.detach().cpu().contiguous()
    h = hashlib.sha256(f"{arr.dtype}:{tuple(arr.shape)}".encode())
    if arr.numel():
        h.update(arr.view(torch.uint8).numpy())  # the buffer itself: no copy of a model-sized vector
    return h.hexdigest()
