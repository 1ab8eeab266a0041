"""Results of the curvature views: the loss along a Hessian eigenvector, and curvature per block.

* :class:`EigenLine` -- loss and accuracy on ``origin + t d`` beside the quadratic model's
  prediction (``landscape.eigen_line``);
* :class:`BlockCurvature` -- a table of the top eigenvalues and trace of each diagonal block of
  the Hessian (``landscape.curvature_by_block``): prints aligned, renders in a notebook, and
  converts to a list of dicts or a pandas data frame.

The eigen plane is a :class:`~landscape.results.PlaneResult` (``spec["kind"] == "eigen_plane"``).
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..infra.errors import ConfigError
from .base import Result, register
from .geometry import GridExtremes

MISSING = "-"


@register
@dataclass(frozen=True, eq=False)
class EigenLine(GridExtremes, Result):
    """Loss and accuracy along ``origin + t d``, ``d`` a (possibly filter-normalised) Hessian eigenvector.

    ``predicted`` is the second-order Taylor model ``L(w) + t g.d + t^2 d^T H d / 2`` at the origin
    ``w`` (``g`` the gradient). For the unit eigenvector (``normalization="none"``)
    ``d^T H d`` is its eigenvalue ``lambda``, so at a minimum (``g = 0``) the model is
    ``L(w) + t^2 lambda / 2``; the measured loss must agree with it to ``O(t^3)`` near ``t = 0``.

    Attributes
    ----------
    t : np.ndarray
        ``(n,)``: coordinates along ``d`` (parameter-norm units for a unit eigenvector).
    loss, accuracy : np.ndarray
        ``(n,)``: measured metrics at each coordinate.
    predicted : np.ndarray
        ``(n,)``: the quadratic model's loss at each coordinate.
    origin, direction : np.ndarray
        Flat vectors: the model ``w`` and the direction ``d`` (zero outside the differentiated
        parameters and on buffers).
    param_mask : np.ndarray
        Flat, 1 on the parameter entries of the space.
    eigenvalue : float
        ``lambda``, the solver's top eigenvalue.
    slope : float
        ``g.d``, the directional derivative at ``t = 0``.
    curvature : float
        ``d^T H d``, the second directional derivative (``lambda`` for the unit eigenvector).
    base_loss : float
        ``L(w)`` as the Hessian operator computes it (the model's constant term).
    """

    summary_fields: ClassVar[tuple[str, ...]] = ("eigenvalue", "curvature", "slope", "min_loss", "nonfinite")

    t: np.ndarray
    loss: np.ndarray
    accuracy: np.ndarray
    predicted: np.ndarray
    origin: np.ndarray
    direction: np.ndarray
    param_mask: np.ndarray
    eigenvalue: float
    slope: float
    curvature: float
    base_loss: float
    array_fields: ClassVar[tuple[str, ...]] = ("t", "loss", "accuracy", "predicted", "origin", "direction",
                                                "param_mask")

    @property
    def gap(self) -> np.ndarray:
        """``loss - predicted`` at each coordinate: how far the loss is from its quadratic model."""
        return np.asarray(self.loss, dtype=np.float64) - np.asarray(self.predicted, dtype=np.float64)


@register
@dataclass(frozen=True, eq=False)
class BlockCurvature(Result):
    """Top eigenvalues and trace of each diagonal block of the Hessian, one row per block.

    Row ``i`` is the Hessian restricted to the parameters of block ``i`` (the other parameters
    held fixed): its top ``top_k`` eigenvalues (NaN beyond the block's size) and, when asked
    for, a stochastic estimate of its trace with the estimator's standard error.

    Attributes
    ----------
    labels : list
        The blocks' names.
    patterns : list
        Per block, the parameter-name patterns that select it.
    sizes : np.ndarray
        ``(n,)``: parameters in each block.
    eigenvalues, residuals : np.ndarray
        ``(n, top_k)``: eigenvalues (descending) and residual norms ``||H x - theta x||``.
    eigen_converged : np.ndarray
        ``(n,)``: whether the eigen-solver met its tolerance on the block.
    trace, trace_stderr : np.ndarray or None
        ``(n,)``: the trace estimate and its standard error (0 when exact), or None when the
        trace was not computed.
    trace_converged : np.ndarray or None
        ``(n,)``: whether the estimator met its tolerance, or None.
    """

    summary_fields: ClassVar[tuple[str, ...]] = ("blocks", "sharpest_block", "max_top")

    labels: list
    patterns: list
    sizes: np.ndarray
    eigenvalues: np.ndarray
    residuals: np.ndarray
    eigen_converged: np.ndarray
    trace: np.ndarray | None = None
    trace_stderr: np.ndarray | None = None
    trace_converged: np.ndarray | None = None
    array_fields: ClassVar[tuple[str, ...]] = ("sizes", "eigenvalues", "residuals", "eigen_converged", "trace",
                                                "trace_stderr", "trace_converged")

    @property
    def blocks(self) -> int:
        """Number of blocks (rows)."""
        return len(self.labels)

    @property
    def max_top(self) -> float:
        """Largest top eigenvalue over the blocks."""
        top = np.asarray(self.eigenvalues, dtype=np.float64)[:, 0]
        return float(np.nanmax(top)) if np.isfinite(top).any() else float("nan")

    @property
    def sharpest_block(self) -> str:
        """Label of the block with the largest top eigenvalue."""
        top = np.asarray(self.eigenvalues, dtype=np.float64)[:, 0]
        return str(self.labels[int(np.nanargmax(top))]) if np.isfinite(top).any() else MISSING

    def rows(self) -> list[dict[str, Any]]:
        """The table as one dict per block.

        Returns
        -------
        list of dict
            Keys ``block``, ``parameters``, ``lambda_1`` ... ``lambda_k``, then ``trace`` and
            ``trace_stderr`` when the trace was computed, and ``converged`` (eigen-solver and
            trace estimator both met their tolerance). NaN marks an eigenvalue beyond a block's size.
        """
        values = np.asarray(self.eigenvalues, dtype=np.float64)
        out = []
        for i, label in enumerate(self.labels):
            row: dict[str, Any] = {"block": str(label), "parameters": int(self.sizes[i])}
            row.update({f"lambda_{j + 1}": float(values[i, j]) for j in range(values.shape[1])})
            converged = bool(self.eigen_converged[i])
            if self.trace is not None:
                row["trace"] = float(self.trace[i])
                row["trace_stderr"] = float(self.trace_stderr[i])
                converged = converged and bool(self.trace_converged[i])
            row["converged"] = converged
            out.append(row)
        return out

    def to_pandas(self) -> Any:
        """The table as a ``pandas.DataFrame`` (pandas is optional, not a dependency).

        Returns
        -------
        pandas.DataFrame
            One row per block, the columns of :meth:`rows`.

        Raises
        ------
        ConfigError
            pandas is not installed.
        """
        try:
            import pandas
        except ImportError:
            raise ConfigError("BlockCurvature.to_pandas needs pandas, which is optional: pip install pandas, "
                              "or use .rows() (a list of dicts)") from None
        return pandas.DataFrame(self.rows())

    def _cells(self) -> tuple[list[str], list[list[str]]]:
        rows = self.rows()
        header = list(rows[0]) if rows else ["block", "parameters", "lambda_1", "converged"]
        return header, [[_cell(row[c]) for c in header] for row in rows]

    def __str__(self) -> str:
        header, body = self._cells()
        widths = [max(len(h), *(len(r[j]) for r in body)) if body else len(h) for j, h in enumerate(header)]

        def line(cells: list[str]) -> str:
            return "  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(cells, widths)))

        title = "Hessian curvature by block (the diagonal block of each parameter group)"
        return "\n".join([title, line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in body])

    def _repr_html_(self) -> str:
        header, body = self._cells()
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        rows = "".join("<tr>" + "".join(f"<td style='text-align:{'left' if j == 0 else 'right'}'>{html.escape(c)}</td>"
                                        for j, c in enumerate(r)) + "</tr>" for r in body)
        return (f"<table><caption><b>{html.escape(type(self).__name__)}</b>: the diagonal block of each parameter "
                f"group</caption><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return MISSING if math.isnan(value) else f"{value:.4g}"
    return str(value)
