"""Where the models sit on a plane: grouped by role, in drawing order, with shared labels.

Used by the plane figures (:mod:`figures.planes`): models come from ``PlaneResult.models``
(label -> (x, y)); their role (client, global, anchor, ima, average, model) is given
explicitly or inferred from the label prefix (:func:`figures.style.role_of`).
"""
from __future__ import annotations

from dataclasses import dataclass
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


#: Estimated size of a plotly model label (font size 12 on a padded box): pixels per character, height.
CHAR_PX, LABEL_PX = 7.0, 18.0
#: Half the width of a plotly model marker (size 11, a star a little wider), in pixels.
MARKER_PX = 7.0


@dataclass(frozen=True)
class LabelSpot:
    """Where a plotly label goes: beside the point (x, y) of its model, shifted by pixels."""

    text: str
    x: float
    y: float
    xshift: float
    yshift: float
    xanchor: str

    def box(self, x_px: float, y_px: float) -> tuple[float, float, float, float]:
        """``(left, bottom, right, top)`` in pixels of the label of a model drawn at (x_px, y_px)."""
        width = CHAR_PX * len(self.text) + 4
        left = x_px + self.xshift - (width if self.xanchor == "right" else 0.0)
        bottom = y_px + self.yshift - LABEL_PX / 2
        return left, bottom, left + width, bottom + LABEL_PX


def _overlaps(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def placed_labels(spots: list[tuple[str, float, float]], px_per_unit: float, size: tuple[float, float],
                  origin: tuple[float, float]) -> list[LabelSpot]:
    """Labels beside their markers, apart from each other and off every other marker.

    Each label tries the side of its marker facing the middle of the plot, then the other side,
    each at the marker's height, then a row above or below (up to three rows); it takes the
    first position whose box stays in the plot and overlaps no label placed before it and no
    marker. When none is free it keeps the first.

    Parameters
    ----------
    spots
        ``(text, x, y)`` per spot, as from :func:`merged_labels`.
    px_per_unit
        Pixels per plane unit (both axes are drawn to the same scale).
    size
        Width and height of the plotting area in pixels.
    origin
        Plane coordinates of its lower-left corner.

    Returns
    -------
    list of LabelSpot
        One per spot, in the same order.
    """
    pixels = [((x - origin[0]) * px_per_unit, (y - origin[1]) * px_per_unit) for _, x, y in spots]
    markers = [(px - MARKER_PX, py - MARKER_PX, px + MARKER_PX, py + MARKER_PX) for px, py in pixels]
    taken: list[tuple[float, float, float, float]] = []
    out = []
    for (text, x, y), (px, py) in zip(spots, pixels):
        side = 1.0 if px <= size[0] / 2 else -1.0
        candidates = [LabelSpot(text, x, y, s * (MARKER_PX + 2), row * LABEL_PX, "left" if s > 0 else "right")
                      for row in (0, 1, -1, 2, -2, 3, -3) for s in (side, -side)]
        for candidate in candidates:
            box = candidate.box(px, py)
            inside = box[0] >= 0 and box[2] <= size[0] and box[1] >= 0 and box[3] <= size[1]
            if inside and not any(_overlaps(box, other) for other in taken + markers):
                break
        else:
            candidate = candidates[0]
        taken.append(candidate.box(px, py))
        out.append(candidate)
    return out
