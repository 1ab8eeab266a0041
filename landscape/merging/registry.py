"""The merge methods by name: each one's options, its rule for one tensor, and what it needs.

A method is a :class:`MergeMethod` registered in :data:`METHODS`, one module of
:mod:`landscape.merging.methods` each (``mean``, ``greedy_soup``, ``task_arithmetic``, ``ties``,
``dare``, ``slerp``); :func:`landscape.merge` looks it up by name, validates its options with the
method's own option set, and applies its rule tensor by tensor, so a new method is one module
there.

A rule sees the same tensor of every merged model, stacked: ``rule(thetas, base, weights, options,
generator)`` with ``thetas`` of shape ``(n, *shape)`` in the computation dtype (at least float32),
``base`` that tensor of the base model (None for methods without one), ``weights`` the ``n``
per-model coefficients as given (None when not given) and a ``torch.Generator`` for the methods
that draw (seeded once per merge and used in the order of the tensors' names).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..infra.options import Options
from ..infra.registry import Registry

#: ``rule(thetas, base, weights, options, generator) -> merged tensor`` (see the module docstring).
Rule = Callable[[torch.Tensor, "torch.Tensor | None", "torch.Tensor | None", Any, torch.Generator], torch.Tensor]
#: ``select(models, labels, evaluator, options) -> (indices of the models merged, record)``.
Select = Callable[..., tuple[list[int], dict[str, Any]]]


@dataclass(frozen=True)
class MergeMethod:
    """A merge method.

    Attributes
    ----------
    options : type[Options]
        Its option set (validated from ``landscape.merge``'s keyword arguments).
    rule : Rule
        The merged value of one tensor.
    source : str
        The paper and the equation or algorithm the rule follows.
    needs_base : bool
        It merges task vectors ``theta_i - base``: ``base=`` is required.
    models : tuple[int, int | None]
        Least and most number of models (None: no upper bound).
    weights : str
        What ``weights=`` means for it (empty: it takes none).
    nonnegative_weights : bool
        Its weights are normalised to sum to one: they must be non-negative and not all zero.
    select : Select or None
        A step that picks the models merged before the rule runs (greedy soup).
    """

    options: type[Options]
    rule: Rule
    source: str
    needs_base: bool = False
    models: tuple[int, int | None] = (1, None)
    weights: str = ""
    nonnegative_weights: bool = False
    select: Select | None = None


#: Every merge method by name; discovery imports every module of :mod:`landscape.merging.methods`.
METHODS: Registry[MergeMethod] = Registry("merge method", package="landscape.merging.methods")


def task_vectors(thetas: torch.Tensor, base: torch.Tensor | None) -> torch.Tensor:
    """``tau_i = theta_i - base`` for every model (Ilharco et al. 2023, Sec. 2).

    Parameters
    ----------
    thetas
        ``(n, *shape)``: one tensor of every model.
    base
        The same tensor of the base model.

    Returns
    -------
    torch.Tensor
        ``(n, *shape)``.
    """
    assert base is not None  # the engine refuses methods with needs_base and no base
    return thetas - base


def per_model(weights: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """Per-model coefficients shaped to multiply ``like`` (``(n, *shape)``); ones when not given.

    Parameters
    ----------
    weights
        ``(n,)`` coefficients, or None.
    like
        The stacked tensors they multiply.

    Returns
    -------
    torch.Tensor
        ``(n, 1, ..., 1)`` in ``like``'s dtype and device.
    """
    w = torch.ones(like.shape[0]) if weights is None else weights
    return w.to(like.device, like.dtype).reshape(-1, *([1] * (like.dim() - 1)))
