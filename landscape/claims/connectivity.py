"""Claim checks: "connected modulo permutation" and "connected by a curve", as :class:`landscape.Verdict`.

* :func:`connected_modulo_permutation` -- Entezari et al. (2022), Conjecture 1, and Git Re-Basin
  (Ainsworth et al. 2023), section 4: once the hidden units of ``b`` are permuted to match ``a``,
  the linear barrier (FedGuCci Eq. 3/4) is small. Reported: the barrier before alignment,
  after it, and after alignment plus REPAIR (Jordan et al. 2022) when data are given.
* :func:`group_connected_modulo_permutation` -- the same for a group of models (FedGuCci
  Definition 3.6, Eq. 9/10, group barrier around the centroid) after aligning them to a
  reference or to each other (MergeMany).
* :func:`connected_by_curve` -- Garipov et al. (2018), Draxler et al. (2018): a learned curve
  joins ``a`` and ``b`` with a small barrier even where the straight line has a large one.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..alignment.align import align_group, as_module, match
from ..connectivity.curves import curve
from ..connectivity.repair import repaired_interpolate
from ..evaluation.protocol import PointEvaluator
from ..geometry.groups import group_barrier
from ..geometry.paths import interpolate
from ..infra.errors import ConfigError
from ..results.barriers import DEFAULT_THRESHOLD, METRICS
from ..results.geometry import PathResult
from .outcome import Outcome
from .verdict import Verdict


def _barrier(path: Any, metric: str) -> float:
    return path.accuracy_barrier if metric == "accuracy" else path.loss_barrier


def connected_modulo_permutation(a: Any, b: Any, evaluator: PointEvaluator, *, method: str = "weight", data: Any = None,
                                 repair: bool = True, threshold: float = DEFAULT_THRESHOLD, metric: str = "accuracy",
                                 alphas: int | Sequence[float] = 21, seed: int = 0) -> Verdict:
    """Holds when the linear barrier between ``a`` and ``b`` aligned to it is ``<= threshold``.

    Parameters
    ----------
    a, b : model-like
        Model-likes of the evaluator's architecture.
    evaluator : PointEvaluator
        Measures the paths.
    method : str
        ``"weight"`` or ``"activation"`` matching (:func:`~.align.match`; activation needs data).
    data : data, optional
        Training data for activation matching and for REPAIR.
    repair : bool
        Also report the barrier after alignment plus REPAIR (needs data); the verdict holds
        if either the aligned or the aligned-and-repaired barrier is below the threshold.
    threshold : float
        Barrier threshold.
    metric : str
        The barrier compared: Eq. 4 (``"accuracy"``) or Eq. 3 (``"loss"``).
    alphas : int or sequence of float
        Path grid.
    seed : int
        Weight matching's sweep order.

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
    legend = {f"{m}_barrier[{label}]": f"{'Eq. 3 loss' if m == 'loss' else 'Eq. 4 accuracy'} barrier of the a-b line "
              + {"before": "as given", "aligned": "after permuting b's units to match a",
                 "aligned + REPAIR": "after alignment, every point renormalised by REPAIR"}[label]
              for label in paths for m in ("loss", "accuracy")}
    legend.update({"units_moved": "hidden units of b that the alignment moved",
                   "alignment_seconds": "time to find the permutation groups and the permutations"})
    after = min(_barrier(p, metric) for k, p in paths.items() if k != "before")
    before = _barrier(paths["before"], metric)
    holds = after <= threshold
    best = min((k for k in paths if k != "before"), key=lambda k: _barrier(paths[k], metric))
    reason = (f"{metric} barrier {before:.4g} before alignment, {after:.4g} {best} "
              f"({'<=' if holds else '>'} {threshold:g})")
    return Verdict(kind="connected_modulo_permutation", status=Outcome.of(holds), reason=reason,
                   claim="Connected modulo permutation: after aligning the hidden units of b to a, the linear "
                         "path has no barrier", numbers=numbers,
                   thresholds={"metric": metric, "threshold": threshold, "method": method},
                   results={"paths": paths}, legend=legend,
                   informational=tuple(k for k in numbers if not k.startswith(f"{metric}_barrier[") or "before" in k),
                   reference="Entezari et al. 2022 (Conjecture 1); Ainsworth et al. 2023 (Git Re-Basin); "
                             "Jordan et al. 2022 (REPAIR); docs/connectivity.md")


