"""Worst-case sharpness: the largest loss increase in a ball around the weights.

With ``w`` the selected parameters and ``L`` the evaluator's loss over all of its data,

* **L2 sharpness** (Foret et al. 2021, SAM, Sec. 2: the bracketed sharpness term of their
  Theorem 1, the inner maximisation of their Eq. (1) with ``p = 2``)::

      S_2(w) = max_{||e||_2 <= rho} L(w + e) - L(w)

* **adaptive sharpness** (Kwon et al. 2021, ASAM, Sec. 3: ``max_{||T_w^-1 e||_p <= rho}`` with the
  normalisation operator ``T_w = diag(|w|)``; ASAM's algorithm adds ``eta`` to ``|w|``), studied in
  its L2 and L-infinity forms by Andriushchenko et al. (2023) as the worst-case adaptive sharpness
  ``S_max^rho(w, c)`` with ``c = |w|``::

      S_T(w) = max_{||T^-1 e||_p <= rho} L(w + e) - L(w),    T = diag(|w| + eta)

* **L-infinity sharpness**: the same with ``p = infinity`` (a box); ``adaptive=True`` scales
  the box by ``|w| + eta``. Keskar et al.'s (2017) Metric 2.1 is this adaptive box with
  ``eta = 1``, normalised by ``1 + L(w)`` and in percent
  (:attr:`~landscape.results.sharpness.SharpnessResult.relative`).

``L`` is the loss over all of the evaluator's data; Andriushchenko et al.'s m-sharpness averages
the maximum over batches of ``m`` samples instead (one evaluator per batch).

Method: in the scaled coordinates ``u = T^-1 e`` the ball is ``||u||_p <= rho`` and the
gradient is ``T grad L(w + T u)``. Each restart starts at a point drawn uniformly in the ball
(seeded) and takes ``steps`` projected ascent steps from the best iterate so far,
``u <- P(u + a d)``, with ``P`` the Euclidean projection onto the ball (radial scaling for L2,
clipping for the box) and ``d`` the steepest feasible ascent direction: ``sign(g)`` for the box;
for L2 the gradient projected onto the ball's tangent cone at ``u`` (on the sphere its outward
radial part is dropped, so a step moves along the sphere instead of being cancelled by the
projection), of unit length. Step-length rule: ``a`` starts at ``step_size * rho``, doubles (up
to ``2 rho``, the diameter) after a step that increases the loss and halves after one that does
not, the next step then leaving from the best iterate again (monotone ascent, with a step
reduction on failure as in APGD, Croce & Hein 2020, which Andriushchenko et al. use). Each step
is one forward-backward pass over the data. The value is the largest increase over all iterates
and restarts: a lower bound on the true maximum (the problem is nonconvex: a restart converges
to a local maximum, and the restarts look for others).

For the L2 kinds, the top eigenvalue ``lambda_max`` of ``T H T`` (Lanczos with exact
Hessian-vector products, :mod:`.lanczos`) gives ``rho^2 lambda_max / 2``, the sharpness of the
second-order Taylor model at a critical point; it is only a second-order approximation (off a
critical point the first-order term ``rho ||T g||_2`` dominates for small ``rho``).

BatchNorm: the point gets the running statistics the evaluator's mode gives it (``recompute``
re-estimates them once, at ``w``); they stay fixed inside the ball, the model runs in eval mode
and no buffer of the evaluator or of the user's module is updated (:mod:`.operators`).
"""
from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, Callable

import numpy as np
import torch
from torch.func import grad_and_value

from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError, LandscapeError, WeightOverflowError
from ..results.sharpness import SharpnessResult
from ..space.params import ModelLike
from .budget import MAX_ITERATIONS, MAX_RUNS, check_count
from .functions import Params, computed_at_point
from .hessian import HessianOperator
from .linear import scipy_view
from .registry import EIGEN_SOLVERS

#: Names accepted by ``kind``: ``"adaptive"`` is adaptive L2, as in ASAM.
KINDS = ("l2", "linf", "adaptive")
ALGORITHM_VERSION = "sharpness-1"
Objective = Callable[[torch.Tensor], tuple[float, torch.Tensor]]


