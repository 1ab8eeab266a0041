"""The proximal term ``c/2 ||w - w_anchor||^2`` that FedProx, Ditto, FLOCO+ and LSS share.

FedProx (Li et al., MLSys 2020, Eq. 2) adds ``mu/2 ||w - w^t||^2`` to every client's loss;
Ditto (Li et al., ICML 2021, Eq. 2) and FLOCO+'s personal models add
``lambda/2 ||v_k - w^t||^2``; LSS measures its affinity and diversity with the same squared
distance between models. The norm runs over the tensors of the first argument (the trainable
leaves), so buffers such as BatchNorm statistics never enter it.

>>> import torch
>>> w = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0])}
>>> anchor = {"a": torch.zeros(2), "b": torch.ones(1)}
>>> float(squared_distance(w, anchor))           # 1 + 4 + 4
9.0
>>> float(proximal_term(w, anchor, 0.5))         # 0.5 / 2 * 9
2.25
"""
from __future__ import annotations

from typing import Mapping

import torch
from torch import Tensor

from .contexts import State


def squared_distance(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> Tensor:
    """``sum_j ||a_j - b_j||^2`` over the tensors ``j`` of ``a``.

    Parameters
    ----------
    a : Mapping[str, Tensor]
        The model whose tensors the sum runs over (by name).
    b : Mapping[str, Tensor]
        A model holding at least the names of ``a``.

    Returns
    -------
    Tensor
        The scalar squared distance (differentiable in both arguments).
    """
    return torch.as_tensor(sum(((t - b[n]) ** 2).sum() for n, t in a.items()))


def proximal_term(params: Mapping[str, Tensor], anchor: Mapping[str, Tensor], coef: float) -> Tensor:
    """The proximal term ``coef/2 sum_j ||w_j - anchor_j||^2`` (FedProx Eq. 2, Ditto Eq. 2).

    Parameters
    ----------
    params : Mapping[str, Tensor]
        The trainable tensors ``w`` by name.
    anchor : Mapping[str, Tensor]
        The model they are pulled to (the received global model).
    coef : float
        FedProx's ``mu``, Ditto's and FLOCO+'s ``lambda``.

    Returns
    -------
    Tensor
        The scalar term.
    """
    return 0.5 * coef * squared_distance(params, anchor)


def proximal_gradient(params: Mapping[str, Tensor], anchor: Mapping[str, Tensor], coef: float) -> State:
    """The gradient of :func:`proximal_term` in ``params``: ``coef (w_j - anchor_j)`` per tensor.

    Computed directly, without a graph: :func:`~fl.algorithms.sgd.local_sgd` adds it to the data
    loss's gradient (its ``proximal`` argument), at a fraction of the cost of differentiating the
    term with autograd (``d/dw coef/2 ||w - a||^2 = coef (w - a)``; the factors 1/2 and 2 are exact
    in floating point). Where each tensor enters the forward pass once, the step is autograd's bit
    for bit; a tensor used twice (tied or reused weights) gets its gradient pieces summed in
    another order, which can differ in the last bit.

    Parameters
    ----------
    params : Mapping[str, Tensor]
        The trainable tensors ``w`` by name.
    anchor : Mapping[str, Tensor]
        The model they are pulled to.
    coef : float
        The term's coefficient.

    Returns
    -------
    State
        One gradient tensor per name of ``params``.

    Examples
    --------
    >>> w = {"a": torch.tensor([1.0, 2.0])}
    >>> proximal_gradient(w, {"a": torch.zeros(2)}, 0.5)["a"].tolist()
    [0.5, 1.0]
    """
    with torch.no_grad():
        return {n: (t - anchor[n]) * coef for n, t in params.items()}
