"""Linear interpolation paths between two models and pairwise barrier matrices.

The model at alpha is ``(1 - alpha) * a + alpha * b`` (FedGuCci Eq. 3/4 with w_2 = a,
w_1 = b). Barriers are properties of :class:`~landscape.results.PathResult`; their definitions
and sign conventions are in ``docs/barriers.md``.
"""
from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np
import torch

from ..evaluation.dry_run import estimate_points
from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError
from ..infra.estimate import JobEstimate
from ..infra.host_memory import check_fits, points_bytes
from ..results import BarrierMatrix, PathResult
from ..results.barriers import warn_nonfinite
from ..space.params import ModelLike
from ..space.points import PointSet
from ..space.subsets import ParamsLike, restrict_models
from .adaptive import ADAPTIVE, adaptive_search, search_tolerance

#: What a path function's ``alphas`` accepts: a count, the values, or ``"adaptive"``.
AlphasLike = int | Sequence[float] | np.ndarray | str


def alpha_grid(alphas: int | Sequence[float] | np.ndarray) -> np.ndarray:
    """``alphas`` evenly spaced points on [0, 1] (both included), or the given values.

    Parameters
    ----------
    alphas
        A number of points (at least 2), or the interpolation coefficients themselves (values
        outside [0, 1] extrapolate beyond the endpoints).

    Returns
    -------
    numpy.ndarray
        The grid, float64, one dimension.

    Raises
    ------
    ConfigError
        If a count is below 2, or the values are empty or not finite.
    """
    if isinstance(alphas, str):
        raise ConfigError(f"alphas={alphas!r} is not a grid: give a number of points (at least 2) or the alphas")
    if isinstance(alphas, (int, np.integer)):
        if alphas < 2:
            raise ConfigError("a path needs at least 2 alphas (the endpoints)")
        check_fits(points_bytes(int(alphas)), f"a path of alphas={int(alphas):,} points",
                   advice="choose fewer alphas")
        return np.linspace(0.0, 1.0, int(alphas))
    grid = np.asarray(alphas, dtype=np.float64).reshape(-1)
    if grid.size == 0 or not np.isfinite(grid).all():
        raise ConfigError("alphas must be a non-empty array of finite numbers")
    return grid


