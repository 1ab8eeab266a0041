"""Coefficients of curve points as combinations of their knots (Garipov et al. 2018, section 3.2).

A curve through knots ``w_0 = a, w_1, ..., w_{m-2}, w_{m-1} = b`` is ``phi(t) = sum_i c_i(t) w_i``:

* ``"bezier"``: Bernstein polynomials, ``c_i(t) = C(n, i) t^i (1 - t)^(n - i)`` with ``n = m - 1``
  (``m = 3``: the quadratic Bezier curve ``(1-t)^2 a + 2t(1-t) theta + t^2 b``);
* ``"polychain"``: the polygonal chain through the knots at ``t = i / n`` (``m = 3``: Garipov's
  ``2(t theta + (0.5 - t) a)`` on [0, 0.5] and ``2((t - 0.5) b + (1 - t) theta)`` on [0.5, 1]).
"""
from __future__ import annotations

from math import comb

import numpy as np

from ..infra.errors import ConfigError

KINDS = ("bezier", "polychain")


def coefficients(kind: str, t: np.ndarray, m: int) -> np.ndarray:
    """Coefficients of the knots at the curve parameters ``t`` in [0, 1] (Garipov et al. 2018, Sec. 3.2).

    Parameters
    ----------
    kind : str
        ``"bezier"`` (Bernstein polynomials) or ``"polychain"`` (polygonal chain).
    t : numpy.ndarray
        Curve parameters in [0, 1] (flattened; values outside are clipped for a polychain).
    m : int
        Number of knots, endpoints included (at least 2).

    Returns
    -------
    numpy.ndarray
        (len(t), m) float64 coefficients; each row sums to 1.

    Raises
    ------
    ConfigError
        If ``kind`` is unknown or ``m < 2``.
    """
    t = np.asarray(t, dtype=np.float64).reshape(-1)
    if kind not in KINDS:
        raise ConfigError(f"kind must be one of {KINDS}, got {kind!r}")
    if m < 2:
        raise ConfigError("a curve needs at least two knots")
    n = m - 1
    if kind == "bezier":
        return np.stack([comb(n, i) * t ** i * (1 - t) ** (n - i) for i in range(m)], axis=1)
    pos = np.clip(t * n, 0, n)
    seg = np.minimum(np.floor(pos).astype(int), n - 1)
    frac = pos - seg
    out = np.zeros((len(t), m))
    out[np.arange(len(t)), seg] = 1 - frac
    out[np.arange(len(t)), seg + 1] += frac
    return out
