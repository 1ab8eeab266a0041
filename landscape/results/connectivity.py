"""Result classes of learned curves and simplices.

Cacheable like every landscape result; the registry gives them the summary ``repr`` and HTML
of :class:`landscape.results.base.Result`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from .base import Result, register
from .curve_shapes import coefficients
from .geometry import PathResult


@register
@dataclass(frozen=True, eq=False)
class CurveResult(Result):
    """Loss and accuracy along a learned curve ``phi(t)`` and along the straight line beside it.

    ``knots`` are the flat vectors ``[a, bend(s)..., b]`` of the curve (Garipov et al. 2018,
    section 3.2: quadratic Bezier ``(1-t)^2 a + 2t(1-t) theta + t^2 b`` or a polygonal chain
    through the bends); ``loss``/``accuracy`` on the curve and ``line_loss``/``line_accuracy``
    on ``(1 - t) a + t b`` are measured at the same ``t``. ``history`` is the mean training
    loss of each epoch. Barriers follow FedGuCci Eq. 3/4 with ``t`` in place of alpha.

    Attributes
    ----------
    t : numpy.ndarray
        Curve parameters in [0, 1] at which both paths were measured.
    loss, accuracy : numpy.ndarray
        Metrics on the curve at ``t``.
    line_loss, line_accuracy : numpy.ndarray
        Metrics on the straight line ``(1 - t) a + t b`` at ``t``.
    knots : numpy.ndarray
        (m, D) flat vectors ``[a, bend(s)..., b]``; (m, S), the subset's entries, for a curve
        trained with ``params=`` (``spec["params"]``).
    curve_kind : str
        ``"bezier"`` or ``"polychain"``.
    history : list
        Mean training loss of each epoch.
    """

    t: np.ndarray
    loss: np.ndarray
    accuracy: np.ndarray
    line_loss: np.ndarray
    line_accuracy: np.ndarray
    knots: np.ndarray
    curve_kind: str = "bezier"
    history: list = field(default_factory=list)
    array_fields: ClassVar[tuple[str, ...]] = ("t", "loss", "accuracy", "line_loss", "line_accuracy", "knots")
    summary_fields: ClassVar[tuple[str, ...]] = ("curve_kind", "loss_barrier", "line_loss_barrier",
                                                 "accuracy_barrier", "line_accuracy_barrier")

    @property
    def path(self) -> PathResult:
        """The curve's metrics as a path over ``t``."""
        return PathResult(alphas=self.t, loss=self.loss, accuracy=self.accuracy, spec=self.spec)

    @property
    def line(self) -> PathResult:
        """The straight line's metrics at the same ``t``."""
        return PathResult(alphas=self.t, loss=self.line_loss, accuracy=self.line_accuracy, spec=self.spec)

    @property
    def loss_barrier(self) -> float:
        """Loss barrier of the curve (FedGuCci Eq. 3 over ``t``)."""
        return self.path.loss_barrier

    @property
    def accuracy_barrier(self) -> float:
        """Accuracy barrier of the curve (FedGuCci Eq. 4 over ``t``)."""
        return self.path.accuracy_barrier

    @property
    def line_loss_barrier(self) -> float:
        """Loss barrier of the straight line at the same ``t``."""
        return self.line.loss_barrier

    @property
    def line_accuracy_barrier(self) -> float:
        """Accuracy barrier of the straight line at the same ``t``."""
        return self.line.accuracy_barrier

    @property
    def bends(self) -> np.ndarray:
        """The learned bend or control points, (k, D) (or (k, S) on a parameter subset)."""
        return self.knots[1:-1]

    def point(self, t: float) -> np.ndarray:
        """The flat vector ``phi(t)`` (Garipov et al. 2018, section 3.2).

        Parameters
        ----------
        t : float
            Curve parameter in [0, 1].

        Returns
        -------
        numpy.ndarray
            (D,) combination of the knots with the curve's coefficients at ``t`` ((S,) on a
            parameter subset: the subset's entries).
        """
        return coefficients(self.curve_kind, np.array([t]), len(self.knots))[0] @ self.knots


@register
@dataclass(frozen=True, eq=False)
class SimplexResult(Result):
    """Loss and accuracy over a simplex of models (Benton et al. 2021).

    ``vertices`` (m, D) are flat vectors, the first ``fixed`` of them given, the others learned;
    the complex is the union of the simplexes ``conv({fixed_i} + learned)``. ``coords`` (S, m) are
    barycentric coordinates of the evaluated points (vertices first, then each simplex's
    centroid, then uniform samples), with ``loss``/``accuracy`` there. Barriers generalise
    FedGuCci Eq. 9/10 to every point: ``max_p [L(sum_i l_i v_i) - sum_i l_i L(v_i)]``.

    Attributes
    ----------
    coords : numpy.ndarray
        (S, m) barycentric coordinates of the evaluated points.
    loss, accuracy : numpy.ndarray
        (S,) metrics at those points.
    vertices : numpy.ndarray
        (m, D) flat vectors of the vertices.
    fixed : int
        Number of given (not learned) vertices, the first rows of ``vertices``.
    history : list
        Mean training loss of each epoch.
    """

    coords: np.ndarray
    loss: np.ndarray
    accuracy: np.ndarray
    vertices: np.ndarray
    fixed: int = 2
    history: list = field(default_factory=list)
    array_fields: ClassVar[tuple[str, ...]] = ("coords", "loss", "accuracy", "vertices")
    summary_fields: ClassVar[tuple[str, ...]] = ("fixed", "loss_barrier", "accuracy_barrier")

    @property
    def vertex_loss(self) -> np.ndarray:
        """(m,) loss at the vertices."""
        return self.loss[:len(self.vertices)]

    @property
    def vertex_accuracy(self) -> np.ndarray:
        """(m,) accuracy at the vertices."""
        return self.accuracy[:len(self.vertices)]

    @property
    def loss_barrier(self) -> float:
        """``max_p [L(p) - sum_i l_i L(v_i)]`` over the evaluated points (FedGuCci Eq. 9 generalised)."""
        return float(np.max(self.loss - self.coords @ self.vertex_loss))

    @property
    def accuracy_barrier(self) -> float:
        """``max_p [1 - A(p) / sum_i l_i A(v_i)]`` over the evaluated points (FedGuCci Eq. 10 generalised)."""
        expected = self.coords @ self.vertex_accuracy
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(np.max(np.where(expected > 0, 1.0 - self.accuracy / expected, 0.0)))
