"""Parameter subsets: the part of a model that a path, plane or group moves.

``params=`` of the geometry functions selects the parameters that move; every other entry of
the flat vector (unselected parameters, buffers, and the template's non-float tensors) stays at
the reference model's value (the first model, or the plane's centre). A :class:`Subspace`
holds the selection and offers the geometry interface of a
:class:`~landscape.space.params.ParameterSpace` (``entries``, ``size``, ``param_mask``,
``dot``, ``norm``) over vectors of the subset's length only, so directions, plane bases and
stored points cost the subset, not the model. Point sets carry :attr:`Subspace.index` to write
their short vectors into one full-size base (:class:`~landscape.space.points.PointSet`).

Accepted ``params``:

* ``None`` -- the whole model (no subspace);
* ``"trainable"`` -- the parameters with ``requires_grad=True`` (for a peft LoRA model, the
  adapters and ``modules_to_save``);
* a pattern or a list of ``fnmatch`` patterns of parameter names, frozen or not.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import torch

from ..infra.errors import ConfigError
from .params import ParameterSpace, TensorSpec

#: What ``params=`` accepts: None (everything), ``"trainable"``, or name patterns.
ParamsLike = str | Sequence[str] | None
#: ``params="trainable"``: the parameters with ``requires_grad=True``.
TRAINABLE = "trainable"


class Subspace:
    """The selected parameter entries of a space, as short flat vectors.

    Parameters
    ----------
    space
        The full parameter space.
    params
        ``"trainable"``, or a pattern or list of ``fnmatch`` patterns of parameter names.

    Attributes
    ----------
    space
        The full space.
    params
        The selection as given (a list of patterns, or ``"trainable"``).
    entries
        The selected tensors, with offsets inside the subset's vector (all parameters).
    full_entries
        The same tensors with their offsets in the full vector.
    index
        Positions of the subset's entries in the full vector (int64, length :attr:`size`).
    size
        Length of the subset's vectors.
    param_mask
        All True (every entry of a subset is a parameter).

    Raises
    ------
    ConfigError
        Nothing is selected (the message lists the first parameter names).
    """

    def __init__(self, space: ParameterSpace, params: str | Sequence[str]):
        self.space = space
        if params == TRAINABLE:
            self.params: str | list[str] = TRAINABLE
            mask = space.select(None, include_frozen=False)
        else:
            self.params = [params] if isinstance(params, str) else list(params)
            mask = space.select(self.params, include_frozen=True)
        self.full_entries = tuple(e for e in space.entries if bool(mask[e.offset]))
        local: list[TensorSpec] = []
        offset = 0
        for e in self.full_entries:
            local.append(TensorSpec(e.name, e.shape, e.kind, offset, e.numel))
            offset += e.numel
        self.entries = tuple(local)
        self.size = offset
        self.index = torch.nonzero(mask).flatten()
        self.param_mask = torch.ones(offset, dtype=torch.bool)

    @property
    def names(self) -> list[str]:
        """Names of the selected tensors, in the order of the vector."""
        return [e.name for e in self.entries]

    def digest(self) -> str:
        """Digest of the selected names and shapes (names the subset in specs and cache keys).

        Returns
        -------
        str
            The first 16 hexadecimal digits of a SHA-256.
        """
        text = ";".join(f"{e.name}:{e.shape}" for e in self.entries)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def spec(self) -> dict:
        """What a result records about its subset.

        Returns
        -------
        dict
            ``params`` (as given), ``tensors`` (number selected), ``size`` (entries) and ``digest``.
        """
        return {"params": self.params, "tensors": len(self.entries), "size": self.size, "digest": self.digest()}

    def restrict(self, vec: torch.Tensor) -> torch.Tensor:
        """The subset's entries of full flat vector(s) (last dimension the full size).

        Parameters
        ----------
        vec
            Full flat vector(s).

        Returns
        -------
        torch.Tensor
            A copy, last dimension :attr:`size`.
        """
        return vec[..., self.index.to(vec.device)]

    def unflatten(self, vec: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views into subset vector(s) keyed by parameter name.

        Parameters
        ----------
        vec
            Vector(s), last dimension :attr:`size`.

        Returns
        -------
        dict of str to torch.Tensor
            One view per selected tensor (no copy).
        """
        return {e.name: e.view(vec) for e in self.entries}

    def embed(self, vecs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        """Full vectors: ``reference`` with the subset's entries replaced by ``vecs``.

        Parameters
        ----------
        vecs
            Subset vector(s), last dimension :attr:`size`.
        reference
            ``(D,)`` full flat vector (the model outside the subset).

        Returns
        -------
        torch.Tensor
            A new tensor, the shape of ``vecs`` with last dimension the full size, the dtype of
            ``vecs``.
        """
        full = reference.to(vecs.dtype).expand(*vecs.shape[:-1], -1).clone()
        full[..., self.index] = vecs
        return full

    def check_fixed(self, reference: torch.Tensor, others: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Refuse models that differ from the reference outside the subset.

        Only the subset moves, so a model differing elsewhere would be analysed as a model it
        is not.

        Parameters
        ----------
        reference
            The reference's full flat vector (first model, or centre).
        others
            ``(label, full flat vector)`` of the other models.

        Raises
        ------
        ConfigError
            Naming the first model and the first tensor (in the space's order) that differ.
        """
        selected = {e.name for e in self.entries}
        for label, vec in others:
            for e in self.space.entries:
                sl = slice(e.offset, e.offset + e.numel)
                if e.name not in selected and not torch.equal(vec[sl], reference[sl]):
                    raise ConfigError(f"{label} differs from the reference model outside params={self.params!r} "
                                      f"(first differing tensor: {e.name}); only the selected parameters move, "
                                      "so widen params to cover it or pass params=None")

    def dot(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Float64 inner product of subset vectors (every entry is a parameter).

        Parameters
        ----------
        a, b
            Vectors of length :attr:`size` (or batches of them).

        Returns
        -------
        torch.Tensor
        """
        return (a.double() * b.double()).sum(-1)

    def norm(self, a: torch.Tensor) -> torch.Tensor:
        """Float64 Euclidean norm of subset vector(s).

        Parameters
        ----------
        a
            Vector(s) of length :attr:`size`.

        Returns
        -------
        torch.Tensor
        """
        return self.dot(a, a).sqrt()


def subspace(space: ParameterSpace, params: ParamsLike) -> Subspace | None:
    """The :class:`Subspace` of ``params``, or None for the whole space.

    Parameters
    ----------
    space
        The full parameter space.
    params
        ``None``, ``"trainable"``, or a pattern or list of ``fnmatch`` patterns.

    Returns
    -------
    Subspace or None

    Raises
    ------
    ConfigError
        Nothing matches.
    """
    return None if params is None else Subspace(space, params)


def restrict_models(space: ParameterSpace, params: ParamsLike, vecs: Sequence[torch.Tensor],
                    labels: Sequence[str]) -> tuple[Subspace | None, list[torch.Tensor]]:
    """The subspace of ``params`` and the models' vectors in it, refusing models that differ outside it.

    Parameters
    ----------
    space
        The full parameter space.
    params
        ``None``, ``"trainable"``, or a pattern or list of ``fnmatch`` patterns.
    vecs
        Full flat vectors; the first is the reference whose other entries stay fixed.
    labels
        One name per vector, for the error message.

    Returns
    -------
    tuple
        The :class:`Subspace` (None for ``params=None``) and the vectors restricted to it
        (the vectors themselves for None).

    Raises
    ------
    ConfigError
        Nothing matches ``params``, or a model differs from the first outside the subset.
    """
    sub = subspace(space, params)
    if sub is None:
        return None, list(vecs)
    sub.check_fixed(vecs[0], list(zip(labels[1:], vecs[1:])))
    return sub, [sub.restrict(v) for v in vecs]


def recorded_subspace(space: ParameterSpace, record: dict, what: str) -> Subspace:
    """The subset a result recorded (``result.spec["params"]``), rebuilt in ``space``.

    Parameters
    ----------
    space
        The evaluator's parameter space.
    record
        :meth:`Subspace.spec` as the result stored it.
    what
        The result, for the message (``"this curve"``).

    Returns
    -------
    Subspace

    Raises
    ------
    ConfigError
        The patterns select other tensors in ``space`` than in the result's model.
    """
    sub = Subspace(space, record["params"])
    if sub.digest() != record["digest"]:
        raise ConfigError(f"params={record['params']!r} selects other tensors in this evaluator's model than in "
                          f"{what}'s; use the evaluator {what} was computed with")
    return sub


def entries_at(space: ParameterSpace, index: torch.Tensor) -> list[tuple[TensorSpec, int]]:
    """The tensors of ``space`` whose entries ``index`` holds, with where each starts among them.

    Parameters
    ----------
    space
        The full parameter space.
    index
        Sorted flat positions covering whole tensors (a parameter subset's index).

    Returns
    -------
    list[tuple[TensorSpec, int]]
        Each covered tensor and the position of its first entry in ``index``.

    Raises
    ------
    ValueError
        If ``index`` covers part of a tensor.
    """
    positions = index.cpu()
    found = []
    for e in space.entries:
        at = int(torch.searchsorted(positions, e.offset))
        if at < len(positions) and int(positions[at]) == e.offset:
            if at + e.numel > len(positions) or int(positions[at + e.numel - 1]) != e.offset + e.numel - 1:
                raise ValueError(f"the index covers part of {e.name} only")
            found.append((e, at))
    return found
