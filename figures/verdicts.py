"""Figures of a claim verdict's evidence (the core ``landscape.claims`` never imports figures)."""
from __future__ import annotations

import dataclasses
from typing import Any

from landscape import ConfigError, Verdict


def verdict_figure(verdict: Verdict, **options: Any):
    """A matplotlib figure of the evidence behind a verdict.

    Parameters
    ----------
    verdict
        A verdict from ``landscape.claims``: transitivity (the three or four interpolation
        curves), group_connectivity (the group barrier against K; needs ``by_size=True``),
        shared_basin (the plane with the models and the basin bottom), flatter (the two Hessian
        spectral densities; needs ``density=True``), connected_modulo_permutation (the paths before
        and after alignment), connected_by_curve (the learned curve against the line).
    **options
        Passed to the underlying figure function.

    Returns
    -------
    matplotlib.figure.Figure
    """
    results = verdict.results
    if verdict.kind == "transitivity":
        from .paths import path_figure

        return path_figure(dict(results["paths"]), title="Transitivity of LMC", **options)
    if verdict.kind == "group_connectivity":
        sizes = results.get("by_size")
        if sizes is None:
            raise ConfigError("the group barrier figure shows barriers against K: run "
                              "group_connectivity(..., by_size=True)")
        from .groups import group_size_figure

        metric = verdict.thresholds.get("metric", "accuracy")
        values = sizes.accuracy_barrier if metric == "accuracy" else sizes.loss_barrier
        series = {"group": {int(k): list(map(float, row)) for k, row in zip(sizes.sizes, values)}}
        return group_size_figure(series, metric=metric, **options)
    if verdict.kind == "shared_basin":
        from .planes import plane_figure

        grid, found = results["plane"], results["basin"]
        marked = dataclasses.replace(grid, models={**grid.models, "basin bottom": list(found.refined_bottom)})
        return plane_figure(marked, title="Shared basin", **options)
    if verdict.kind == "flatter":
        densities = results.get("densities")
        if densities is None:
            raise ConfigError("the flatness figure shows Hessian densities: run flatter(..., density=True)")
        from .curvature import spectral_density_figure

        return spectral_density_figure(dict(densities), **options)
    if verdict.kind == "connected_modulo_permutation":
        from .connectivity import alignment_figure

        return alignment_figure(dict(results["paths"]), **options)
    if verdict.kind == "connected_by_curve":
        from .connectivity import curve_figure

        return curve_figure(results["curve"], **options)
    raise ConfigError(f"no figure for claim kind {verdict.kind!r}")
