"""Checks of the papers' landscape claims on the user's own models, returning a :class:`Verdict`.

* :func:`transitivity` -- FedGuCci Hypothesis 3.1 / Table 1 (reference/fedgucci.md section 9,
  claims 1 and 4): two models each linearly connected to one anchor are connected to each
  other (or, given a baseline pair, less disconnected than it).
* :func:`group_connectivity` -- FedGuCci Definition 3.6 (Eq. 9/10; claims 5 and 15): the group
  barrier of K models around their centroid is small.
* :func:`shared_basin` -- IMA paper section 4 (reference/ima.md section 6, C2/C3): client models
  and the global model lie in one basin of a plane through the clients, with no linear barrier
  between each client and the global model; also reports how far the global model is from
  the basin bottom.
* :func:`flatter` -- FedGuCci+ / IMA C15: model a sits in a flatter region than model b (lower
  top Hessian eigenvalue of the evaluator's loss).

Thresholds are explicit keyword arguments; every verdict carries the numbers, the thresholds
and the result objects it was decided from, and renders itself as text, Markdown and HTML.
"""
from __future__ import annotations

import dataclasses
import html
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from ..geometry.basin import basin
from ..curvature.functions import hessian_density, hessian_eigen
from ..infra.errors import ConfigError
from ..evaluation.evaluator import Evaluator
from ..geometry.groups import group_barrier, group_barrier_by_size
from ..space.params import ModelLike
from ..geometry.paths import interpolate
from ..geometry.planes import pca_plane, plane
from ..results import PathResult
from ..results.base import Result, jsonable

#: Default barrier threshold: a relative accuracy drop of 5% (Eq. 4/10), or 0.05 nats of loss.
DEFAULT_THRESHOLD = 0.05
METRICS = ("accuracy", "loss")
STATUSES = ("holds", "fails", "not applicable")


