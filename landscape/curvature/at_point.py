"""Curvature operators at a model: :func:`curvature_operator`, and the point it is built at.

The point is a model-like or a flat vector of the evaluator's space, with the buffers the
evaluator's BatchNorm mode gives it (:func:`with_bn_mode`; ``recompute`` re-estimates the running
statistics at the point). The kinds are registered in :data:`~.registry.OPERATOR_KINDS`:
``"hessian"`` (:mod:`.hessian`), ``"ggn"`` and ``"fisher"`` (:mod:`.gauss_newton`),
``"empirical_fisher"`` (:mod:`.empirical_fisher`), ``"kfac"`` and ``"ekfac"`` (:mod:`.kfac`), each
with the options its class declares (``kind_options=``, checked by :func:`resolve_kind_options`).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError
from ..space.params import ModelLike
from . import empirical_fisher, gauss_newton, hessian, kfac  # noqa: F401  (register the kinds)
from .operators import CurvatureOperator
from .registry import kind_options as checked_options
from .registry import operator_class

#: The public functions' keywords that set one kind's option, kept beside ``kind_options=``:
#: ``hvp`` (the Hessian's) and ``mc_samples`` (the Monte-Carlo Fisher's), each with the value that
#: means "not given" (that option's default), which every kind accepts. Every curvature result's
#: spec records both (a kind without the option records this value), as it has from the start.
ALIASES: dict[str, Any] = {"hvp": "auto", "mc_samples": 1}
#: ``kind_options=``: the curvature kind's own options by name, or None for its defaults.
KindOptions = Mapping[str, Any] | None


def curvature_operator(model: ModelLike | torch.Tensor, evaluator: PointEvaluator, *, kind: str = "hessian",
                       kind_options: KindOptions = None, params: Sequence[str] | str | None = None,
                       include_frozen: bool = False, hvp: str = "auto", mc_samples: int = 1, seed: int = 0,
                       check_determinism: bool = True, point_ready: bool = False) -> CurvatureOperator:
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
      of the per-sample loss itself (not of ``l_n / N``); not the Fisher (Kunstner et al. 2019);
    * ``"kfac"``, ``"ekfac"``: block-diagonal Kronecker-factored approximations of the GGN (or,
      with ``fisher_type``, of the Monte-Carlo or empirical Fisher), one block ``A (x) G`` per
      ``nn.Linear`` / ``nn.Conv2d`` layer (Martens & Grosse 2015), EKFAC with its eigenvalues
      re-fitted (George et al. 2018); with an exact ``inverse_matvec(v, damping)`` and
      ``eigenvalues()`` (:mod:`.kfac`).

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
        ``"hessian"``, ``"ggn"``, ``"empirical_fisher"``, ``"fisher"``, ``"kfac"`` or ``"ekfac"`` (any
        registered kind).
    kind_options
        The kind's own options, checked against its declaration (``Options`` of its class; tables
        in ``docs/api.md``): ``{"hvp": ...}`` for ``"hessian"``, ``{"mc_samples": ...}`` for
        ``"fisher"``, ``{"per_sample": ...}`` for ``"empirical_fisher"``, ``{"fisher_type": ...,
        "mc_samples": ...}`` for ``"kfac"`` and ``"ekfac"``; none for ``"ggn"``.
    params
        ``fnmatch`` patterns of the parameters to differentiate (default: all trainable ones).
    include_frozen
        Also differentiate parameters with ``requires_grad=False``.
    hvp
        Short for ``kind_options={"hvp": hvp}`` (how Hessian-vector products are computed:
        ``"auto"``, ``"forward-over-reverse"``, ``"reverse-over-reverse"`` or ``"retained"``); the
        default ``"auto"`` counts as not given.
    mc_samples
        Short for ``kind_options={"mc_samples": mc_samples}`` (labels drawn per input of the
        Fisher); the default 1 counts as not given.
    seed
        Seed of the kind's random choices (the Fisher's labels; unused by the other built-in kinds).
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
        An unknown ``kind`` (with the closest name), an option the kind does not declare (one line
        naming the kind and its options) or a bad value, a loss without a known output Hessian for
        ``"ggn"``/``"fisher"`` (cross-entropy, MSE and the token losses have one), or as for
        :class:`~.operators.CurvatureOperator`.

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
    options = resolve_kind_options(kind, kind_options, hvp=hvp, mc_samples=mc_samples)
    point = flat_point(model, evaluator)
    if not point_ready:
        point = with_bn_mode(point, point, evaluator)
    return operator_class(kind)(evaluator, point, params=params, include_frozen=include_frozen,
                                check_determinism=check_determinism, seed=seed, **options)


def resolve_kind_options(kind: str, kind_options: KindOptions = None, **aliases: Any) -> dict[str, Any]:
    """The options of ``kind``: ``kind_options`` and the given :data:`ALIASES`, checked (before any work).

    Parameters
    ----------
    kind : str
        A registered kind (:data:`~.registry.OPERATOR_KINDS`).
    kind_options : Mapping[str, Any], optional
        The kind's options by name.
    **aliases : Any
        Keywords of :data:`ALIASES` (``hvp``, ``mc_samples``); one at its "not given" value (or
        None) is left out, any other joins ``kind_options``.

    Returns
    -------
    dict[str, Any]
        Every option the kind declares (defaults filled), as its constructor takes them.

    Raises
    ------
    ConfigError
        An unknown kind (with the closest registered name), ``kind_options`` not a mapping, an
        alias that disagrees with ``kind_options``, an option the kind does not declare (naming the
        kind and its options) or a value of the wrong type or out of range.
    """
    if kind_options is not None and not isinstance(kind_options, Mapping):
        raise ConfigError(f"kind_options must be a mapping of the {kind!r} kind's options, got "
                          f"{type(kind_options).__name__}")
    values = dict(kind_options or {})
    for name, value in aliases.items():
        unset = ALIASES[name]
        if value is None or (type(value) is type(unset) and value == unset):
            continue
        if name in values and values[name] != value:
            raise ConfigError(f"{name}={value!r} disagrees with kind_options[{name!r}]={values[name]!r}; give it once")
        values[name] = value
    return checked_options(kind, values).to_dict()


def operator_options(kind: str, kind_options: KindOptions, include_frozen: bool, *, hvp: str = "auto",
                     mc_samples: int = 1) -> tuple[dict[str, Any], dict[str, Any]]:
    """The operator's entries of a curvature result's spec and key, and the kind's options, checked first.

    The spec records the kind as ``"operator"``, ``include_frozen``, both :data:`ALIASES`
    (``hvp``, ``mc_samples``; a kind without one records its "not given" value) and, under
    ``"kind_options"`` and only when there are some, the kind's other options that differ from
    their defaults: the entries of the built-in kinds at their defaults are those they have always
    had, so existing cache entries keep their keys.

    Parameters
    ----------
    kind : str
        The operator kind.
    kind_options, include_frozen, hvp, mc_samples
        As for :func:`~landscape.curvature.functions.hessian_eigen`.

    Returns
    -------
    tuple of dict
        ``({"operator": kind, "hvp": ..., "include_frozen": ..., "mc_samples": ..., ["kind_options": ...]},
        the kind's options with defaults filled)``.

    Raises
    ------
    ConfigError
        An unknown kind, an option it does not declare or a bad value (see :func:`resolve_kind_options`).
    """
    resolved = resolve_kind_options(kind, kind_options, hvp=hvp, mc_samples=mc_samples)
    defaults = operator_class(kind).Options.defaults()
    spec: dict[str, Any] = {"operator": kind, **ALIASES, "include_frozen": include_frozen}
    spec.update({name: value for name, value in resolved.items() if name in ALIASES})
    others = {name: value for name, value in resolved.items() if name not in ALIASES and value != defaults[name]}
    if others:
        spec["kind_options"] = others
    return spec, resolved


def flat_point(model: ModelLike | torch.Tensor, evaluator: PointEvaluator) -> torch.Tensor:
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


def with_bn_mode(point: torch.Tensor, reference: torch.Tensor, evaluator: PointEvaluator) -> torch.Tensor:
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
