"""Curvature operators at a model: :func:`curvature_operator`, and the point it is built at.

The point is a model-like or a flat vector of the evaluator's space, with the buffers the
evaluator's BatchNorm mode gives it (:func:`with_bn_mode`; ``recompute`` re-estimates the running
statistics at the point). The kinds are registered in :data:`~.registry.OPERATOR_KINDS`:
``"hessian"`` (:mod:`.operators`), ``"ggn"`` and ``"fisher"`` (:mod:`.gauss_newton`),
``"empirical_fisher"`` (:mod:`.empirical_fisher`).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ..infra.errors import ConfigError
from ..space.params import ModelLike
from . import empirical_fisher, gauss_newton  # noqa: F401  (register the kinds)
from .gauss_newton import check_mc_samples
from .operators import HVP_MODES, CurvatureOperator
from .registry import OPERATOR_KINDS


def curvature_operator(model: ModelLike | torch.Tensor, evaluator: Any, *, kind: str = "hessian",
                       params: Sequence[str] | str | None = None, include_frozen: bool = False,
                       hvp: str = "auto", mc_samples: int = 1, seed: int = 0, check_determinism: bool = True,
                       point_ready: bool = False) -> CurvatureOperator:
    r"""A curvature matrix of the evaluator's mean loss at ``model``, as a symmetric linear operator.

    The loss is ``L(theta) = (1/N) sum_n l(f(x_n; theta), y_n)`` over all of the evaluator's data,
    ``theta`` the selected parameters (the rest, and BatchNorm statistics, fixed; eval mode).
    With ``J_n = d f(x_n) / d theta`` and ``g_n = d l_n / d theta``:

    * ``"hessian"``: ``H = d^2 L / d theta^2``;
    * ``"ggn"``: ``G = (1/N) sum_n J_n^T H_n J_n``, ``H_n`` the loss's Hessian with respect to the
      outputs (Schraudolph 2002): ``diag(p) - p p^T`` for cross-entropy, ``2 I`` for the summed
      squared error;
    * ``"fisher"``: ``(1/N) sum_n (1/M) sum_m J_n^T s_nm s_nm^T J_n`` with ``s_nm`` the output
      gradient of the loss at a label drawn from the model's predictive distribution,
      ``M = mc_samples`` labels per input, seeded; its expectation is the GGN for cross-entropy
      and MSE (Martens 2020);
    * ``"empirical_fisher"``: ``(1/N) sum_n g_n g_n^T`` at the data's labels, ``g_n`` the gradient
      of the per-sample loss itself (not of ``l_n / N``); not the Fisher (Kunstner et al. 2019).

    The operator has ``size``, ``matvec(v)`` (a torch vector of length ``size`` in, the product
    out, in the evaluator's dtype and on its device), ``to_scipy()`` (a float64
    ``scipy.sparse.linalg.LinearOperator``), ``dense()`` (small sizes), ``loss()`` and
    ``gradient()``; the solvers of :mod:`landscape.curvature` (``lanczos_top``, ``hutchpp``,
    ``slq``, ...) take it directly. Definitions and conventions: ``docs/curvature-operators.md``.

    Parameters
    ----------
    model
        A model-like or a flat vector of the evaluator's space.
    evaluator
        The :class:`~landscape.Evaluator` whose loss gives the curvature.
    kind
        ``"hessian"``, ``"ggn"``, ``"empirical_fisher"`` or ``"fisher"`` (any registered kind).
    params
        ``fnmatch`` patterns of the parameters to differentiate (default: all trainable ones).
    include_frozen
        Also differentiate parameters with ``requires_grad=False``.
    hvp
        How Hessian-vector products are computed (``kind="hessian"`` only): ``"auto"``,
        ``"forward-over-reverse"``, ``"reverse-over-reverse"`` or ``"retained"``.
    mc_samples
        Labels drawn per input (``kind="fisher"`` only).
    seed
        Seed of the drawn labels (``kind="fisher"``; unused otherwise).
    check_determinism
        Refuse a model whose outputs differ between two identical calls (dropout in eval mode).
    point_ready
        The flat vector already carries the buffers of the evaluator's BatchNorm mode.

    Returns
    -------
    CurvatureOperator
        Its ``kind`` and ``mode`` (how products are computed) say what it is.

    Raises
    ------
    ConfigError
        An unknown ``kind`` (with the closest name), an option that does not apply to the kind,
        a loss without a known output Hessian for ``"ggn"``/``"fisher"`` (cross-entropy, MSE and
        the token losses have one), or as for :class:`~.operators.CurvatureOperator`.

    Examples
    --------
    A linear least-squares model: the GGN equals the Hessian, ``(1/N) sum_n 2 x_n x_n^T``.

    >>> import numpy as np, torch, landscape
    >>> model = torch.nn.Linear(2, 1, bias=False)
    >>> data = (torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([[0.0], [1.0]]))
    >>> ev = landscape.Evaluator(model, data, loss="mse", dtype=torch.float64, progress=False)
    >>> ggn = landscape.curvature_operator(model, ev, kind="ggn")
    >>> ggn.size, ggn.kind, ggn.mode
    (2, 'ggn', 'jvp-vjp')
    >>> ggn.dense()
    tensor([[1., 0.],
            [0., 4.]], dtype=torch.float64)
    >>> torch.allclose(landscape.curvature_operator(model, ev).dense(), ggn.dense())
    True
    >>> ggn.to_scipy() @ np.array([1.0, 1.0])
    array([1., 4.])
    >>> landscape.curvature.lanczos_top(ggn, 1, generator=torch.Generator().manual_seed(0)).values
    array([4.])
    """
    cls = operator_class(kind, hvp=hvp, mc_samples=mc_samples)
    point = flat_point(model, evaluator)
    if not point_ready:
        point = with_bn_mode(point, point, evaluator)
    options: dict[str, Any] = {"params": params, "include_frozen": include_frozen,
                               "check_determinism": check_determinism}
    if kind == "hessian":
        options["mode"] = hvp
    if kind == "fisher":
        options.update(mc_samples=mc_samples, seed=seed)
    return cls(evaluator, point, **options)


def operator_class(kind: str, *, hvp: str = "auto", mc_samples: int = 1) -> type[CurvatureOperator]:
    """The registered class of ``kind``, the kind-specific options checked (before any work).

    Parameters
    ----------
    kind : str
        A registered kind (:data:`~.registry.OPERATOR_KINDS`).
    hvp : str
        Must be ``"auto"`` unless ``kind="hessian"`` (then one of ``HVP_MODES``).
    mc_samples : int
        Must be 1 unless ``kind="fisher"`` (then an integer in ``[1, MAX_MC_SAMPLES]``).

    Returns
    -------
    type
        The operator class.

    Raises
    ------
    ConfigError
        An unknown kind (one line, with the closest registered name), or an option that does not
        apply to it.
    """
    if not isinstance(kind, str):
        raise ConfigError(f"kind must be a string, one of {', '.join(OPERATOR_KINDS.names())}; got {kind!r}")
    cls = OPERATOR_KINDS.get(kind)
    if hvp not in HVP_MODES:
        raise ConfigError(f"hvp must be one of {HVP_MODES}, got {hvp!r}")
    if kind != "hessian" and hvp != "auto":
        raise ConfigError(f"hvp={hvp!r} sets how Hessian-vector products are computed; it does not apply to "
                          f"kind={kind!r} (leave hvp='auto')")
    if kind == "fisher":
        check_mc_samples(mc_samples)
    elif mc_samples != 1:
        raise ConfigError(f"mc_samples={mc_samples!r} is the number of labels drawn per input of the Monte-Carlo "
                          f"Fisher; it does not apply to kind={kind!r} (use kind='fisher')")
    return cls


def flat_point(model: ModelLike | torch.Tensor, evaluator: Any) -> torch.Tensor:
    """Flat float64 CPU vector of a model-like (a flat tensor is checked and used as is).

    Parameters
    ----------
    model
        Model-like or flat vector.
    evaluator
        Gives the parameter space.

    Returns
    -------
    torch.Tensor
    """
    if isinstance(model, torch.Tensor):
        if model.shape != (evaluator.space.size,):
            raise ConfigError(f"a flat vector must have shape ({evaluator.space.size},), got {tuple(model.shape)}")
        return model.detach().to("cpu", torch.float64)
    return evaluator.vector(model)


def with_bn_mode(point: torch.Tensor, reference: torch.Tensor, evaluator: Any) -> torch.Tensor:
    """``point`` with the buffers the evaluator's BatchNorm mode gives it (``reference`` for ``keep``).

    Parameters
    ----------
    point, reference
        Flat float64 CPU vectors.
    evaluator
        The evaluator.

    Returns
    -------
    torch.Tensor
        Flat float64 CPU vector.
    """
    if evaluator.bn == "interpolate" or not evaluator.space.has_buffers:
        return point
    ref = reference.to(evaluator.device, evaluator.dtype)
    fixed = evaluator.apply_bn_mode(point.to(evaluator.device, evaluator.dtype).unsqueeze(0), ref)
    return fixed[0].detach().to("cpu", torch.float64)
