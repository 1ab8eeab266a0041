"""Barrier formulas (FedGuCci, Definition 2.1 Eq. 3/4 and Definition 3.6 Eq. 9/10).

Pure numpy on metric arrays; the functions that evaluate models live in
:mod:`landscape.geometry.paths` and :mod:`landscape.geometry.groups`. Definitions and sign
conventions: ``docs/barriers.md``. Points whose loss is not finite are
kept as such: a barrier over a curve with an infinite or NaN interior point is ``inf``/
``nan``, and the result objects report how many points overflowed.
"""
from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np

from ..infra.errors import NonFiniteLossWarning

#: Barrier that counts as a wall by default: a relative accuracy drop of 5% (Eq. 4/10), or 0.05
#: nats of loss (Eq. 3/9). The claim checks and the barrier-matrix figures share it.
DEFAULT_THRESHOLD = 0.05
#: The metrics a barrier is measured in.
METRICS = ("accuracy", "loss")


def warn_nonfinite(what: str, loss: np.ndarray, labels: Sequence[str]) -> None:
    """Warn when some points have a non-finite loss (the loss barrier is then NaN or inf, kept as such).

    Parameters
    ----------
    what
        The analysis (``"path a -> b"``, ``"group barrier"``), for the message.
    loss
        The loss of each point.
    labels
        One name per point (``"alpha=0.5"``, ``"the fused model"``), for the message.

    Warns
    -----
    NonFiniteLossWarning
        Naming how many points are not finite and which ones (the first eight).
    """
    bad = [label for label, value in zip(labels, np.asarray(loss, dtype=np.float64)) if not np.isfinite(value)]
    if bad:
        shown = ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        warnings.warn(f"{what}: {len(bad)} of {len(labels)} points have a non-finite loss ({shown}), so its loss "
                      "barrier is not finite (kept as NaN/inf, never computed from the finite points alone)",
                      NonFiniteLossWarning, stacklevel=3)