def sharpness(model: ModelLike | torch.Tensor, evaluator: PointEvaluator, *, rho: float, kind: str = "l2",
              adaptive: bool | None = None, eta: float = 0.0, steps: int = 20, restarts: int = 3,
              step_size: float = 1.0, seed: int = 0, params: Params = None, include_frozen: bool = False,
              bound: bool = True, bound_max_iter: int = 100, bound_tol: float = 1e-3, hvp: str = "auto",
              return_perturbation: bool = False) -> SharpnessResult:
    """Worst-case sharpness ``max_{||T^-1 e||_p <= rho} L(w + e) - L(w)`` by projected gradient ascent.

    See the module docstring for the definitions (Keskar et al. 2017; Foret et al. 2021; Kwon et
    al. 2021; Andriushchenko et al. 2023) and the ascent's step-size rule.

    Parameters
    ----------
    model
        The centre ``w``: a model-like or a flat vector of the evaluator's space.
    evaluator
        The :class:`~landscape.Evaluator`: its data, loss and BatchNorm mode define ``L``.
    rho
        Radius of the ball (in the scaled coordinates for adaptive sharpness: a fraction of
        ``|w|``), positive.
    kind
        ``"l2"``, ``"linf"``, or ``"adaptive"`` (adaptive L2, ASAM's definition).
    adaptive
        Scale the ball elementwise by ``|w| + eta`` (default: True for ``"adaptive"``, else False).
    eta
        Offset of the adaptive scaling (ASAM uses 0.01; 0 is the definition ``T = diag(|w|)``,
        under which a zero weight is never perturbed); unused unless adaptive.
    steps
        Ascent steps per restart, each a forward-backward pass over the evaluator's data.
    restarts
        Random starts; the value is the best over them.
    step_size
        First step length in units of ``rho``; doubled after a step that increases the loss (up
        to ``2 rho``), halved after one that does not.
    seed
        Seed of the random starts (and of the Lanczos start vector).
    params
        ``fnmatch`` patterns of the parameters to perturb (default: every trainable one); the
        others stay at ``w``.
    include_frozen
        Also perturb parameters with ``requires_grad=False``.
    bound
        For the L2 kinds, compute ``lambda_max`` of ``T H T`` and the second-order estimate
        ``rho^2 lambda_max / 2`` (ignored for L-infinity).
    bound_max_iter, bound_tol
        Budget of Hessian-vector products and relative residual tolerance of that eigenvalue.
    hvp
        How Hessian-vector products are computed (the Hessian kind's option, :data:`.hessian.HVP_MODES`).
    return_perturbation
        Also return the worst perturbation ``e*`` (over the selected parameters).

    Returns
    -------
    SharpnessResult
        ``value``, ``trajectory`` (per restart), the perturbation's norms, ``lambda_max`` and
        ``second_order``. A warning is issued when the eigenvalue did not converge.

    Raises
    ------
    ConfigError
        A non-positive or non-finite ``rho``, an unknown ``kind``, ``kind="adaptive"`` with
        ``adaptive=False``, a negative ``eta``, a non-positive ``step_size`` or ``bound_tol``, ``steps``,
        ``restarts`` or ``bound_max_iter`` out of range, or a ``params`` pattern selecting nothing;
        a ``rho`` too large for the evaluator's dtype: the ball's arithmetic overflows (an L2 ``rho``
        above ``sqrt(finfo.max) / 3``, 6.1e18 in float32), or the loss is NaN or infinite at a point
        of the ball (an overflow is never reported as a sharpness of 0).
    WeightOverflowError
        The loss at ``w`` itself is NaN or infinite.

    Examples
    --------
    Linear regression with the mean squared error is a quadratic, ``L(w) = (4 (w1 - 0.5)^2 +
    (w2 - 1)^2) / 2``, with Hessian ``diag(4, 1)``: at its minimum the L2 sharpness is
    ``rho^2 lambda_max / 2 = 0.02`` for ``rho = 0.1``.

    >>> import torch, landscape
    >>> model = torch.nn.Linear(2, 1, bias=False)
    >>> with torch.no_grad():
    ...     _ = model.weight.copy_(torch.tensor([[0.5, 1.0]]))
    >>> data = (torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([[1.0], [1.0]]))
    >>> ev = landscape.Evaluator(model, data, loss="mse", dtype=torch.float64, progress=False)
    >>> res = landscape.sharpness(model, ev, rho=0.1, kind="l2")
    >>> round(res.value, 6), round(res.second_order, 6), round(res.perturbation_norm, 6)
    (0.02, 0.02, 0.1)
    >>> round(landscape.sharpness(model, ev, rho=0.1, kind="linf").value, 6)  # corner (0.1, 0.1)
    0.025
    """
    norm, adaptive = _geometry(kind, adaptive)
    _check_options(rho, eta, step_size, bound_tol, steps, restarts)
    check_count(bound_max_iter, "bound_max_iter", MAX_ITERATIONS)
    options = dict(norm=norm, adaptive=adaptive, rho=float(rho), eta=float(eta) if adaptive else 0.0,
                   steps=int(steps), restarts=int(restarts), step_size=float(step_size), seed=int(seed),
                   params=params, include_frozen=include_frozen, bound=bool(bound and norm == "l2"),
                   bound_max_iter=int(bound_max_iter), bound_tol=float(bound_tol), hvp=hvp,
                   perturbation=return_perturbation, algorithm=ALGORITHM_VERSION)

    def compute(op: HessianOperator) -> SharpnessResult:
        return _measure(op, options)

    result = computed_at_point("sharpness", model, evaluator, options, compute, kind_options={"hvp": hvp})
    if options["bound"] and not result.lambda_converged:
        warnings.warn(f"sharpness: lambda_max did not reach tol={bound_tol} within bound_max_iter={bound_max_iter} "
                      f"products (residual {result.lambda_residual:.3g}); raise bound_max_iter or bound_tol",
                      stacklevel=2)
    return result