def interpolate(a: ModelLike, b: ModelLike, evaluator: PointEvaluator, *, alphas: AlphasLike = 21,
                align: str | None = None, tol: float | None = None, params: ParamsLike = None,
                dry_run: bool = False) -> PathResult | JobEstimate:
    """Loss and accuracy along the straight line from ``a`` (alpha=0) to ``b`` (alpha=1).

    The model at alpha is ``(1 - alpha) a + alpha b``; the barriers of FedGuCci Eq. 3/4 are
    properties of the result. BatchNorm statistics are interpolated too, unless the evaluator's
    BatchNorm mode says otherwise (``docs/batchnorm.md``).

    Parameters
    ----------
    a, b
        The endpoints: ``nn.Module``, state_dict, checkpoint path or flat vector of the
        evaluator's space.
    evaluator
        Evaluates the loss and accuracy of each point.
    alphas
        Number of evenly spaced points on [0, 1], the coefficients themselves (see
        :func:`alpha_grid`), or ``"adaptive"``: a coarse grid, then batched bisection where the
        barrier curves may still exceed their best value by more than ``tol``
        (:func:`landscape.geometry.adaptive.adaptive_search`, ``docs/barriers.md``).
    align
        ``None``, ``"weight"`` or ``"activation"``: first permute ``b``'s hidden units to match
        ``a`` (:func:`landscape.alignment.align`, Git Re-Basin), then interpolate: the barrier
        "modulo permutation". The barriers of the unaligned path are kept in
        ``spec["unaligned"]`` (before and after, from one call).
    tol
        Only with ``alphas="adaptive"`` (default 1e-3): tolerance on both barrier values, in
        their units (loss; relative accuracy drop).
    params
        Parameter subset that moves (``None``: every entry; ``"trainable"``: the parameters with
        ``requires_grad=True``, e.g. a LoRA adapter; or ``fnmatch`` patterns of parameter names,
        :mod:`landscape.space.subsets`). The rest stays at ``a``, and ``b`` must equal ``a``
        there; ``spec["params"]`` records the subset.
    dry_run
        Compute nothing: return what the path will cost (:mod:`landscape.evaluation.dry_run`).

    Returns
    -------
    PathResult or JobEstimate
        ``alphas``, ``loss`` and ``accuracy`` per point, with ``loss_barrier`` and
        ``accuracy_barrier`` (FedGuCci Eq. 3/4); with ``alphas="adaptive"`` the evaluated alphas,
        sorted, and the search's record in ``search`` (evaluations, gaps, convergence). With
        ``dry_run=True`` the :class:`~landscape.infra.estimate.JobEstimate`.

    Raises
    ------
    ConfigError
        If the grid is invalid, ``alphas`` is another string than ``"adaptive"``, ``tol`` is
        not above 0 or is given with a fixed grid, ``params`` matches nothing or is combined
        with ``align``, ``b`` differs from ``a`` outside ``params``, or ``dry_run`` is combined
        with ``align`` or ``alphas="adaptive"`` (what they evaluate depends on computed values).
    ArchitectureMismatchError
        If an endpoint does not fit the evaluator's model.

    Examples
    --------
    Two copies of one function ``f(x) = w2 w1 x``, ``a`` with ``w1 = w2 = 1`` and ``b`` with
    ``w1 = w2 = -1`` (a sign symmetry, like the permutation symmetry of hidden units). On the line
    ``w1 = w2 = 1 - 2 alpha``, so on the sample ``(x, y) = (1, 1)`` the squared error is
    ``L(alpha) = ((1 - 2 alpha)^2 - 1)^2``: 0 at both ends, where it equals the endpoints' own
    loss, and 1 at the midpoint, where the network is zero. The loss barrier (Eq. 3) is 1.

    >>> import torch, landscape
    >>> def net(w: float) -> torch.nn.Module:
    ...     model = torch.nn.Sequential(torch.nn.Linear(1, 1, bias=False), torch.nn.Linear(1, 1, bias=False))
    ...     for layer in model:
    ...         torch.nn.init.constant_(layer.weight, w)
    ...     return model
    >>> a, b = net(1.0), net(-1.0)
    >>> ev = landscape.Evaluator(a, (torch.ones(1, 1), torch.ones(1, 1)), loss="mse", dtype=torch.float64,
    ...                          progress=False)
    >>> path = landscape.interpolate(a, b, ev, alphas=5)
    >>> path.alphas
    array([0.  , 0.25, 0.5 , 0.75, 1.  ])
    >>> path.loss
    array([0.    , 0.5625, 1.    , 0.5625, 0.    ])
    >>> ev.evaluate([a, b]).loss
    array([0., 0.])
    >>> path.loss_barrier
    1.0
    """
    tol = search_tolerance(alphas, tol)
    grid = alpha_grid(alphas) if tol is None else None
    if dry_run:
        if align is not None or grid is None:
            raise ConfigError(f"dry_run cannot estimate {'align=' + repr(align) if align else 'alphas=' + repr(alphas)}"
                              " (what it evaluates depends on computed values); give a fixed grid without align")
        return estimate_points("interpolate", evaluator, lambda ev: interpolate(a, b, ev, alphas=grid, params=params))
    evaluator.warn_interpolated_batchnorm()
    va, vb = evaluator.vector(a), evaluator.vector(b)
    spec: dict = {"kind": "path", "evaluator": evaluator.fingerprint()}
    sub, _ = restrict_models(evaluator.space, params, [va, vb], ["model a", "model b"])
    index = None if sub is None else sub.index
    if sub is not None:
        if align is not None:
            raise ConfigError("align permutes the whole model and params= moves a subset: pass one of them")
        spec["params"] = sub.spec()
    if tol is not None:
        spec.update(alphas=ADAPTIVE, tol=tol)
    if align is not None:
        from ..alignment.align import aligned_vector

        before = interpolate(va, vb, evaluator, alphas=ADAPTIVE if grid is None else grid, tol=tol)
        spec.update(align=align, unaligned={"loss_barrier": before.loss_barrier,
                                            "accuracy_barrier": before.accuracy_barrier})
        vb = aligned_vector(vb, to=va, evaluator=evaluator, method=align)

    def evaluate(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return evaluator.evaluate_points(PointSet.line(va, vb, torch.from_numpy(points), index), reference=va,
                                         label="path")

    search: dict = {}
    if grid is None:
        grid, loss, acc, search = adaptive_search(evaluate, tol)
        warn_unresolvable(search, evaluator.num_targets)
    else:
        loss, acc = evaluate(grid)
    warn_nonfinite("path", loss, [f"alpha={a:g}" for a in grid])
    return PathResult(alphas=grid, loss=loss, accuracy=acc, search=search, spec=spec)


def warn_unresolvable(search: dict, targets: int) -> None:
    """Warn when an adaptive search stopped on alpha because ``tol`` is finer than the accuracy's step.

    The accuracy on ``targets`` samples moves in steps of ``1 / targets``: an accuracy barrier
    (FedGuCci Eq. 4) is not known more finely than that, and a tolerance below the step makes the
    search split intervals down to its resolution on alpha and end with ``converged=False``.

    Parameters
    ----------
    search : dict
        The search record of :func:`~landscape.geometry.adaptive.adaptive_search`.
    targets : int
        Number of targets the accuracy counts.
    """
    step = 1.0 / targets
    if search["stopped"] == "min_width" and search["accuracy_gap"] > search["tol"] and search["tol"] < step:
        warnings.warn(f"the adaptive search stopped at its resolution on alpha with the accuracy barrier's bound "
                      f"{search['accuracy_gap']:.2g} above tol={search['tol']:g}: the accuracy on {targets} "
                      f"targets moves in steps of 1/{targets} = {step:.2g}; pass tol >= {step:.2g} or more data",
                      UserWarning, stacklevel=3)


def barrier_matrix(models: Sequence[ModelLike], evaluator: PointEvaluator, *, alphas: AlphasLike = 11,
                   labels: Sequence[str] | None = None, tol: float | None = None,
                   params: ParamsLike = None) -> BarrierMatrix:
    """Loss and accuracy barriers (FedGuCci Eq. 3/4) of the path between every pair of models.

    Parameters
    ----------
    models
        At least two model-likes (``nn.Module``, state_dict, checkpoint path or flat vector).
    evaluator
        Evaluates the loss and accuracy of each point.
    alphas
        Grid of each path (see :func:`alpha_grid`; it must contain 0 and 1), or ``"adaptive"``
        (see :func:`interpolate`).
    labels
        One name per model (default ``"model i"``).
    tol
        Only with ``alphas="adaptive"``: the tolerance of each path's search (default 1e-3).
    params
        The parameters each path moves (see :func:`interpolate`); the models must agree outside them.

    Returns
    -------
    BarrierMatrix
        Symmetric ``(n, n)`` loss and accuracy barrier matrices (zero diagonal) and the labels;
        with ``alphas="adaptive"``, ``search`` holds the points evaluated in all and per pair,
        the largest gaps over the pairs and whether every pair converged.

    Raises
    ------
    ConfigError
        If there are fewer than two models, the number of labels differs from the number of
        models, the grid is invalid, or ``alphas``/``tol`` are invalid (see :func:`interpolate`).
    """
    tol = search_tolerance(alphas, tol)
    grid = alpha_grid(alphas) if tol is None else None
    vecs = [evaluator.vector(m) for m in models]
    n = len(vecs)
    if n < 2:
        raise ConfigError("a barrier matrix needs at least two models")
    labels = list(labels) if labels is not None else [f"model {i}" for i in range(n)]
    if len(labels) != n:
        raise ConfigError(f"{len(labels)} labels for {n} models")
    loss_b = np.zeros((n, n))
    acc_b = np.zeros((n, n))
    records = []
    for i in range(n):
        for j in range(i + 1, n):
            path = interpolate(vecs[i], vecs[j], evaluator, alphas=ADAPTIVE if grid is None else grid, tol=tol,
                               params=params)
            loss_b[i, j] = loss_b[j, i] = path.loss_barrier
            acc_b[i, j] = acc_b[j, i] = path.accuracy_barrier
            records.append(path.search)
    spec: dict = {"kind": "barrier_matrix", "alphas": ADAPTIVE if grid is None else grid.tolist(),
                  "evaluator": evaluator.fingerprint()}
    if tol is not None:
        spec["tol"] = tol
    if params is not None:
        spec["params"] = path.spec["params"]
    return BarrierMatrix(loss_barrier=loss_b, accuracy_barrier=acc_b, labels=labels,
                         search=_matrix_search(records) if records and records[0] else {}, spec=spec)


def _matrix_search(records: list[dict]) -> dict:
    """The record of a matrix's adaptive searches: evaluations in all and per pair, the worst gaps."""
    return {"method": ADAPTIVE, "tol": records[0]["tol"],
            "evaluations": sum(r["evaluations"] for r in records),
            "pair_evaluations": [r["evaluations"] for r in records],
            "loss_gap": float(np.max([r["loss_gap"] for r in records])),  # NaN if any pair overflowed
            "accuracy_gap": float(np.max([r["accuracy_gap"] for r in records])),
            "converged": all(r["converged"] for r in records)}