def group_connected_modulo_permutation(models: Sequence[Any], evaluator: PointEvaluator, *, to: Any = None,
                                       threshold: float = DEFAULT_THRESHOLD, metric: str = "accuracy",
                                       seed: int = 0) -> Verdict:
    """Holds when the group barrier of the models, aligned by weight matching, is ``<= threshold``.

    Parameters
    ----------
    models : sequence of model-like
        Model-likes of the evaluator's architecture (at least two).
    evaluator : PointEvaluator
        Measures the members and their average.
    to : model-like, optional
        Align every model to this reference (e.g. the global model); ``None``: MergeMany.
    threshold : float
        Threshold on the group barrier.
    metric : str
        The group barrier compared: Eq. 10 (``"accuracy"``) or Eq. 9 (``"loss"``).
    seed : int
        Order of MergeMany's rounds and of the coordinate-descent sweeps.

    Returns
    -------
    Verdict
        ``numbers``: group barriers before and after (both metrics) and the fused accuracies;
        ``results``: the two GroupResults.
    """
    if metric not in METRICS:
        raise ConfigError(f"metric must be one of {METRICS}, got {metric!r}")
    if len(models) < 2:
        raise ConfigError("group connectivity needs at least two models")
    aligned = align_group(models, to=to, seed=seed, template=evaluator.module)
    groups = {"before": group_barrier(list(models), evaluator), "aligned": group_barrier(aligned, evaluator)}
    numbers: dict[str, Any] = {}
    for label, g in groups.items():
        numbers.update({f"loss_barrier[{label}]": g.loss_barrier, f"accuracy_barrier[{label}]": g.accuracy_barrier,
                        f"fused_accuracy[{label}]": g.fused_accuracy})
    before, after = (_barrier(groups[k], metric) for k in ("before", "aligned"))
    holds = after <= threshold
    return Verdict(kind="group_connected_modulo_permutation", status=Outcome.of(holds),
                   reason=f"group {metric} barrier {before:.4g} before alignment, {after:.4g} after "
                          f"({'<=' if holds else '>'} {threshold:g})",
                   claim=f"Group connected modulo permutation: after aligning the {len(models)} models "
                         f"({'to a reference' if to is not None else 'to each other, MergeMany'}), their "
                         "average has no barrier",
                   numbers=numbers, thresholds={"metric": metric, "threshold": threshold}, results=groups,
                   legend={f"{m}[{label}]": f"{m.replace('_', ' ')} of the group's average {label} alignment"
                           for label in ("before", "aligned") for m in ("loss_barrier", "accuracy_barrier",
                                                                         "fused_accuracy")},
                   informational=tuple(k for k in numbers if not k.startswith(f"{metric}_barrier[") or "before" in k),
                   reference="FedGuCci Definition 3.6 (Eq. 9/10); Ainsworth et al. 2023 (MergeMany); "
                             "docs/connectivity.md")


def connected_by_curve(a: Any, b: Any, evaluator: PointEvaluator, *, train_data: Any, kind: str = "bezier",
                       threshold: float = DEFAULT_THRESHOLD, metric: str = "accuracy", **training: Any) -> Verdict:
    """Holds when a learned curve (:func:`~.curves.curve`) joins ``a`` and ``b`` with barrier ``<= threshold``.

    Parameters
    ----------
    a, b : model-like
        Endpoints.
    evaluator : PointEvaluator
        Measures the curve and the line.
    train_data : data
        Data the curve is trained on.
    kind : str
        ``"bezier"`` or ``"polychain"``.
    threshold : float
        Barrier threshold.
    metric : str
        The barrier compared: Eq. 4 (``"accuracy"``) or Eq. 3 (``"loss"``), with the curve
        parameter ``t`` in place of alpha.
    **training
        Options of :func:`~.curves.curve` (epochs, lr, bends, points, seed, ...).

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
    return Verdict(kind="connected_by_curve", status=Outcome.of(holds),
                   reason=f"{kind} curve {metric} barrier {value:.4g} {'<=' if holds else '>'} {threshold:g} "
                          f"(straight line {line:.4g})",
                   claim=f"Connected by a curve: a learned {kind} curve joins a and b without a barrier",
                   numbers=numbers, thresholds={"metric": metric, "threshold": threshold, "kind": kind},
                   results={"curve": result},
                   legend={"curve_loss_barrier": "Eq. 3 barrier along the learned curve (t in place of alpha)",
                           "line_loss_barrier": "Eq. 3 barrier along the straight line",
                           "curve_accuracy_barrier": "Eq. 4 barrier along the learned curve",
                           "line_accuracy_barrier": "Eq. 4 barrier along the straight line",
                           "curve_max_loss": "largest loss on the curve (endpoints included)",
                           "line_max_loss": "largest loss on the line"},
                   informational=tuple(k for k in numbers if k != f"curve_{metric}_barrier"),
                   reference="Garipov et al. 2018 (section 3.2); Draxler et al. 2018; docs/connectivity.md")
