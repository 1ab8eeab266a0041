"""Checks of the papers' landscape claims on the user's own models, each returning a :class:`Verdict`.

* :func:`transitivity` -- FedGuCci Hypothesis 3.1 / Table 1: two models each linearly connected
  to one anchor are connected to each other (or, given a baseline pair, less disconnected than it).
* :func:`group_connectivity` -- FedGuCci Definition 3.6 (Eq. 9/10): the group barrier of K
  models around their centroid is small.
* :func:`shared_basin` -- IMA section 4 (C2/C3): client models and the global model lie in one
  basin of a plane through the clients, with no linear barrier between each client and the
  global model; also reports how far the global model is from the basin bottom.
* :func:`flatter` -- FedGuCci+ / IMA C15: model a sits in a flatter region than model b (lower
  top Hessian eigenvalue of the evaluator's loss).

Thresholds are explicit keyword arguments; every verdict carries the numbers, a legend of their
names, the thresholds and the result objects it was decided from. The barrier conventions are
in ``docs/barriers.md``; the methods in ``docs/methods/``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from ..curvature.functions import hessian_density, hessian_eigen
from ..evaluation.protocol import PointEvaluator
from ..geometry.basin import basin
from ..geometry.groups import group_barrier, group_barrier_by_size
from ..geometry.paths import interpolate
from ..geometry.planes import pca_plane, plane
from ..infra.errors import ConfigError
from ..results import PathResult
from ..results.barriers import DEFAULT_THRESHOLD
from ..results.base import Result
from ..space.params import ModelLike
from .options import FlatterOptions, GroupConnectivityOptions, SharedBasinOptions, TransitivityOptions
from .outcome import Outcome
from .verdict import Verdict

TRANSITIVITY_LEGEND = {
    "barrier_w1_anchor": "barrier of the path w1-anchor (Eq. 4 accuracy / Eq. 3 loss)",
    "barrier_w2_anchor": "barrier of the path w2-anchor",
    "barrier_w1_w2": "barrier of the path w1-w2, the conclusion",
    "ind_acc": "mean accuracy of w1 and w2 (FedGuCci Table 1 'Ind. Acc.')",
    "fused_acc": "accuracy of (w1 + w2) / 2 (Table 1 'Fused Acc.')",
    "baseline_barrier": "barrier of the baseline pair (e.g. trained without the connectivity loss)",
    "relative_reduction": "(baseline barrier - w1-w2 barrier) / baseline barrier",
    "baseline_ind_acc": "mean accuracy of the baseline pair",
    "baseline_fused_acc": "accuracy of the baseline pair's midpoint",
}
GROUP_LEGEND = {
    "group_barrier": "the decisive group barrier (Eq. 10 accuracy or Eq. 9 loss); negative when the fused "
                     "model beats its members on average",
    "fused_loss": "loss of the fused (weighted average) model", "fused_accuracy": "its accuracy",
    "mean_member_accuracy": "weighted mean accuracy of the members",
    "mean_barrier_by_size": "mean group barrier of random subsets of each size K (FedGuCci Fig. 4)",
}
BASIN_LEGEND = {
    "common_basin": "the plane's clients and the global model share one component of the sublevel set",
    "level": "loss level c of the sublevel set {L <= c} (highest loss at the plane's clients)",
    "components": "connected components of the sublevel set on the grid",
    "basin_size": "grid cells of the shared component",
    "max_client_global_barrier": "largest barrier of a client-global linear path (decisive)",
    "clients_on_wall": "clients whose loss falls monotonically towards the global model (IMA C2)",
    "global_distance_to_bottom": "distance from the global model to the basin's lowest point (IMA C3)",
    "global_loss_gap": "global model's loss minus the basin bottom's",
    "global_off_bottom": "the global model is farther from the bottom than one grid-cell diagonal",
    "cell_diagonal": "length of one grid cell's diagonal (the resolution of 'off bottom')",
    "global_distance_to_plane": "distance of the global model from the plane (it is projected onto it)",
}
FLATNESS_LEGEND = {
    "top_eigenvalue_a": "largest Hessian eigenvalue at model a (decisive)",
    "top_eigenvalue_b": "largest Hessian eigenvalue at model b (decisive)",
    "ratio_a_to_b": "top eigenvalue of a divided by that of b",
    "converged": "whether both Lanczos runs met their tolerance",
}


def _path_barrier(path: PathResult, metric: str) -> float:
    return path.accuracy_barrier if metric == "accuracy" else path.loss_barrier


def _at_alpha(path: PathResult, values: np.ndarray, alpha: float) -> float:
    idx = np.flatnonzero(np.isclose(path.alphas, alpha, atol=1e-9))
    return float(values[idx[0]]) if idx.size else float("nan")


# --------------------------------------------------------------------- transitivity
def transitivity(w1: ModelLike, w2: ModelLike, anchor: ModelLike, evaluator: PointEvaluator, *,
                 baseline: tuple[ModelLike, ModelLike] | None = None, threshold: float = DEFAULT_THRESHOLD,
                 min_reduction: float = 0.1, metric: str = "accuracy", alphas: int | Sequence[float] = 21
                 ) -> Verdict:
    """FedGuCci Hypothesis 3.1: w1-anchor and w2-anchor connected implies w1-w2 connected.

    Premise: the barriers of the paths w1-anchor and w2-anchor are both ``<= threshold``
    (otherwise ``not testable``). Conclusion: the w1-w2 barrier is ``<= threshold`` or, given a
    ``baseline`` pair, at least ``min_reduction`` below the baseline's (relative,
    ``(B_base - B) / B_base``; FedGuCci Table 1). Ind. Acc. and Fused Acc. (the midpoint, needs
    0.5 on the grid) are reported as in Table 1.

    Parameters
    ----------
    w1, w2, anchor
        The models (model-likes or flat vectors); ``anchor`` is e.g. the global model.
    evaluator
        Evaluates the paths.
    baseline
        Optional pair (v1, v2), e.g. trained without the connectivity loss.
    threshold, min_reduction
        Largest barrier that counts as connected; relative reduction below the baseline's.
    metric
        ``"accuracy"`` (Eq. 4) or ``"loss"`` (Eq. 3).
    alphas
        Grid of every path (see :func:`landscape.interpolate`).

    Returns
    -------
    Verdict
        ``reproduced``, ``not reproduced`` or ``not testable``, with the barriers and the paths.

    Raises
    ------
    ConfigError
        If ``metric`` is unknown, ``threshold`` negative or the grid is invalid.
    """
    TransitivityOptions.from_mapping({"threshold": threshold, "min_reduction": min_reduction, "metric": metric})
    paths = {"w1-anchor": interpolate(w1, anchor, evaluator, alphas=alphas),
             "w2-anchor": interpolate(w2, anchor, evaluator, alphas=alphas),
             "w1-w2": interpolate(w1, w2, evaluator, alphas=alphas)}
    if baseline is not None:
        paths["baseline"] = interpolate(baseline[0], baseline[1], evaluator, alphas=alphas)
    b1, b2, b12 = (_path_barrier(paths[k], metric) for k in ("w1-anchor", "w2-anchor", "w1-w2"))
    pair = paths["w1-w2"]
    numbers: dict[str, Any] = {
        "barrier_w1_anchor": b1, "barrier_w2_anchor": b2, "barrier_w1_w2": b12,
        "ind_acc": 0.5 * (_at_alpha(pair, pair.accuracy, 0.0) + _at_alpha(pair, pair.accuracy, 1.0)),
        "fused_acc": _at_alpha(pair, pair.accuracy, 0.5)}
    premise = b1 <= threshold and b2 <= threshold
    connected = b12 <= threshold
    if baseline is not None:
        base = paths["baseline"]
        bb = _path_barrier(base, metric)
        reduction = (bb - b12) / bb if bb > 0 else float("nan")
        numbers.update({"baseline_barrier": bb, "relative_reduction": reduction,
                        "baseline_ind_acc": 0.5 * (_at_alpha(base, base.accuracy, 0.0)
                                                   + _at_alpha(base, base.accuracy, 1.0)),
                        "baseline_fused_acc": _at_alpha(base, base.accuracy, 0.5)})
        conclusion = connected or (np.isfinite(reduction) and reduction >= min_reduction)
    else:
        conclusion = connected
    if not premise:
        status, reason = Outcome.NOT_TESTABLE, (f"the premise fails: anchor barriers {b1:.4g} and {b2:.4g}, "
                                            f"threshold {threshold:g}")
    elif conclusion:
        status = Outcome.REPRODUCED
        reason = (f"w1-w2 barrier {b12:.4g} <= {threshold:g}" if connected else
                  f"w1-w2 barrier {b12:.4g} is {100 * numbers['relative_reduction']:.1f}% below the baseline's")
    else:
        status = Outcome.NOT_REPRODUCED
        reason = f"both models connect to the anchor, but the w1-w2 barrier is {b12:.4g} > {threshold:g}"
        if baseline is not None:
            reason += f" and only {100 * numbers['relative_reduction']:.1f}% below the baseline's"
    return Verdict(
        kind="transitivity", status=status, reason=reason, numbers=numbers,
        claim="Transitivity of linear mode connectivity: two models each connected to one anchor are "
              "connected to each other",
        thresholds={"metric": metric, "threshold": threshold,
                    **({"min_reduction": min_reduction} if baseline is not None else {})},
        results={"paths": paths}, reference="FedGuCci Hypothesis 3.1, Table 1; docs/methods/fedgucci.md",
        legend=TRANSITIVITY_LEGEND, informational=("ind_acc", "fused_acc", "baseline_ind_acc", "baseline_fused_acc"),
        margin=None if not premise else float(max(threshold, (1 - min_reduction) * numbers["baseline_barrier"])
                                              if baseline is not None else threshold) - b12,
        margin_rule=("max(threshold, (1 - min_reduction) x baseline_barrier) - barrier_w1_w2 (the pair counts as "
                     "connected below the threshold or min_reduction below the baseline's barrier)"
                     if baseline is not None else "threshold - barrier_w1_w2"))


# ------------------------------------------------------------------ group barrier
def group_connectivity(models: Sequence[ModelLike], evaluator: PointEvaluator, *, threshold: float = DEFAULT_THRESHOLD,
                       metric: str = "accuracy", weights: Sequence[float] | None = None, by_size: bool = False,
                       draws: int = 5, seed: int = 0) -> Verdict:
    """FedGuCci Definition 3.6: the group barrier (Eq. 10 accuracy / Eq. 9 loss) is ``<= threshold``.

    Parameters
    ----------
    models
        At least two model-likes (or flat vectors).
    evaluator
        Evaluates the members and the fused model.
    threshold, metric
        Largest group barrier for which the claim holds; ``"accuracy"`` or ``"loss"``.
    weights
        Mixing weights mu_i of the fused model (default uniform).
    by_size, draws, seed
        Also report the mean barrier of ``draws`` random subsets (seeded) of every size K
        (FedGuCci Fig. 4).

    Returns
    -------
    Verdict
        ``reproduced`` or ``not reproduced``, with the group barrier and the fused and member metrics.

    Raises
    ------
    ConfigError
        If there are fewer than two models or ``metric`` is unknown.
    """
    # any threshold: a group barrier may be negative (the command line asks for one >= 0)
    GroupConnectivityOptions.from_mapping({"metric": metric, "by_size": by_size})
    if len(models) < 2:
        raise ConfigError("group connectivity needs at least two models")
    group = group_barrier(models, evaluator, weights=weights)
    value = group.accuracy_barrier if metric == "accuracy" else group.loss_barrier
    numbers: dict[str, Any] = {"group_size": len(models), "group_barrier": value,
                               "loss_barrier": group.loss_barrier, "accuracy_barrier": group.accuracy_barrier,
                               "fused_loss": group.fused_loss, "fused_accuracy": group.fused_accuracy,
                               "mean_member_accuracy": float(np.dot(group.weights, group.member_accuracy))}
    results: dict[str, Result] = {"group": group}
    if by_size:
        sizes = group_barrier_by_size(models, evaluator, draws=draws, seed=seed)
        per_k = sizes.accuracy_barrier if metric == "accuracy" else sizes.loss_barrier
        numbers["mean_barrier_by_size"] = {int(k): float(np.mean(row)) for k, row in zip(sizes.sizes, per_k)}
        results["by_size"] = sizes
    holds = bool(value <= threshold)
    return Verdict(
        kind="group_connectivity", status=Outcome.of(holds),
        reason=f"group barrier {value:.4g} {'<=' if holds else '>'} {threshold:g}",
        claim=f"Group connectivity: the {len(models)} models share a low-{metric}-barrier region "
              "around their centroid",
        numbers=numbers, thresholds={"metric": metric, "threshold": threshold}, results=results,
        reference="FedGuCci Definition 3.6, Eq. 9/10, Figure 4; docs/methods/fedgucci.md",
        legend=GROUP_LEGEND,
        informational=("loss_barrier", "accuracy_barrier", "fused_loss", "fused_accuracy", "mean_member_accuracy",
                       "mean_barrier_by_size"),
        margin=float(threshold - value), margin_rule="threshold - group barrier")


# ------------------------------------------------------------------- shared basin
def shared_basin(client_models: Sequence[ModelLike] | Mapping[str, ModelLike], global_model: ModelLike,
                 evaluator: PointEvaluator, *, plane_kind: str = "clients", plane_clients: Sequence[int] = (0, 1, 2),
                 resolution: int = 21, margin: float = 0.2, level: float | None = None,
                 barrier_threshold: float = DEFAULT_THRESHOLD, metric: str = "loss",
                 alphas: int | Sequence[float] = 11, refine: bool = True) -> Verdict:
    """IMA section 4 (C2): the clients and the global model lie in one basin, without barriers.

    The plane passes through three clients (Garipov et al. 2018; the global model projected
    onto it) or is spanned by the clients' top-2 principal directions around the global model.
    The basin is the flood-filled component of ``{L <= c}`` (``c``: the highest grid loss at the
    plane's clients, or ``level``). The claim holds when the plane's clients and the global
    model share it and every client-global barrier (Eq. 3/4) is ``<= barrier_threshold``.
    Reported too: clients "on the wall" (loss falling monotonically towards the global model,
    IMA C2) and (IMA C3) the global model's distance and loss gap to the basin bottom, whether
    it is off the bottom (farther than one grid-cell diagonal), and its distance to the plane.

    Parameters
    ----------
    client_models, global_model
        The clients (a sequence or a mapping name -> model-like) and the global model.
    evaluator
        Evaluates the plane, the models and the client-global paths.
    plane_kind, plane_clients
        ``"clients"`` (through the clients of these three indices) or ``"pca"``.
    resolution, margin
        Grid points per axis and widening of the plane (see :func:`landscape.plane`).
    level
        The sublevel ``c`` (default as above).
    barrier_threshold, metric
        Largest client-global barrier for which the claim holds; ``"loss"`` or ``"accuracy"``.
    alphas
        Grid of the client-global paths.
    refine
        Refine the basin bottom by a local quadratic fit.

    Returns
    -------
    Verdict
        ``reproduced`` or ``not reproduced``, with the basin, barrier and C3 numbers and the result objects.

    Raises
    ------
    ConfigError
        If an option is invalid or a model lies outside the plane's grid.
    """
    SharedBasinOptions.from_mapping({"plane_kind": plane_kind, "level": level, "barrier_threshold": barrier_threshold,
                                     "metric": metric})
    named = dict(client_models) if isinstance(client_models, Mapping) else {
        f"client {i}": m for i, m in enumerate(client_models)}
    names = list(named)
    vecs = {n: evaluator.vector(m) for n, m in named.items()}
    g = evaluator.vector(global_model)
    if plane_kind == "clients":
        if len(names) < 3 or len(set(plane_clients)) != 3 or not all(0 <= i < len(names) for i in plane_clients):
            raise ConfigError(f"a plane through clients needs three distinct client indices in [0, {len(names) - 1}]; "
                              f"got {list(plane_clients)} for {len(names)} clients (use plane_kind='pca')")
        in_plane = [names[i] for i in plane_clients]
        grid = plane(*(vecs[n] for n in in_plane), evaluator, resolution=resolution, margin=margin,
                     labels=tuple(in_plane), extra={"global": g})
    else:  # "pca"
        if len(names) < 2:
            raise ConfigError("a PCA plane of the clients needs at least two clients")
        in_plane = names
        grid = pca_plane([vecs[n] for n in names] + [g], evaluator, resolution=resolution, margin=margin)
        coords = list(grid.models.values())
        grid = dataclasses.replace(grid, models={**dict(zip(names, coords)), "global": coords[-1]})
    metrics = evaluator.evaluate(torch.stack([vecs[n] for n in names] + [g]))
    losses = {**dict(zip(names, map(float, metrics.loss[:-1]))), "global": float(metrics.loss[-1])}
    placed = in_plane + ["global"]
    if level is None:
        level = float(basin(grid, models=in_plane, refine=False).level)  # c = max client loss on the grid
    found = basin(grid, models=placed, model_loss=losses, level=level, refine=refine)
    paths = {n: interpolate(vecs[n], g, evaluator, alphas=alphas) for n in names}
    barriers = {n: _path_barrier(p, metric) for n, p in paths.items()}
    worst = max(barriers.values())
    # IMA C2 "wall" test: the loss falls monotonically from the client (alpha 0) to the global model
    on_wall = {n: bool(np.all(np.diff(p.loss[(p.alphas >= 0) & (p.alphas <= 1)]) <= 1e-12))
               for n, p in paths.items()}
    residual = grid.project(g.numpy())[2]
    info = found.model("global")
    numbers: dict[str, Any] = {
        "common_basin": found.common, "level": found.level, "components": found.num_components,
        "basin_size": found.basin_size, "max_client_global_barrier": worst,
        **{f"barrier[{n}]": b for n, b in barriers.items()},
        "clients_on_wall": sum(on_wall.values()),
        "global_loss": losses["global"], "min_client_loss": min(losses[n] for n in names),
        "bottom_loss": found.refined_loss, "global_distance_to_bottom": info["distance"],
        "global_loss_gap": info["loss_gap"], "global_off_bottom": info["off_bottom"],
        "cell_diagonal": found.cell_diagonal, "global_distance_to_plane": residual}
    holds = found.common and worst <= barrier_threshold
    if holds:
        reason = f"one basin at level {found.level:.4g}; largest client-global barrier {worst:.4g}"
    elif not found.common:
        reason = (f"the plane's clients and the global model are not in one component of the sublevel "
                  f"set at level {found.level:.4g}")
    else:
        reason = f"a client-global barrier is {worst:.4g} > {barrier_threshold:g}"
    return Verdict(
        kind="shared_basin", status=Outcome.of(holds), reason=reason, numbers=numbers,
        claim="Shared basin: the client models and the global model lie in one low-loss basin",
        thresholds={"metric": metric, "barrier_threshold": barrier_threshold, "level": found.level,
                    "plane": plane_kind, "resolution": resolution},
        results={"plane": grid, "basin": found, "paths": paths, "metrics": metrics},
        reference="IMA section 4, claims C2/C3; docs/methods/ima.md",
        legend=BASIN_LEGEND,
        informational=("components", "basin_size", "clients_on_wall", "global_loss", "min_client_loss",
                       "bottom_loss", "global_distance_to_bottom", "global_loss_gap", "global_off_bottom",
                       "cell_diagonal", "global_distance_to_plane"),
        margin=float(barrier_threshold - worst) if found.common else None,
        margin_rule="barrier_threshold - max_client_global_barrier")


# ------------------------------------------------------------------------ flatness
def flatter(model_a: ModelLike, model_b: ModelLike, evaluator: PointEvaluator, *, k: int = 1, tol: float = 1e-3,
            max_iter: int = 100, seed: int = 0, margin: float = 0.0, density: bool = False,
            density_iterations: int = 50) -> Verdict:
    """Model a is flatter than b: ``lambda_max(a) < (1 - margin) * lambda_max(b)``.

    ``lambda_max`` is the top eigenvalue of the Hessian of the evaluator's loss (Lanczos,
    :func:`landscape.hessian_eigen`); the ``k`` largest are reported. ``density=True`` also
    estimates both spectral densities (SLQ) for the figure.

    Parameters
    ----------
    model_a, model_b
        The two models (model-likes or flat vectors).
    evaluator
        Its loss is differentiated.
    k, tol, max_iter, seed
        Eigenvalues reported, Lanczos tolerance, product budget and seed (see
        :func:`landscape.hessian_eigen`).
    margin
        Required relative advantage of a, in [0, 1).
    density, density_iterations
        Also estimate both spectral densities (SLQ with this many Lanczos steps).

    Returns
    -------
    Verdict
        ``reproduced`` or ``not reproduced``, with both top eigenvalues, their ratio and convergence.

    Raises
    ------
    ConfigError
        If ``margin`` lies outside [0, 1) or ``density_iterations`` outside [1, MAX_ITERATIONS].
    """
    FlatterOptions.from_mapping({"margin": margin, "density": density, "density_iterations": density_iterations})
    ea = hessian_eigen(model_a, evaluator, k=k, tol=tol, max_iter=max_iter, seed=seed)
    eb = hessian_eigen(model_b, evaluator, k=k, tol=tol, max_iter=max_iter, seed=seed)
    la, lb = float(ea.values[0]), float(eb.values[0])
    numbers = {"top_eigenvalue_a": la, "top_eigenvalue_b": lb,
               "ratio_a_to_b": la / lb if lb != 0 else float("nan"),
               "eigenvalues_a": [float(v) for v in ea.values], "eigenvalues_b": [float(v) for v in eb.values],
               "converged": bool(ea.converged and eb.converged)}
    results: dict[str, Any] = {"eigen_a": ea, "eigen_b": eb}
    if density:
        results["densities"] = {
            "a": hessian_density(model_a, evaluator, iterations=density_iterations, seed=seed),
            "b": hessian_density(model_b, evaluator, iterations=density_iterations, seed=seed)}
    holds = la < (1.0 - margin) * lb
    return Verdict(
        kind="flatter", status=Outcome.of(holds),
        reason=f"top Hessian eigenvalue {la:.4g} (a) {'<' if holds else '>='} "
               f"{'' if margin == 0 else f'{1 - margin:g} x '}{lb:.4g} (b)",
        claim="Flatness: model a lies in a flatter region than model b (smaller top Hessian eigenvalue)",
        numbers=numbers, thresholds={"margin": margin, "k": k, "tol": tol}, results=results,
        reference="FedGuCci+ (SAM); IMA C15; docs/methods/fedgucci.md",
        legend=FLATNESS_LEGEND, informational=("ratio_a_to_b", "eigenvalues_a", "eigenvalues_b", "converged"),
        margin=(1.0 - margin) - la / lb if lb > 0 else None,
        margin_rule="(1 - margin) - lambda_max(a) / lambda_max(b)")


__all__ = ["Verdict", "flatter", "group_connectivity", "shared_basin", "transitivity"]