# ---------------------------------------------------------------------- options
def _geometry(kind: str, adaptive: bool | None) -> tuple[str, bool]:
    """``(norm, adaptive)`` of a ``kind`` and an explicit ``adaptive``."""
    if kind not in KINDS:
        raise ConfigError(f"unknown sharpness kind {kind!r}; use one of {', '.join(KINDS)}")
    if kind == "adaptive":
        if adaptive is False:
            raise ConfigError("kind='adaptive' is adaptive L2 sharpness; drop adaptive=False or use kind='l2'")
        return "l2", True
    return kind, bool(adaptive)


def _check_options(rho: float, eta: float, step_size: float, bound_tol: float, steps: int, restarts: int) -> None:
    for name, value, positive in (("rho", rho, True), ("step_size", step_size, True), ("bound_tol", bound_tol, True),
                                  ("eta", eta, False)):
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value) \
                or value < 0 or (positive and value == 0):
            need = "a positive" if positive else "a non-negative"
            raise ConfigError(f"sharpness needs {need} finite {name}, got {value!r}")
    for name, value, limit in (("steps", steps, MAX_ITERATIONS), ("restarts", restarts, MAX_RUNS)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or not 1 <= value <= limit:
            raise ConfigError(f"{name} must be an integer in [1, {limit:,}], got {value!r}")


# ---------------------------------------------------------------------- the ball
class _Ball:
    """The ball ``||u||_p <= rho``, ``p = 2`` or ``p = inf``: uniform samples, ascent directions, projection."""

    def __init__(self, norm: str, rho: float):
        self.l2 = norm == "l2"
        self.rho = rho

    def sample(self, dim: int, generator: torch.Generator) -> torch.Tensor:
        """Uniform in the ball (float64, CPU): a Gaussian direction at radius ``rho U^(1/dim)``, or a box draw."""
        if self.l2:
            direction = torch.randn(dim, generator=generator, dtype=torch.float64)
            radius = self.rho * float(torch.rand((), generator=generator, dtype=torch.float64)) ** (1.0 / dim)
            return direction * (radius / float(torch.linalg.vector_norm(direction)))
        return self.rho * (2.0 * torch.rand(dim, generator=generator, dtype=torch.float64) - 1.0)

    def direction(self, u: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Steepest feasible ascent direction at ``u``.

        ``sign(g)`` in the box (clipping removes what leaves it); in the L2 ball ``g`` projected onto
        the tangent cone at ``u`` (its outward radial part removed on the sphere), of unit length.
        """
        if not self.l2:
            return torch.sign(g)
        radial = float(torch.dot(g, u))
        if radial > 0 and float(torch.linalg.vector_norm(u)) >= self.rho * (1 - 64 * torch.finfo(u.dtype).eps):
            g = g - (radial / float(torch.dot(u, u))) * u
        norm = torch.linalg.vector_norm(g)
        return g / norm if norm > 0 else torch.zeros_like(g)

    def project(self, u: torch.Tensor) -> torch.Tensor:
        """The nearest point of the ball (Euclidean projection: radial scaling, or clipping)."""
        if not self.l2:
            return u.clamp(-self.rho, self.rho)
        norm = float(torch.linalg.vector_norm(u))
        return u * (self.rho / norm) if norm > self.rho else u

    def norm(self, u: torch.Tensor) -> float:
        """``||u||_p``."""
        return float(torch.linalg.vector_norm(u, 2 if self.l2 else math.inf))

    def dual_norm(self, g: torch.Tensor) -> float:
        """``||g||_q`` with ``1/p + 1/q = 1``: the largest ``<g, u>`` over the unit ball."""
        return float(torch.linalg.vector_norm(g, 2 if self.l2 else 1))


class _Scaled:
    """``T H T`` as a symmetric operator (``T`` diagonal)."""

    def __init__(self, op: HessianOperator, scale: torch.Tensor):
        self.op, self.scale = op, scale
        self.size, self.dtype, self.device = op.size, op.dtype, op.device
        self.matvecs = 0

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        self.matvecs += 1
        return self.scale * self.op.matvec(self.scale * v.to(self.device, self.dtype))

    def to_scipy(self) -> Any:
        return scipy_view(self)


# ---------------------------------------------------------------------- the ascent
def _measure(op: HessianOperator, options: dict[str, Any]) -> SharpnessResult:
    """Restarts of projected gradient ascent from the operator's point, and the eigenvalue."""
    rho, steps = options["rho"], options["steps"]
    _check_representable(options["norm"], rho, op.dtype)
    ball = _Ball(options["norm"], rho)
    scale = (op.theta.abs() + options["eta"]) if options["adaptive"] else torch.ones_like(op.theta)
    objective, passes = _objective(op, scale, rho)
    base, g0 = objective(torch.zeros_like(op.theta))
    generator = torch.Generator().manual_seed(options["seed"])
    trajectory = np.empty((options["restarts"], steps + 1))
    lengths = np.empty((options["restarts"], steps))
    best_value, best_u = 0.0, torch.zeros_like(op.theta)  # e = 0 is feasible
    for r in range(options["restarts"]):
        start = ball.sample(op.dim, generator).to(op.device, op.dtype)
        u, value = _ascend(objective, ball, start, steps, options["step_size"] * rho, trajectory[r], lengths[r])
        if value - base > best_value:
            best_value, best_u = value - base, u
    trajectory -= base
    lam = _top_eigenvalue(op, scale if options["adaptive"] else None, options) if options["bound"] else None
    perturbation = (scale * best_u).detach()
    return SharpnessResult(
        value=float(best_value), base_loss=float(base), norm=options["norm"], adaptive=options["adaptive"],
        rho=rho, eta=options["eta"], trajectory=trajectory, step_lengths=lengths,
        perturbation_norm=ball.norm(best_u), perturbation_l2=float(torch.linalg.vector_norm(perturbation)),
        gradient_norm=ball.dual_norm(g0), passes=passes[0],
        lambda_max=float(lam.values[0]) if lam is not None else float("nan"),
        lambda_residual=float(lam.residuals[0]) if lam is not None else float("nan"),
        lambda_converged=lam is not None and bool(lam.converged), matvecs=op.matvecs, dim=op.dim,
        perturbation=perturbation.double().cpu().numpy() if options["perturbation"] else None)


def _check_representable(norm: str, rho: float, dtype: torch.dtype) -> None:
    """Refuse a ball whose arithmetic overflows ``dtype``.

    A step leaves from a point of the ball with a length of at most ``2 rho``, so a candidate lies
    within ``3 rho`` of the centre; its L2 norm sums squares up to ``(3 rho)^2``, which must stay
    finite, or the projection would scale the candidate to zero.
    """
    largest = torch.finfo(dtype).max
    limit = math.sqrt(largest) / 3 if norm == "l2" else largest / 3
    if rho > limit:
        name, wider = _float_words(dtype)
        raise ConfigError(f"sharpness: rho={rho:g} is too large for {name}: the {norm} ball's arithmetic "
                          f"overflows above rho={limit:.3g}; use a smaller rho{wider}")


def _non_finite(total: float, u: torch.Tensor, rho: float, dtype: torch.dtype) -> LandscapeError:
    """The error for a loss that is NaN or infinite at ``w + T u``: an overflow is never a silent 0."""
    name, wider = _float_words(dtype)
    if not bool(u.any()):
        return WeightOverflowError(f"sharpness: the loss at the model's own weights is {total} in {name}, before "
                                   "any perturbation; sharpness needs a finite loss there: check the model's "
                                   f"weights and the evaluator's data{wider}")
    return ConfigError(f"sharpness: the loss at a point of the ball of rho={rho:g} is {total} in {name}: rho is "
                       f"too large for the model's {name} arithmetic (the loss overflows); use a smaller rho{wider}")


def _float_words(dtype: torch.dtype) -> tuple[str, str]:
    """The dtype's name and the advice to evaluate in float64 (empty when the evaluator does already)."""
    wider = ", or an Evaluator with dtype=torch.float64" if dtype != torch.float64 else ""
    return str(dtype).removeprefix("torch."), wider


def _objective(op: HessianOperator, scale: torch.Tensor, rho: float) -> tuple[Objective, list[int]]:
    """``u -> (L(w + T u), T grad L(w + T u))`` over all batches (one pass each), and a pass counter.

    A NaN or infinite loss is refused (:func:`_non_finite`).
    """
    passes = [0]
    step = grad_and_value(op.batch_loss)

    def objective(u: torch.Tensor) -> tuple[float, torch.Tensor]:
        theta = op.theta + scale * u
        total, grad = 0.0, torch.zeros_like(theta)
        for x, y in op.evaluator.batches:
            g, value = step(theta, x, y)
            grad += g.detach()
            total += float(value.detach().double())
        passes[0] += 1
        if not math.isfinite(total):
            raise _non_finite(total, u, rho, op.dtype)
        return total, scale * grad

    return objective, passes


def _ascend(objective: Objective, ball: _Ball, u: torch.Tensor, steps: int, length: float,
            trajectory: np.ndarray, lengths: np.ndarray) -> tuple[torch.Tensor, float]:
    """One restart: monotone projected ascent with step halving.

    Fills ``trajectory`` (losses at the start and after each step) and ``lengths``; returns the best
    iterate and its loss.
    """
    best_value, best_grad = objective(u)
    trajectory[0] = best_value
    for t in range(steps):
        candidate = ball.project(u + length * ball.direction(u, best_grad))
        lengths[t] = length
        if torch.equal(candidate, u):  # stationary for this step length: nothing to evaluate
            value, grad = best_value, best_grad
        else:
            value, grad = objective(candidate)
        trajectory[t + 1] = value
        if value > best_value:
            u, best_value, best_grad = candidate, value, grad
            length = min(2 * length, 2 * ball.rho)
        else:
            length /= 2
    return u, best_value


def _top_eigenvalue(op: HessianOperator, scale: torch.Tensor | None, options: dict[str, Any]) -> Any:
    """The largest eigenvalue of ``T H T`` (of ``H`` when ``scale`` is None) by Lanczos."""
    solver = EIGEN_SOLVERS.get("lanczos")
    target = op if scale is None else _Scaled(op, scale)
    return solver(target, 1, tol=options["bound_tol"], max_iter=options["bound_max_iter"],
                  generator=torch.Generator().manual_seed(options["seed"]), return_vectors=False)
