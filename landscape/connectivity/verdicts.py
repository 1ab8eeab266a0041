"""Claim checks: "connected modulo permutation" and "connected by a curve", as :class:`landscape.Verdict`.

* :func:`connected_modulo_permutation` -- Entezari et al. (2022), Conjecture 1, and Git Re-Basin
  (Ainsworth et al. 2023), section 4: once the hidden units of ``b`` are permuted to match ``a``,
  the linear barrier (FedGuCci Eq. 3/4) is small. Reported: the barrier before alignment,
  after it, and after alignment plus REPAIR (Jordan et al. 2022) when data are given.
* :func:`connected_by_curve` -- Garipov et al. (2018), Draxler et al. (2018): a learned curve
  joins ``a`` and ``b`` with a small barrier even where the straight line has a large one.
"""
from __future__ import annotations

from typing import Any, Sequence

from landscape import ConfigError, Evaluator, PathResult, Verdict, interpolate

from .align import as_module, match
from .curves import curve
from .repair import repaired_interpolate

METRICS = ("accuracy", "loss")
DEFAULT_THRESHOLD = 0.05


def _barrier(path: Any, metric: str) -> float:
    return path.accuracy_barrier if metric == "accuracy" else path.loss_barrier


def connected_modulo_permutation(a: Any, b: Any, evaluator: Evaluator, *, method: str = "weight", data: Any = None,
                                 repair: bool = True, threshold: float = DEFAULT_THRESHOLD, metric: str = "accuracy",
                                 alphas: int | Sequence[float] = 21, seed: int = 0) -> Verdict:
    """Holds when the linear barrier between ``a`` and ``b`` aligned to it is ``<= threshold``.

    Parameters
    ----------
    a, b : model-likes of the evaluator's architecture.
    evaluator : measures the paths.
    method : ``"weight"`` or ``"activation"`` matching (:func:`~.align.match`; activation needs data).
    data : training data for activation matching and for REPAIR.
    repair : also report the barrier after alignment plus REPAIR (needs data); the verdict holds
        if either the aligned or the aligned-and-repaired barrier is below the threshold.
    threshold, metric : barrier threshold on Eq. 4 (``"accuracy"``) or Eq. 3 (``"loss"``).
    alphas : path grid.
    seed : weight matching's sweep order.

    Returns
    -------
    Verdict
        ``numbers``: barriers before/after (both metrics), units moved, alignment seconds;
        ``results["paths"]``: the PathResults.
    """
    if metric not in METRICS:
        raise ConfigError(f"metric must be one of {METRICS}, got {metric!r}")
    template = evaluator.module
    found = match(b, to=a, data=data, method=method, seed=seed, template=template)
    aligned = found.apply(as_module(b, template))
    paths: dict[str, PathResult] = {"before": interpolate(a, b, evaluator, alphas=alphas),
                                    "aligned": interpolate(a, aligned, evaluator, alphas=alphas)}
    if repair and data is not None:
        paths["aligned + REPAIR"] = repaired_interpolate(a, aligned, evaluator, data=data, alphas=alphas)
    numbers: dict[str, Any] = {}
    for label, path in paths.items():
        numbers[f"loss_barrier[{label}]"] = path.loss_barrier
        numbers[f"accuracy_barrier[{label}]"] = path.accuracy_barrier
    numbers.update({"units_moved": found.moved_units, "alignment_seconds": found.seconds})
    after = min(_barrier(p, metric) for k, p in paths.items() if k != "before")
    before = _barrier(paths["before"], metric)
    holds = after <= threshold
    best = min((k for k in paths if k != "before"), key=lambda k: _barrier(paths[k], metric))
    reason = (f"{metric} barrier {before:.4g} before alignment, {after:.4g} {best} "
              f"({'<=' if holds else '>'} {threshold:g})")
    return Verdict(kind="connected_modulo_permutation", status="holds" if holds else "fails", reason=reason,
                   claim="Connected modulo permutation: after aligning the hidden units of b to a, the linear "
                         "path has no barrier", numbers=numbers,
                   thresholds={"metric": metric, "threshold": threshold, "method": method},
                   results={"paths": paths},
                   reference="Entezari et al. 2022 (Conjecture 1); Ainsworth et al. 2023 (Git Re-Basin); "
                             "Jordan et al. 2022 (REPAIR)")


def connected_by_curve(a: Any, b: Any, evaluator: Evaluator, *, train_data: Any, kind: str = "bezier",
                       threshold: float = DEFAULT_THRESHOLD, metric: str = "accuracy", **training: Any) -> Verdict:
    """Holds when a learned curve (:func:`~.curves.curve`) joins ``a`` and ``b`` with barrier ``<= threshold``.

    Parameters
    ----------
    a, b, evaluator : endpoints and the evaluator measuring the curve and the line.
    train_data : data the curve is trained on.
    kind : ``"bezier"`` or ``"polychain"``.
    threshold, metric : barrier threshold on Eq. 4 (``"accuracy"``) or Eq. 3 (``"loss"``), with
        the curve parameter ``t`` in place of alpha.
    training : options of :func:`~.curves.curve` (epochs, lr, bends, points, seed, ...).

    Returns
    -------
    Verdict
        ``numbers``: curve and line barriers (both metrics) and maximum losses;
        ``results["curve"]``: the CurveResult.
    """
    if metric not in METRICS:
        raise ConfigError(f"metric must be one of {METRICS}, got {metric!r}")
    result = curve(a, b, evaluator, kind=kind, train_data=train_data, **training)
    value = result.accuracy_barrier if metric == "accuracy" else result.loss_barrier
    line = result.line_accuracy_barrier if metric == "accuracy" else result.line_loss_barrier
    holds = value <= threshold
    numbers = {"curve_loss_barrier": result.loss_barrier, "line_loss_barrier": result.line_loss_barrier,
               "curve_accuracy_barrier": result.accuracy_barrier,
               "line_accuracy_barrier": result.line_accuracy_barrier,
               "curve_max_loss": float(result.loss.max()), "line_max_loss": float(result.line_loss.max())}
    return Verdict(kind="connected_by_curve", status="holds" if holds else "fails",
                   reason=f"{kind} curve {metric} barrier {value:.4g} {'<=' if holds else '>'} {threshold:g} "
                          f"(straight line {line:.4g})",
                   claim=f"Connected by a curve: a learned {kind} curve joins a and b without a barrier",
                   numbers=numbers, thresholds={"metric": metric, "threshold": threshold, "kind": kind},
                   results={"curve": result},
                   reference="Garipov et al. 2018 (section 3.2); Draxler et al. 2018")
