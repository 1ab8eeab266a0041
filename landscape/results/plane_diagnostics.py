"""Whether a plane's picture is worth reading: diagnostics computed from its grid alone.

:attr:`PlaneResult.diagnostics <landscape.results.PlaneResult.diagnostics>` computes them on
demand from the stored ``x``, ``y``, ``loss`` and ``accuracy``: nothing is stored, so results
read back from any cache, old or new, get them too. Four checks, each with a one-line note for
figures and reports:

* **flat**: the loss varies by less than :data:`FLAT_RELATIVE` of its size across the grid;
  the colour scale then stretches rounding-level differences (the span is far too small).
* **saturated**: at least :data:`SATURATED_SHARE` of the grid is non-finite or far above the
  centre (:data:`SATURATED_FACTOR` times it and :data:`SATURATED_MIN_RISE` above it), or the
  accuracy off the centre has collapsed (at most :data:`ACCURACY_COLLAPSE` of the centre's
  everywhere): the basin is a few cells in a plateau (the span is far too large).
* **non-finite**: the share of grid losses that overflowed to NaN or inf.
* **centre not the minimum**: a grid point's loss is below the centre's by more than
  :data:`CENTRE_TOLERANCE` of it: the model is not at a minimum along these directions (the
  evaluation data is not the training data, training had not converged, or the directions are
  badly scaled). Only for planes centred on one model (:data:`CENTRED_KINDS`); the origin of
  a plane through three models is just one of them.

The centre is the grid point nearest to ``(0, 0)`` (a grid point itself for an odd resolution of
a random plane), when ``(0, 0)`` lies within half a cell of the grid.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Relative loss range under which a grid is flat: a loss that changes by under 0.1% across the
#: whole grid draws contours of differences no reader would call a landscape.
FLAT_RELATIVE = 1e-3
#: A grid point is far above the centre at this multiple of the centre loss (two decades: the
#: top colour of a log-scaled plot that starts at the centre) ...
SATURATED_FACTOR = 100.0
#: ... and at least this many loss units above it (for cross-entropy, the true class's
#: probability below e**-10 times the centre's: confidently wrong, far past chance).
SATURATED_MIN_RISE = 10.0
#: Share of the grid far above the centre (or non-finite) from which the plateau dominates.
SATURATED_SHARE = 0.5
#: Accuracy everywhere off the centre at most this fraction of the centre's counts as collapsed:
#: chance on a balanced two-class task is half a perfect accuracy, on more classes less.
ACCURACY_COLLAPSE = 0.6
#: A grid point lower than the centre by more than this fraction of the centre's loss fires
#: "centre not the minimum"; smaller dips are the usual offset between the minimum of the
#: training loss and of the evaluation data.
CENTRE_TOLERANCE = 0.05
#: ``spec["kind"]`` of the planes centred on one model, for which the centre checks apply.
CENTRED_KINDS = ("random_plane", "pca_plane")


@dataclass(frozen=True)
class PlaneDiagnostics:
    """The diagnostics of one plane's grid (see the module's documentation for each rule).

    Attributes
    ----------
    flat : bool
        The finite losses vary by less than :data:`FLAT_RELATIVE` of their size.
    saturated : bool
        A plateau of huge or non-finite losses fills :data:`SATURATED_SHARE` of the grid, or
        ``accuracy_collapsed``.
    accuracy_collapsed : bool
        Every off-centre accuracy is at most :data:`ACCURACY_COLLAPSE` times the centre's.
    centre_not_minimum : bool
        A grid loss lies below the centre's by more than :data:`CENTRE_TOLERANCE` of it.
    nonfinite_share : float
        Fraction of grid losses that are NaN or inf.
    saturated_share : float
        Fraction of grid losses that are non-finite or at least ``saturation_level``.
    saturation_level : float
        The loss counted as far above the centre (the lowest loss when the plane has no centre).
    relative_range : float
        ``(max - min) / max(|min|, |max|)`` of the finite losses (NaN when none is finite).
    centre_loss, centre_accuracy : float
        The metrics at the centre grid point (NaN when the plane has no centre on its grid).
    lowest : tuple of float
        ``(x, y, loss)`` of the lowest finite grid loss (NaNs when none is finite).
    """

    flat: bool
    saturated: bool
    accuracy_collapsed: bool
    centre_not_minimum: bool
    nonfinite_share: float
    saturated_share: float
    saturation_level: float
    relative_range: float
    centre_loss: float
    centre_accuracy: float
    lowest: tuple[float, float, float]

    @property
    def fired(self) -> bool:
        """Whether any diagnostic fired (a note is due)."""
        return bool(self.flat or self.saturated or self.centre_not_minimum or self.nonfinite_share > 0)

    @property
    def messages(self) -> dict[str, str]:
        """One short line per fired diagnostic, keyed ``flat``, ``saturated``, ``nonfinite``, ``centre``."""
        out = {}
        if self.flat:
            out["flat"] = (f"flat: the loss varies by {self.relative_range:.2g} of its size across the grid "
                           "(widen the grid)")
        if self.saturated and self.accuracy_collapsed:
            out["saturated"] = (f"saturated: the accuracy off the centre has collapsed (centre "
                                f"{self.centre_accuracy:.3g}) (narrow the grid)")
        elif self.saturated:
            out["saturated"] = (f"saturated: {self.saturated_share:.0%} of the grid's losses are non-finite or "
                                f"above {self.saturation_level:.3g} (narrow the grid)")
        if self.nonfinite_share > 0:
            out["nonfinite"] = f"non-finite: {self.nonfinite_share:.1%} of the grid's losses are NaN or inf"
        if self.centre_not_minimum:
            x, y, low = self.lowest
            out["centre"] = (f"centre not the minimum: loss {low:.4g} at ({x:.3g}, {y:.3g}) against "
                             f"{self.centre_loss:.4g} at the centre")
        return out

    @property
    def notes(self) -> list[str]:
        """The lines of :attr:`messages`, for a caption (empty when none fired)."""
        return list(self.messages.values())


def centre_index(x: np.ndarray, y: np.ndarray) -> tuple[int, int] | None:
    """``(row, column)`` of the grid point nearest to ``(0, 0)``, if within half a cell of the grid.

    Parameters
    ----------
    x, y
        Increasing grid coordinates (columns, rows).

    Returns
    -------
    tuple of int, or None
        The indices, or None when ``(0, 0)`` lies outside the grid.
    """
    index = []
    for axis in (y, x):
        axis = np.asarray(axis, dtype=np.float64)
        half = 0.5 * (axis[-1] - axis[0]) / max(len(axis) - 1, 1)
        if not axis[0] - half <= 0.0 <= axis[-1] + half:
            return None
        index.append(int(np.argmin(np.abs(axis))))
    return index[0], index[1]


def diagnose_plane(x: np.ndarray, y: np.ndarray, loss: np.ndarray, accuracy: np.ndarray, *,
                   centred: bool) -> PlaneDiagnostics:
    """The diagnostics of a grid (see the module's documentation for each rule).

    Parameters
    ----------
    x, y
        Grid coordinates (``loss[i, j]`` is at ``(x[j], y[i])``).
    loss, accuracy
        ``(len(y), len(x))`` metrics.
    centred
        Whether the plane is centred on one model at ``(0, 0)`` (the centre checks apply).

    Returns
    -------
    PlaneDiagnostics
    """
    loss = np.asarray(loss, dtype=np.float64)
    accuracy = np.asarray(accuracy, dtype=np.float64)
    finite = np.isfinite(loss)
    centre = centre_index(x, y) if centred else None
    centre_loss = float(loss[centre]) if centre is not None else float("nan")
    centre_accuracy = float(accuracy[centre]) if centre is not None else float("nan")
    if not finite.any():
        return PlaneDiagnostics(False, True, False, False, 1.0, 1.0, float("nan"), float("nan"), centre_loss,
                                centre_accuracy, (float("nan"),) * 3)
    lo, hi = float(loss[finite].min()), float(loss[finite].max())
    scale = max(abs(lo), abs(hi))
    relative = (hi - lo) / scale if scale > 0 else 0.0
    row, col = np.unravel_index(np.argmin(np.where(finite, loss, np.inf)), loss.shape)
    reference = centre_loss if np.isfinite(centre_loss) else lo
    high = max(SATURATED_FACTOR * reference, reference + SATURATED_MIN_RISE)
    saturated_share = float((~finite | (np.where(finite, loss, 0.0) >= high)).mean())
    collapsed = False
    if centre is not None and np.isfinite(centre_accuracy) and centre_accuracy > 0 and loss.size > 1:
        off = np.ones(loss.shape, dtype=bool)
        off[centre] = False
        others = accuracy[off & np.isfinite(accuracy)]
        collapsed = bool(others.size and others.max() <= ACCURACY_COLLAPSE * centre_accuracy)
    below = np.isfinite(centre_loss) and lo < centre_loss - CENTRE_TOLERANCE * abs(centre_loss)
    return PlaneDiagnostics(
        flat=bool(relative < FLAT_RELATIVE), saturated=bool(saturated_share >= SATURATED_SHARE or collapsed),
        accuracy_collapsed=collapsed, centre_not_minimum=bool(below),
        nonfinite_share=float((~finite).mean()), saturated_share=saturated_share, saturation_level=high,
        relative_range=relative,
        centre_loss=centre_loss, centre_accuracy=centre_accuracy,
        lowest=(float(np.asarray(x)[col]), float(np.asarray(y)[row]), lo))
