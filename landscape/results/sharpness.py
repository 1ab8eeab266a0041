"""Result of a sharpness measurement: the worst-case loss increase in a ball around the weights.

Registered, so it round-trips through the HDF5 cache (arrays as datasets, the rest as JSON
attributes). The definitions and the method are in :mod:`landscape.curvature.sharpness`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import Result, register


@register
@dataclass(frozen=True, eq=False)
class SharpnessResult(Result):
    """Worst-case sharpness ``max_{||T^-1 e||_p <= rho} L(w + e) - L(w)`` found by projected gradient ascent.

    ``T`` is the identity, or ``diag(|w| + eta)`` for adaptive sharpness; ``p`` is 2 or infinity
    (``norm``). Loss values are means over all of the evaluator's data.

    Attributes
    ----------
    value : float
        The sharpness: the largest loss increase found, over every iterate of every restart (the
        centre ``e = 0`` is feasible, so never negative).
    base_loss : float
        ``L(w)``, the loss at the centre.
    norm : str
        ``"l2"`` or ``"linf"``: the norm ``p`` of the ball.
    adaptive : bool
        Whether the ball is scaled elementwise by ``|w| + eta`` (adaptive sharpness).
    rho : float
        The radius, in the scaled coordinates ``u = T^-1 e``.
    eta : float
        The offset of the adaptive scaling (0 when not adaptive).
    trajectory : np.ndarray
        ``(restarts, steps + 1)``: loss increase ``L(w + e_t) - L(w)`` at the random start (column
        0) and after each ascent step, per restart.
    step_lengths : np.ndarray
        ``(restarts, steps)``: the step length (in ``u`` units) of each step.
    perturbation_norm : float
        ``||T^-1 e*||_p`` of the worst perturbation found (at most ``rho``).
    perturbation_l2 : float
        ``||e*||_2``, its Euclidean length in weight space.
    gradient_norm : float
        Dual norm ``||T grad L(w)||_q`` at the centre (``q = 2`` for L2, 1 for L-infinity).
    lambda_max : float
        Top eigenvalue of ``T H T`` at the centre (NaN when not computed: L-infinity, or
        ``bound=False``).
    lambda_residual : float
        Its residual ``||T H T x - lambda x||`` (NaN when not computed).
    lambda_converged : bool
        Whether the eigen-solver met its tolerance (False when not computed).
    passes : int
        Forward-backward passes over the data used by the ascent (the centre included).
    matvecs : int
        Hessian-vector products used by the eigenvalue.
    dim : int
        Number of perturbed parameters.
    perturbation : np.ndarray or None
        ``(dim,)`` worst perturbation ``e*`` in weight space over the selected parameters (in the
        order of the parameter space), when requested.
    """

    summary_fields: ClassVar[tuple[str, ...]] = ("value", "name", "rho", "second_order", "base_loss", "passes")

    value: float
    base_loss: float
    norm: str
    adaptive: bool
    rho: float
    eta: float
    trajectory: np.ndarray
    step_lengths: np.ndarray
    perturbation_norm: float
    perturbation_l2: float
    gradient_norm: float
    lambda_max: float
    lambda_residual: float
    lambda_converged: bool
    passes: int
    matvecs: int
    dim: int
    perturbation: np.ndarray | None = None
    array_fields: ClassVar[tuple[str, ...]] = ("trajectory", "step_lengths", "perturbation")

    @property
    def name(self) -> str:
        """``"l2"``, ``"linf"``, ``"adaptive l2"`` or ``"adaptive linf"``."""
        return f"adaptive {self.norm}" if self.adaptive else self.norm

    @property
    def sharpness(self) -> float:
        """The sharpness, :attr:`value` (the name the API contract gives it)."""
        return self.value

    @property
    def restarts(self) -> int:
        """Number of restarts."""
        return int(np.shape(self.trajectory)[0])

    @property
    def steps(self) -> int:
        """Ascent steps per restart."""
        return int(np.shape(self.trajectory)[1]) - 1

    @property
    def restart_values(self) -> np.ndarray:
        """Largest loss increase found by each restart, ``(restarts,)``."""
        return np.max(self.trajectory, axis=1)

    @property
    def running_max(self) -> np.ndarray:
        """Best loss increase so far along each restart, ``(restarts, steps + 1)``."""
        return np.maximum.accumulate(self.trajectory, axis=1)

    @property
    def first_order(self) -> float:
        """``rho ||T grad L(w)||_q``.

        The maximum of the linearised loss over the ball, attained at SAM's dual-norm step (Foret
        et al. 2021, Eq. (2)).
        """
        return self.rho * self.gradient_norm

    @property
    def second_order(self) -> float:
        """``rho^2 lambda_max / 2``.

        The exact sharpness of the quadratic model at a critical point (NaN when ``lambda_max`` was
        not computed). Only a second-order approximation of the loss.
        """
        return 0.5 * self.rho ** 2 * self.lambda_max

    @property
    def quadratic_bound(self) -> float:
        """``rho ||T g|| + rho^2 max(lambda_max, 0) / 2``.

        An upper bound on the maximum of the second-order Taylor model over the L2 ball (NaN
        when ``lambda_max`` was not computed).
        """
        if not np.isfinite(self.lambda_max):
            return float("nan")
        return self.first_order + 0.5 * self.rho ** 2 * max(self.lambda_max, 0.0)

    @property
    def relative(self) -> float:
        """``100 value / (1 + L(w))``: the normalisation of Keskar et al. (2017), Metric 2.1."""
        return 100.0 * self.value / (1.0 + self.base_loss)
