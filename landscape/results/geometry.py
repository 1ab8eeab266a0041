"""Results of the geometry analyses: metrics of models, linear paths, groups and planes.

Barrier conventions (see ``docs/barriers.md``): a pairwise path barrier (FedGuCci Eq. 3/4) is a
supremum over the path *including its endpoints*, where the excess is zero, so it is never
negative; a group barrier (FedGuCci Eq. 9/10) compares the fused model with the weighted mean
of the members and is negative when the fused model is better than its members on average.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping

import numpy as np

from .barriers import (
    accuracy_barrier_curve,
    barrier_from_curve,
    code_accuracy_barrier,
    group_accuracy_barrier,
    group_loss_barrier,
    loss_barrier_curve,
)
from .base import Result, format_value, register
from .plane_diagnostics import CENTRED_KINDS, PlaneDiagnostics, diagnose_plane
from .vtk import write_plane_vtk


class GridExtremes:
    """Extremes of the ``loss`` and ``accuracy`` arrays of a path or a plane."""

    loss: np.ndarray
    accuracy: np.ndarray

    @property
    def nonfinite(self) -> int:
        """Number of grid points whose loss overflowed to inf or NaN."""
        return int((~np.isfinite(self.loss)).sum())

    @property
    def min_loss(self) -> float:
        """Lowest finite loss on the grid."""
        finite = self.loss[np.isfinite(self.loss)]
        return float(finite.min()) if finite.size else float("nan")

    @property
    def max_accuracy(self) -> float:
        """Highest accuracy on the grid."""
        return float(np.nanmax(self.accuracy)) if np.isfinite(self.accuracy).any() else float("nan")


class SearchRecord:
    """The ``search`` record of an adaptive barrier search (``alphas="adaptive"``), shown in summaries.

    Empty for a fixed grid (and left out of the summary then). Its keys are those of
    :func:`landscape.geometry.adaptive.adaptive_search` (``docs/barriers.md``, "Adaptive search").
    """

    search: Mapping[str, Any]

    def summary(self) -> dict[str, str]:
        """The result's summary, with the search's evaluations and gaps instead of the whole record.

        Returns
        -------
        dict
            name -> formatted value.
        """
        out = super().summary()  # type: ignore[misc]
        out.pop("search", None)
        for key in ("evaluations", "loss_gap", "accuracy_gap", "converged"):
            if key in self.search:
                out[key] = format_value(self.search[key])
        return out


@register
@dataclass(frozen=True, eq=False)
class Metrics(Result):
    """Loss and accuracy of a list of models, one entry per model.

    Attributes
    ----------
    loss, accuracy : np.ndarray
        ``(n,)``: mean loss and accuracy of each model on the evaluator's data.
    """

    loss: np.ndarray
    accuracy: np.ndarray
    array_fields: ClassVar[tuple[str, ...]] = ("loss", "accuracy")


@register
@dataclass(frozen=True, eq=False)
class PathResult(GridExtremes, SearchRecord, Result):
    """Metrics along ``(1 - alpha) * a + alpha * b`` (FedGuCci Eq. 3/4).

    Barriers use the grid points with alpha in [0, 1]; 0 and 1 must be on the grid.

    Attributes
    ----------
    alphas : np.ndarray
        ``(n,)``: the interpolation coefficients, increasing (may extend beyond [0, 1]); with
        ``alphas="adaptive"`` every point the search evaluated.
    loss, accuracy : np.ndarray
        ``(n,)``: ``L(alpha)`` and ``A(alpha)`` at each coefficient.
    search : Mapping[str, Any]
        The adaptive search's record (evaluations, ``loss_gap``, ``accuracy_gap``, ``converged``,
        ...); empty for a fixed grid.
    """

    summary_fields: ClassVar[tuple[str, ...]] = ('loss_barrier', 'accuracy_barrier', 'nonfinite')

    alphas: np.ndarray
    loss: np.ndarray
    accuracy: np.ndarray
    search: Mapping[str, Any] = field(default_factory=dict)
    array_fields: ClassVar[tuple[str, ...]] = ("alphas", "loss", "accuracy")

    @property
    def evaluations(self) -> int:
        """Points evaluated: the adaptive search's count, or the grid's size."""
        return int(self.search.get("evaluations", len(self.alphas)))

    @property
    def loss_curve(self) -> np.ndarray:
        """L(alpha) - [(1 - alpha) L(0) + alpha L(1)] on the [0, 1] part of the grid."""
        return loss_barrier_curve(self.alphas, self.loss)

    @property
    def accuracy_curve(self) -> np.ndarray:
        """1 - A(alpha) / [(1 - alpha) A(0) + alpha A(1)] on the [0, 1] part of the grid."""
        return accuracy_barrier_curve(self.alphas, self.accuracy)

    @property
    def loss_barrier(self) -> float:
        """FedGuCci Eq. 3: max over alpha of the loss above the endpoints' line."""
        return barrier_from_curve(self.loss_curve)

    @property
    def accuracy_barrier(self) -> float:
        """FedGuCci Eq. 4: max over alpha of the relative accuracy drop below the line."""
        return barrier_from_curve(self.accuracy_curve)

    @property
    def loss_barrier_midpoint(self) -> float:
        """Midpoint variant: L(0.5) - (L(0) + L(1)) / 2 (needs 0.5 on the grid)."""
        return float(_at(self.alphas, self.loss, 0.5) - 0.5 * (_at(self.alphas, self.loss, 0.0)
                                                               + _at(self.alphas, self.loss, 1.0)))

    @property
    def accuracy_barrier_midpoint(self) -> float:
        """Midpoint variant: 1 - A(0.5) / ((A(0) + A(1)) / 2), FedGuCci Table 1's columns."""
        ind = 0.5 * (_at(self.alphas, self.accuracy, 0.0) + _at(self.alphas, self.accuracy, 1.0))
        return float(1.0 - _at(self.alphas, self.accuracy, 0.5) / ind) if ind > 0 else float("nan")

    @property
    def accuracy_barrier_code(self) -> float:
        """The FedGuCci code's variant: gap d = line - A at its argmax, divided by the line there."""
        return code_accuracy_barrier(self.alphas, self.accuracy)


