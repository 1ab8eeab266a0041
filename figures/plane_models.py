"""Where the models sit on a plane: grouped by role, in drawing order, with shared labels.

Used by the plane figures (:mod:`figures.planes`): models come from ``PlaneResult.models``
(label -> (x, y)); their role (client, global, anchor, ima, average, model) is given
explicitly or inferred from the label prefix (:func:`figures.style.role_of`).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
from scipy.interpolate import RegularGridInterpolator

from landscape.results import PlaneResult

from .style import ROLES, role_of


def model_points(plane: PlaneResult, roles: Mapping[str, str] | None = None
                 ) -> dict[str, list[tuple[str, float, float]]]:
    """Models grouped by role: ``{role: [(label, x, y), ...]}`` in the order of ``plane.models``."""
    grouped: dict[str, list[tuple[str, float, float]]] = {}
    for label, xy in plane.models.items():
        x, y = (float(c) for c in list(xy)[:2])
        label = str(label)  # models given as a mapping may be keyed by client id
        grouped.setdefault(role_of(label, roles).name, []).append((label, x, y))
    return grouped


def by_size(grouped: Mapping[str, list[tuple[str, float, float]]]) -> list[tuple[str, list[tuple[str, float, float]]]]:
    """Roles in drawing order, biggest marker first: a smaller marker on the same spot stays on top."""
    return sorted(grouped.items(), key=lambda item: -ROLES[item[0]].size)


def value_at(plane: PlaneResult, values: np.ndarray, x: float, y: float) -> float:
    """Bilinear interpolation of grid ``values`` at (x, y); NaN outside the grid."""
    interp = RegularGridInterpolator((plane.y, plane.x), values, bounds_error=False, fill_value=np.nan)
    return float(interp([[y, x]])[0])


def merged_labels(plane: PlaneResult, grouped: Mapping[str, list[tuple[str, float, float]]],
                  tol: float = 0.02) -> list[tuple[str, float, float]]:
    """One label per spot: models closer than ``tol`` of the plane's extent share one joined label.

    Parameters
    ----------
    plane
        The plane (its grid extent sets the distance scale).
    grouped
        ``{role: [(label, x, y), ...]}`` as from :func:`model_points`.
    tol
        Fraction of the larger grid side under which two models count as the same spot
        (e.g. a FedAvg global model and the average of its clients).

    Returns
    -------
    list of (text, x, y)
        ``text`` joins the labels of the models at that spot with " = ".
    """
    scale = tol * max(plane.x[-1] - plane.x[0], plane.y[-1] - plane.y[0])
    spots: list[tuple[list[str], float, float]] = []
    for pts in grouped.values():
        for label, x, y in pts:
            for names, sx, sy in spots:
                if np.hypot(x - sx, y - sy) <= scale:
                    names.append(label)
                    break
            else:
                spots.append(([label], x, y))
    return [(" = ".join(names), x, y) for names, x, y in spots]