def _unit_part(alphas: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    alphas = np.asarray(alphas, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    at0 = np.flatnonzero(np.isclose(alphas, 0.0, atol=1e-9))
    at1 = np.flatnonzero(np.isclose(alphas, 1.0, atol=1e-9))
    if at0.size == 0 or at1.size == 0:
        raise ValueError("barriers need alpha = 0 and alpha = 1 on the grid")
    inside = (alphas >= -1e-9) & (alphas <= 1 + 1e-9)
    return alphas[inside], values[inside], float(values[at0[0]]), float(values[at1[0]])


def loss_barrier_curve(alphas: np.ndarray, loss: np.ndarray) -> np.ndarray:
    """L(alpha) - [(1 - alpha) L(0) + alpha L(1)] for alpha in [0, 1] (FedGuCci Eq. 3 before the sup).

    Parameters
    ----------
    alphas
        Interpolation coefficients of the path; must contain 0 and 1 (points outside [0, 1]
        are dropped).
    loss
        Loss at each alpha, same length as ``alphas``.

    Returns
    -------
    numpy.ndarray
        The barrier term at each alpha in [0, 1] (float64); NaN where an overflowed point
        gives ``inf - inf``.

    Raises
    ------
    ValueError
        If alpha = 0 or alpha = 1 is not on the grid.

    Examples
    --------
    A path from loss 1 to loss 0 that rises to 1.5 at its midpoint, where the line between the
    ends is at 0.5: the barrier term there is 1, the loss barrier (its sup) is 1.

    >>> import numpy as np
    >>> alphas = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
    >>> curve = loss_barrier_curve(alphas, np.array([1.0, 1.25, 1.5, 0.5, 0.0]))
    >>> curve
    array([0.  , 0.5 , 1.  , 0.25, 0.  ])
    >>> barrier_from_curve(curve)
    1.0
    """
    a, values, l0, l1 = _unit_part(alphas, loss)
    with np.errstate(invalid="ignore"):  # inf - inf at overflowed points is NaN, by design
        return values - ((1 - a) * l0 + a * l1)


def accuracy_barrier_curve(alphas: np.ndarray, accuracy: np.ndarray) -> np.ndarray:
    """1 - A(alpha) / [(1 - alpha) A(0) + alpha A(1)] for alpha in [0, 1] (FedGuCci Eq. 4 before the sup).

    Where the line is 0 (both endpoints at zero accuracy) the term is 0: there is no
    accuracy to lose.

    Parameters
    ----------
    alphas
        Interpolation coefficients of the path; must contain 0 and 1 (points outside [0, 1]
        are dropped).
    accuracy
        Accuracy (in [0, 1]) at each alpha, same length as ``alphas``.

    Returns
    -------
    numpy.ndarray
        The relative accuracy drop below the endpoints' line at each alpha in [0, 1].

    Raises
    ------
    ValueError
        If alpha = 0 or alpha = 1 is not on the grid.

    Examples
    --------
    Both ends at 80% accuracy, the midpoint at 30%: it lost 0.5 of the 0.8 the line promises,
    a relative drop of 0.625.

    >>> import numpy as np
    >>> accuracy_barrier_curve(np.array([0.0, 0.5, 1.0]), np.array([0.8, 0.3, 0.8]))
    array([0.   , 0.625, 0.   ])
    """
    a, values, a0, a1 = _unit_part(alphas, accuracy)
    line = (1 - a) * a0 + a * a1
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # tiny lines: -inf, below any max
        return np.where(line > 0, 1.0 - values / np.where(line > 0, line, 1.0), 0.0)


def barrier_from_curve(curve: np.ndarray) -> float:
    """The sup of a barrier curve on the grid (the sup of FedGuCci Eq. 3/4); NaN if any point is NaN.

    Parameters
    ----------
    curve
        Output of :func:`loss_barrier_curve` or :func:`accuracy_barrier_curve`.

    Returns
    -------
    float
        The largest value of the curve (``inf`` if a point overflowed, NaN if any is NaN).
    """
    curve = np.asarray(curve, dtype=np.float64)
    if np.isnan(curve).any():
        return float("nan")
    return float(curve.max())


def code_accuracy_barrier(alphas: np.ndarray, accuracy: np.ndarray) -> float:
    """FedGuCci code's variant of Eq. 4: d = line - A; return d(a*) / line(a*) with a* = argmax d.

    The released FedGuCci code takes the alpha of the largest *absolute* accuracy drop and
    divides there, instead of taking the sup of the relative drop (``docs/barriers.md``,
    "Variants").

    Parameters
    ----------
    alphas
        Interpolation coefficients of the path; must contain 0 and 1.
    accuracy
        Accuracy (in [0, 1]) at each alpha, same length as ``alphas``.

    Returns
    -------
    float
        The relative drop at the alpha of the largest absolute drop; 0 where the line is 0.

    Raises
    ------
    ValueError
        If alpha = 0 or alpha = 1 is not on the grid.
    """
    a, values, a0, a1 = _unit_part(alphas, accuracy)
    line = (1 - a) * a0 + a * a1
    gap = line - values
    i = int(np.argmax(gap))
    return float(gap[i] / line[i]) if line[i] > 0 else 0.0


def normalise_weights(weights: np.ndarray | None, n: int) -> np.ndarray:
    """Uniform weights, or the given non-negative weights divided by their sum.

    These are the mixing weights mu_i of the group barriers (FedGuCci Eq. 9/10).

    Parameters
    ----------
    weights
        One non-negative, finite weight per model (not all zero), or ``None`` for uniform.
    n
        Number of models.

    Returns
    -------
    numpy.ndarray
        ``n`` float64 weights summing to 1.

    Raises
    ------
    ValueError
        If the number of weights is not ``n``, or a weight is negative or not finite, or all
        are zero.
    """
    if weights is None:
        return np.full(n, 1.0 / n)
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.shape != (n,):
        raise ValueError(f"expected {n} weights, got {w.shape[0]}")
    if (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
        raise ValueError("weights must be finite, non-negative and not all zero")
    return w / w.sum()


def group_loss_barrier(fused_loss: float, member_loss: np.ndarray, weights: np.ndarray) -> float:
    """Group loss barrier, FedGuCci Eq. 9: L(sum_i mu_i w_i) - sum_i mu_i L(w_i).

    Parameters
    ----------
    fused_loss
        Loss of the weighted average of the models, L(sum_i mu_i w_i).
    member_loss
        Loss of each model, L(w_i).
    weights
        Normalised weights mu_i (see :func:`normalise_weights`).

    Returns
    -------
    float
        The fused loss minus the weighted mean of the members' losses.

    Examples
    --------
    Two members with losses 1 and 0.5 whose average model has loss 2: with uniform weights the
    members' mean is 0.75, so the group barrier is 1.25 (weights 3:1 give 2 - 0.875 = 1.125).

    >>> import numpy as np
    >>> group_loss_barrier(2.0, np.array([1.0, 0.5]), normalise_weights(None, 2))
    1.25
    >>> group_loss_barrier(2.0, np.array([1.0, 0.5]), normalise_weights(np.array([3.0, 1.0]), 2))
    1.125
    """
    return float(fused_loss - np.dot(weights, member_loss))


def group_accuracy_barrier(fused_accuracy: float, member_accuracy: np.ndarray, weights: np.ndarray) -> float:
    """Group accuracy barrier, FedGuCci Eq. 10: 1 - A(sum_i mu_i w_i) / sum_i mu_i A(w_i).

    Parameters
    ----------
    fused_accuracy
        Accuracy of the weighted average of the models, A(sum_i mu_i w_i).
    member_accuracy
        Accuracy of each model, A(w_i).
    weights
        Normalised weights mu_i (see :func:`normalise_weights`).

    Returns
    -------
    float
        The relative accuracy drop of the fused model; 0 when the members' mean accuracy is 0.
    """
    mean = float(np.dot(weights, member_accuracy))
    return float(1.0 - fused_accuracy / mean) if mean > 0 else 0.0