@dataclass(frozen=True)
class Verdict:
    """The outcome of a claim check.

    ``status`` is ``"holds"``, ``"fails"`` or ``"not applicable"`` (a premise of the claim is
    not met, e.g. the models are not connected to the anchor); ``holds`` is True only for
    ``"holds"``. ``numbers`` are the measured values, ``thresholds`` the decision thresholds,
    ``results`` the result objects behind the numbers, ``reason`` one sentence saying why.
    """

    kind: str
    claim: str
    status: str
    reason: str
    numbers: Mapping[str, Any]
    thresholds: Mapping[str, Any]
    results: Mapping[str, Any] = field(default_factory=dict)
    reference: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ConfigError(f"status must be one of {STATUSES}, got {self.status!r}")

    @property
    def holds(self) -> bool:
        return self.status == "holds"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (numbers, thresholds, verdict; result objects are left out)."""
        return {"kind": self.kind, "claim": self.claim, "holds": self.holds, "status": self.status,
                "reason": self.reason, "reference": self.reference,
                "numbers": jsonable(dict(self.numbers)), "thresholds": jsonable(dict(self.thresholds))}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=True)

    # ------------------------------------------------------------- rendering
    def _rows(self) -> list[tuple[str, str]]:
        return [(k, _fmt(v)) for k, v in self.numbers.items()]

    def __str__(self) -> str:
        rows = self._rows()
        width = max((len(k) for k, _ in rows), default=0)
        lines = [f"Claim: {self.claim}", f"Verdict: {self.status.upper()} -- {self.reason}"]
        lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
        lines.append("Thresholds: " + ", ".join(f"{k}={_fmt(v)}" for k, v in self.thresholds.items()))
        if self.reference:
            lines.append(f"Reference: {self.reference}")
        return "\n".join(lines)

    def _repr_markdown_(self) -> str:
        mark = {"holds": "✅ holds", "fails": "❌ fails", "not applicable": "➖ not applicable"}[self.status]
        lines = [f"**{self.claim}**", "", f"Verdict: **{mark}** — {self.reason}", "",
                 "| quantity | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in self._rows()]
        lines += ["", "Thresholds: " + ", ".join(f"`{k}={_fmt(v)}`" for k, v in self.thresholds.items())]
        if self.reference:
            lines += ["", f"_{self.reference}_"]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        colour = {"holds": "#1a7f37", "fails": "#cf222e", "not applicable": "#6e7781"}[self.status]
        rows = "".join(f"<tr><td style='text-align:left'>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
                       for k, v in self._rows())
        thresholds = ", ".join(f"{html.escape(k)}={html.escape(_fmt(v))}" for k, v in self.thresholds.items())
        ref = f"<div><em>{html.escape(self.reference)}</em></div>" if self.reference else ""
        return (f"<div><div><strong>{html.escape(self.claim)}</strong></div>"
                f"<div>Verdict: <strong style='color:{colour}'>{html.escape(self.status)}</strong> — "
                f"{html.escape(self.reason)}</div><table><thead><tr><th>quantity</th><th>value</th></tr>"
                f"</thead><tbody>{rows}</tbody></table><div>Thresholds: {thresholds}</div>{ref}</div>")

    def figure(self, **options: Any):
        """A matplotlib figure of the evidence, drawn by the ``figures`` package.

        transitivity: the three (four) interpolation curves; group_connectivity: the group
        barrier against K (needs ``by_size=True``); shared_basin: the plane with the models;
        flatter: the two Hessian spectral densities (needs ``density=True``).
        """
        try:
            import figures  # noqa: F401  (optional: landscape does not depend on figures)
        except ImportError as exc:  # pragma: no cover - figures ships with this toolkit
            raise ConfigError(f"figures are drawn by the 'figures' package, which cannot be imported: {exc}") from None
        if self.kind == "transitivity":
            from figures.paths import path_figure

            return path_figure(dict(self.results["paths"]), title="Transitivity of LMC", **options)
        if self.kind == "group_connectivity":
            sizes = self.results.get("by_size")
            if sizes is None:
                raise ConfigError("the group barrier figure shows barriers against K: run "
                                  "group_connectivity(..., by_size=True)")
            from figures.groups import group_size_figure

            metric = self.thresholds.get("metric", "accuracy")
            values = sizes.accuracy_barrier if metric == "accuracy" else sizes.loss_barrier
            series = {"group": {int(k): list(map(float, row)) for k, row in zip(sizes.sizes, values)}}
            return group_size_figure(series, metric=metric, **options)
        if self.kind == "shared_basin":
            from figures.planes import plane_figure

            grid, found = self.results["plane"], self.results["basin"]
            marked = dataclasses.replace(grid, models={**grid.models, "basin bottom": list(found.refined_bottom)})
            return plane_figure(marked, title="Shared basin", **options)
        if self.kind == "flatter":
            densities = self.results.get("densities")
            if densities is None:
                raise ConfigError("the flatness figure shows Hessian densities: run flatter(..., density=True)")
            from figures.curvature import spectral_density_figure

            return spectral_density_figure(dict(densities), **options)
        raise ConfigError(f"no figure for claim kind {self.kind!r}")


def _fmt(value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.4g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


def _check_metric(metric: str) -> None:
    if metric not in METRICS:
        raise ConfigError(f"metric must be one of {METRICS}, got {metric!r}")


def _path_barrier(path: PathResult, metric: str) -> float:
    return path.accuracy_barrier if metric == "accuracy" else path.loss_barrier


def _at_alpha(path: PathResult, values: np.ndarray, alpha: float) -> float:
    idx = np.flatnonzero(np.isclose(path.alphas, alpha, atol=1e-9))
    return float(values[idx[0]]) if idx.size else float("nan")


# --------------------------------------------------------------------- transitivity
def transitivity(w1: ModelLike, w2: ModelLike, anchor: ModelLike, evaluator: Evaluator, *,
                 baseline: tuple[ModelLike, ModelLike] | None = None, threshold: float = DEFAULT_THRESHOLD,
                 min_reduction: float = 0.1, metric: str = "accuracy", alphas: int | Sequence[float] = 21
                 ) -> Verdict:
    """FedGuCci Hypothesis 3.1: w1-anchor and w2-anchor connected implies w1-w2 connected.

    Premise: the barriers (Eq. 4 for ``metric="accuracy"``, Eq. 3 for ``"loss"``) of the paths
    w1-anchor and w2-anchor are both ``<= threshold``; otherwise the verdict is "not
    applicable". Conclusion without a baseline: the w1-w2 barrier is ``<= threshold``. With a
    ``baseline`` pair (v1, v2) (e.g. trained without the connectivity loss, FedGuCci Table 1):
    the w1-w2 barrier is below the baseline's by at least ``min_reduction`` (relative,
    ``(B_base - B) / B_base``), or is itself ``<= threshold``. Ind. Acc. and Fused Acc. (the
    midpoint, needs 0.5 on the grid) are reported as in Table 1.
    """
    _check_metric(metric)
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
        status, reason = "not applicable", (f"the premise fails: anchor barriers {b1:.4g} and {b2:.4g}, "
                                            f"threshold {threshold:g}")
    elif conclusion:
        status = "holds"
        reason = (f"w1-w2 barrier {b12:.4g} <= {threshold:g}" if connected else
                  f"w1-w2 barrier {b12:.4g} is {100 * numbers['relative_reduction']:.1f}% below the baseline's")
    else:
        status = "fails"
        reason = f"both models connect to the anchor, but the w1-w2 barrier is {b12:.4g} > {threshold:g}"
        if baseline is not None:
            reason += f" and only {100 * numbers['relative_reduction']:.1f}% below the baseline's"
    return Verdict(
        kind="transitivity", status=status, reason=reason, numbers=numbers,
        claim="Transitivity of linear mode connectivity: two models each connected to one anchor are "
              "connected to each other",
        thresholds={"metric": metric, "threshold": threshold,
                    **({"min_reduction": min_reduction} if baseline is not None else {})},
        results={"paths": paths}, reference="FedGuCci Hypothesis 3.1, Table 1 (reference/fedgucci.md section 9)")


# ------------------------------------------------------------------ group barrier
def group_connectivity(models: Sequence[ModelLike], evaluator: Evaluator, *, threshold: float = DEFAULT_THRESHOLD,
                       metric: str = "accuracy", weights: Sequence[float] | None = None, by_size: bool = False,
                       draws: int = 5, seed: int = 0) -> Verdict:
    """FedGuCci Definition 3.6: the group barrier (Eq. 10 accuracy / Eq. 9 loss) is ``<= threshold``.

    With ``by_size`` the barrier of ``draws`` random subsets of every size K (Fig. 4) is also
    computed and its mean per K reported.
    """
    _check_metric(metric)
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
        kind="group_connectivity", status="holds" if holds else "fails",
        reason=f"group barrier {value:.4g} {'<=' if holds else '>'} {threshold:g}",
        claim=f"Group connectivity: the {len(models)} models share a low-{metric}-barrier region "
              "around their centroid",
        numbers=numbers, thresholds={"metric": metric, "threshold": threshold}, results=results,
        reference="FedGuCci Definition 3.6, Eq. 9/10, Figure 4 (reference/fedgucci.md section 1.4)")


# ------------------------------------------------------------------- shared basin
def shared_basin(client_models: Sequence[ModelLike] | Mapping[str, ModelLike], global_model: ModelLike,
                 evaluator: Evaluator, *, plane_kind: str = "clients", plane_clients: Sequence[int] = (0, 1, 2),
                 resolution: int = 21, margin: float = 0.2, level: float | None = None,
                 barrier_threshold: float = DEFAULT_THRESHOLD, metric: str = "loss",
                 alphas: int | Sequence[float] = 11, refine: bool = True) -> Verdict:
    """IMA section 4 (C2): the clients and the global model lie in one basin, without barriers.

    The plane (``plane_kind``) passes through three clients (``plane_clients``, Garipov
    construction, the global model projected onto it) or is spanned by the clients' top-2
    principal directions around the global model (``"pca"``). The basin is the flood-filled
    component of ``{L <= c}`` with ``c`` = the highest grid loss at the plane's clients (or
    ``level``). The claim holds when the plane's clients and the global model share that
    component and every client-global linear path has a barrier (``metric``, Eq. 3/4)
    ``<= barrier_threshold``. Reported as well, not part of the verdict: how many clients are
    "on the wall" (loss falling monotonically along the line to the global model, IMA C2), and
    (IMA C3) the global model's distance to the basin bottom, its loss gap, whether it is off
    the bottom (farther than one grid-cell diagonal), and its distance to the plane.
    """
    _check_metric(metric)
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
    elif plane_kind == "pca":
        if len(names) < 2:
            raise ConfigError("a PCA plane of the clients needs at least two clients")
        in_plane = names
        grid = pca_plane([vecs[n] for n in names] + [g], evaluator, resolution=resolution, margin=margin)
        coords = list(grid.models.values())
        grid = dataclasses.replace(grid, models={**dict(zip(names, coords)), "global": coords[-1]})
    else:
        raise ConfigError(f"plane_kind must be 'clients' or 'pca', got {plane_kind!r}")
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
        kind="shared_basin", status="holds" if holds else "fails", reason=reason, numbers=numbers,
        claim="Shared basin: the client models and the global model lie in one low-loss basin",
        thresholds={"metric": metric, "barrier_threshold": barrier_threshold, "level": found.level,
                    "plane": plane_kind, "resolution": resolution},
        results={"plane": grid, "basin": found, "paths": paths, "metrics": metrics},
        reference="IMA section 4, claims C2/C3 (reference/ima.md sections 1.4 and 6)")


# ------------------------------------------------------------------------ flatness
def flatter(model_a: ModelLike, model_b: ModelLike, evaluator: Evaluator, *, k: int = 1, tol: float = 1e-3,
            max_iter: int = 100, seed: int = 0, margin: float = 0.0, density: bool = False,
            density_iterations: int = 50) -> Verdict:
    """Model a is flatter than b: ``lambda_max(a) < (1 - margin) * lambda_max(b)``.

    ``lambda_max`` is the top eigenvalue of the Hessian of the evaluator's loss (Lanczos,
    :func:`landscape.hessian_eigen`); the ``k`` largest are reported. ``density=True`` also
    estimates both spectral densities (SLQ) for the figure.
    """
    if not 0.0 <= margin < 1.0:
        raise ConfigError(f"margin must lie in [0, 1), got {margin}")
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
        kind="flatter", status="holds" if holds else "fails",
        reason=f"top Hessian eigenvalue {la:.4g} (a) {'<' if holds else '>='} "
               f"{'' if margin == 0 else f'{1 - margin:g} x '}{lb:.4g} (b)",
        claim="Flatness: model a lies in a flatter region than model b (smaller top Hessian eigenvalue)",
        numbers=numbers, thresholds={"margin": margin, "k": k, "tol": tol}, results=results,
        reference="FedGuCci+ (SAM, reference/fedgucci.md section 4.2); IMA C15")


__all__ = ["Verdict", "flatter", "group_connectivity", "shared_basin", "transitivity"]