def _at(alphas: np.ndarray, values: np.ndarray, alpha: float) -> float:
    idx = np.flatnonzero(np.isclose(alphas, alpha, atol=1e-9))
    if idx.size == 0:
        raise ValueError(f"alpha={alpha} is not on the path grid {np.round(alphas, 4).tolist()}")
    return float(values[idx[0]])


@register
@dataclass(frozen=True, eq=False)
class GroupResult(Result):
    """Group barrier of K models (FedGuCci Definition 3.6, Eq. 9/10) around their fused model.

    Attributes
    ----------
    weights : np.ndarray
        ``(K,)``: the weights ``mu_i`` of the members (summing to 1).
    member_loss, member_accuracy : np.ndarray
        ``(K,)``: ``L(w_i)`` and ``A(w_i)``.
    fused_loss, fused_accuracy : float
        ``L`` and ``A`` of the fused model ``sum_i mu_i w_i``.
    """

    summary_fields: ClassVar[tuple[str, ...]] = ('loss_barrier', 'accuracy_barrier', 'fused_loss', 'fused_accuracy')

    weights: np.ndarray
    member_loss: np.ndarray
    member_accuracy: np.ndarray
    fused_loss: float
    fused_accuracy: float
    array_fields: ClassVar[tuple[str, ...]] = ("weights", "member_loss", "member_accuracy")

    @property
    def loss_barrier(self) -> float:
        """L(fused) - sum_i mu_i L(w_i)."""
        return group_loss_barrier(self.fused_loss, self.member_loss, self.weights)

    @property
    def accuracy_barrier(self) -> float:
        """1 - A(fused) / sum_i mu_i A(w_i)."""
        return group_accuracy_barrier(self.fused_accuracy, self.member_accuracy, self.weights)


@register
@dataclass(frozen=True, eq=False)
class BarrierMatrix(SearchRecord, Result):
    """Pairwise path barriers among n models; entry (i, j) is the barrier of the i-j path.

    Attributes
    ----------
    loss_barrier, accuracy_barrier : np.ndarray
        ``(n, n)``: FedGuCci Eq. 3 and Eq. 4 barriers of each pair's linear path.
    labels : list
        The models' names, in matrix order.
    search : Mapping[str, Any]
        With ``alphas="adaptive"``: the points evaluated in all and per pair, the largest gaps
        over the pairs and whether every pair converged; empty for a fixed grid.
    """

    summary_fields: ClassVar[tuple[str, ...]] = ('max_accuracy_barrier', 'max_loss_barrier')

    loss_barrier: np.ndarray
    accuracy_barrier: np.ndarray
    labels: list = field(default_factory=list)
    search: Mapping[str, Any] = field(default_factory=dict)
    array_fields: ClassVar[tuple[str, ...]] = ("loss_barrier", "accuracy_barrier")

    @property
    def max_loss_barrier(self) -> float:
        """Largest pairwise loss barrier."""
        return float(np.nanmax(self.loss_barrier))

    @property
    def max_accuracy_barrier(self) -> float:
        """Largest pairwise accuracy barrier."""
        return float(np.nanmax(self.accuracy_barrier))


@register
@dataclass(frozen=True, eq=False)
class PlaneResult(GridExtremes, Result):
    """Metrics on a 2-D grid ``origin + x u + y v`` (u, v orthonormal over parameters).

    ``loss`` and ``accuracy`` have shape ``(len(y), len(x))``. ``models`` maps labels of the
    models that define or were placed in the plane to their ``(x, y)`` coordinates.

    Attributes
    ----------
    x, y : np.ndarray
        The grid's coordinates along ``u`` and ``v``.
    loss, accuracy : np.ndarray
        ``(len(y), len(x))``: metrics at each grid point.
    origin, u, v : np.ndarray
        Flat parameter vectors: the plane's origin and its two directions.
    param_mask : np.ndarray
        Flat, 1 where a coordinate belongs to the parameters the plane spans (others are
        ignored by :meth:`project`).
    models : Mapping[str, Any]
        Label -> ``[x, y]`` of the models placed in the plane.
    layout : list
        ``[[name, offset, numel], ...]`` of the parameter space, to flatten models.
    """

    summary_fields: ClassVar[tuple[str, ...]] = ('min_loss', 'max_accuracy', 'nonfinite')

    x: np.ndarray
    y: np.ndarray
    loss: np.ndarray
    accuracy: np.ndarray
    origin: np.ndarray
    u: np.ndarray
    v: np.ndarray
    param_mask: np.ndarray
    models: Mapping[str, Any] = field(default_factory=dict)
    layout: list = field(default_factory=list)  # [[name, offset, numel], ...] of the space
    array_fields: ClassVar[tuple[str, ...]] = ("x", "y", "loss", "accuracy", "origin", "u", "v",
                                                "param_mask")

    def project(self, model: Any) -> tuple[float, float, float]:
        """``(x, y, residual)`` of a model: its plane coordinates and its distance to the plane.

        Parameters
        ----------
        model : Any
            A flat parameter vector (numpy or torch, in the plane's parameter layout), a
            ``torch.nn.Module``, a state dict, or a checkpoint file path.

        Returns
        -------
        x, y : float
            Least-squares coordinates of ``model - origin`` in the span of ``u``, ``v`` (over
            ``param_mask``).
        residual : float
            The L2 distance of the model from the plane.

        Raises
        ------
        KeyError, ValueError
            The model lacks a parameter of the layout, or one has the wrong size.
        """
        vec = self._vector(model)
        m = self.param_mask.astype(bool)
        d = (vec - self.origin)[m].astype(np.float64)
        u, v = self.u[m].astype(np.float64), self.v[m].astype(np.float64)
        gram = np.array([[u @ u, u @ v], [u @ v, v @ v]])
        x, y = np.linalg.solve(gram, np.array([d @ u, d @ v]))  # least squares; u, v need not be orthonormal
        residual = float(np.linalg.norm(d - x * u - y * v))
        x, y = float(x), float(y)
        return x, y, residual

    def coordinates(self, model: Any) -> tuple[float, float]:
        """Projection ``(<w - origin, u>, <w - origin, v>)`` of any model onto the plane.

        Parameters
        ----------
        model : Any
            A flat parameter vector (numpy or torch, in the plane's parameter layout), a
            ``torch.nn.Module``, a state dict, or a checkpoint file path.

        Returns
        -------
        tuple[float, float]
            ``(x, y)`` as in :meth:`project`.
        """
        x, y, _ = self.project(model)
        return x, y

    @property
    def diagnostics(self) -> PlaneDiagnostics:
        """Flat, saturated, non-finite share, centre not the minimum: computed from the grid on demand.

        See :mod:`landscape.results.plane_diagnostics` for the rules and thresholds; the centre
        checks apply to planes centred on one model (``spec["kind"]`` a random or PCA plane).
        """
        return diagnose_plane(self.x, self.y, self.loss, self.accuracy,
                              centred=dict(self.spec).get("kind") in CENTRED_KINDS)

    def to_vtk(self, path: str | os.PathLike, *, flat: bool = False) -> Path:
        """Write the loss surface as a VTK legacy structured grid (``.vtk``) for ParaView.

        Parameters
        ----------
        path : str or os.PathLike
            The ``.vtk`` file (written atomically, never through a symbolic link).
        flat : bool
            Put the points at height 0 (for Warp By Scalar) instead of at their loss.

        Returns
        -------
        Path
            ``path``.

        Raises
        ------
        ConfigError
            ``path`` does not end in ``.vtk``, or no loss is finite.
        FileWriteError
            ``path`` or its folder is a symbolic link, or the write failed.
        """
        return write_plane_vtk(self, path, flat=flat)

    def with_models(self, **labelled: Any) -> "PlaneResult":
        """A copy with more models placed in the plane (label -> model-like).

        Parameters
        ----------
        **labelled : Any
            Label -> model, as accepted by :meth:`project`.

        Returns
        -------
        PlaneResult
            This result with the models' coordinates added to ``models``.
        """
        placed = dict(self.models)
        for label, model in labelled.items():
            placed[label] = list(self.coordinates(model))
        return dataclasses.replace(self, models=placed)

    def _vector(self, model: Any) -> np.ndarray:
        import torch

        if isinstance(model, np.ndarray):
            return model.astype(np.float64)
        if isinstance(model, torch.Tensor):
            return model.detach().double().cpu().numpy()
        if isinstance(model, torch.nn.Module):
            model = model.state_dict()
        if not isinstance(model, Mapping):
            from ..space.checkpoints import load_state_dict

            model = load_state_dict(model, template_keys=[n for n, _, _ in self.layout])
        parts = []
        for name, _offset, numel in self.layout:
            if name not in model:
                raise KeyError(f"model has no entry {name!r} of the plane's parameter space")
            t = model[name].detach().double().reshape(-1).cpu()
            if t.numel() != numel:
                raise ValueError(f"{name}: expected {numel} values, got {t.numel()}")
            parts.append(t.numpy())
        return np.concatenate(parts)
