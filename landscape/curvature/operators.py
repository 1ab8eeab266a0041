"""Curvature operators of an evaluator's loss: the base class every kind shares.

The loss is ``L(theta) = (1/N) sum_n l(f(x_n; theta), y_n)`` over *all* of the evaluator's data
(sums of per-sample losses divided by the sample count, so a short last batch gets its proper
weight). ``theta`` is the vector of the selected trainable parameters; everything else (other
parameters, BatchNorm running statistics) is held fixed and the model runs in eval mode.

:class:`CurvatureOperator` owns what every kind shares: the parameter selection (``params``
patterns, ``include_frozen``), the loop over the evaluator's batches (a product is the sum of
each batch's share), the SciPy view, :meth:`~CurvatureOperator.dense` and the determinism
probe. A kind is one file: a subclass giving one batch's share of ``C v``
(:meth:`~CurvatureOperator.batch_product`), registered by name (:func:`~.registry.operator_kind`),
declaring its options in its ``Options`` class (the ``kind_options=`` of the public functions,
checked by :func:`~.registry.kind_options`); solvers see only the
:class:`~.linear.SymmetricOperator` interface. The kinds: ``"hessian"`` in :mod:`.hessian`,
``"ggn"`` and ``"fisher"`` in :mod:`.gauss_newton`, ``"empirical_fisher"`` in :mod:`.empirical_fisher`,
``"kfac"`` and ``"ekfac"`` in :mod:`.kfac` (which overrides the product itself: its factors are
computed once, from all the batches).

No graph survives a product and nothing is stored on the module, so memory stays flat over many
products (unlike ``loss.backward(create_graph=True)``, see PyHessian issues #25/#28). Gradients
and products run in :func:`.second_order.second_order`: attention with the twice-differentiable
math kernel, and a clear error for an operation without a second derivative.

Examples
--------
Least squares ``L(w) = (1/N) sum_n (w . x_n - y_n)^2`` has the Hessian ``2 X^T X / N``; the
operator's products and the SciPy view that solvers (or ``scipy.sparse.linalg``) use agree with it.

>>> import numpy as np, scipy.sparse.linalg, torch, landscape
>>> _ = torch.manual_seed(0)
>>> x, y = torch.randn(20, 3, dtype=torch.float64), torch.randn(20, 1, dtype=torch.float64)
>>> model = torch.nn.Linear(3, 1, bias=False).double()
>>> ev = landscape.Evaluator(model, (x, y), loss="mse", dtype=torch.float64, progress=False)
>>> op = landscape.curvature_operator(model, ev)
>>> exact = 2 * x.T @ x / 20
>>> v = torch.randn(3, dtype=torch.float64)
>>> torch.allclose(op.matvec(v), exact @ v), torch.allclose(op.dense(), exact)
(True, True)
>>> top = scipy.sparse.linalg.eigsh(op.to_scipy(), k=1, which="LA")[0]
>>> bool(np.isclose(top[0], np.linalg.eigvalsh(exact.numpy())[-1]))
True
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Sequence

import torch
from torch.func import grad, jvp

from ..evaluation.inputs import leading
from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError
from ..infra.options import Options
from ..space.params import ModelLike
from .linear import MatrixOperator, SymmetricOperator, scipy_view
from .second_order import second_order

__all__ = ["CurvatureOperator", "MatrixOperator", "NoOptions", "SymmetricOperator", "jvp_quietly", "scipy_view"]


@dataclass(frozen=True)
class NoOptions(Options):
    """The option set of a curvature kind without options of its own (the GGN's)."""


class CurvatureOperator:
    """A curvature matrix ``C`` of an evaluator's mean loss at one point, as a symmetric linear operator.

    ``C v`` is the sum over the evaluator's batches of :meth:`batch_product`, computed in the
    evaluator's dtype and on its device; ``to_scipy()`` views it as a float64
    ``scipy.sparse.linalg.LinearOperator``. Subclasses set :attr:`kind` and :attr:`mode` and
    implement :meth:`batch_product`.

    Parameters
    ----------
    evaluator
        The evaluator whose loss (over all of its data) gives the curvature.
    point
        A model-like or a flat vector of the evaluator's space (its buffers used as they are).
    params
        ``fnmatch`` name patterns of the parameters to differentiate (``None``: every
        trainable parameter).
    include_frozen
        Also differentiate parameters with ``requires_grad=False``.
    check_determinism
        Refuse a model whose outputs differ between two identical calls (dropout in eval mode).
    seed
        Seed of any random choice the kind makes (the Monte-Carlo Fisher's labels); kept as ``seed``.

    Attributes
    ----------
    kind : str
        The registered name of the operator's kind (``"hessian"``, ``"ggn"``, ...).
    Options : type[Options]
        The kind's options (``kind_options=``), passed to the constructor as keywords; default none.
    unshardable : str
        Empty when products split exactly over the ranks of a process group
        (:mod:`.distributed`); else why not (the one-line refusal).
    forward_mode_fix : str
        What avoids forward-mode AD, for the error about an operation without it.
    mode : str
        How its products are computed (for the Hessian one of :data:`.hessian.HVP_MODES`).
    size, dim : int
        The number of differentiated parameters (equal).
    names : list of str
        Their tensors' names, in the order of ``theta``.
    theta : torch.Tensor
        Their values at the point (flat, on the evaluator's device).
    matvecs : int
        Products computed so far.

    Raises
    ------
    ConfigError
        A flat vector of the wrong length, no parameter selected, or a model whose outputs are not
        deterministic in eval mode.
    """

    kind: ClassVar[str] = ""
    Options: ClassVar[type[Options]] = NoOptions
    unshardable: ClassVar[str] = ""
    forward_mode_fix: ClassVar[str] = "kind='hessian' with hvp='reverse-over-reverse' avoids forward-mode AD"
    mode: str = ""

    def __init__(self, evaluator: PointEvaluator, point: ModelLike | torch.Tensor, *,
                 params: Sequence[str] | str | None = None, include_frozen: bool = False,
                 check_determinism: bool = True, seed: int = 0):
        self.evaluator = evaluator
        self.seed = int(seed)
        space = evaluator.space
        vec = point if isinstance(point, torch.Tensor) else evaluator.vector(point)
        if vec.shape != (space.size,):
            raise ConfigError(f"a flat vector must have shape ({space.size},), got {tuple(vec.shape)}")
        vec = vec.detach().to(evaluator.device, evaluator.dtype)
        mask = space.select(params, include_frozen=include_frozen)
        selected = [e for e in space.entries if bool(mask[e.offset])]
        self.names = [e.name for e in selected]
        self.shapes = [e.shape for e in selected]
        self.numels = [e.numel for e in selected]
        tensors = space.unflatten(vec)
        chosen = set(self.names)
        self._fixed = {name: t for name, t in tensors.items() if name not in chosen}
        self.theta = torch.cat([tensors[n].reshape(-1) for n in self.names])
        self.dim = int(self.theta.numel())
        self.size = self.dim
        self.device = evaluator.device
        self.dtype = evaluator.dtype
        self.matvecs = 0
        if check_determinism:
            self._check_determinism()

    @classmethod
    def whole_data_options(cls, evaluator: PointEvaluator, options: Mapping[str, Any]) -> dict[str, Any]:
        """The kind's options with the choices made from the data (``"auto"``) made on all of ``evaluator``'s.

        The ranks of a distributed operator (:mod:`.distributed`) each hold a block of the batches
        and must choose as one process does; by default there is nothing to choose.

        Parameters
        ----------
        evaluator : PointEvaluator
            The evaluator of the whole data.
        options : Mapping[str, Any]
            The kind's validated options.

        Returns
        -------
        dict[str, Any]
            The options, as the constructor takes them.
        """
        return dict(options)

    # ------------------------------------------------------------------ the loss
    def params_dict(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        """State-dict-named tensors with the selected parameters taken from ``theta``.

        Parameters
        ----------
        theta : torch.Tensor
            A flat vector of length ``dim`` (differentiable through).

        Returns
        -------
        dict[str, torch.Tensor]
            Every tensor of the model: the selected parameters reshaped from ``theta``, the
            others as fixed at the point.
        """
        parts = torch.split(theta, self.numels)
        out = dict(self._fixed)
        out.update({n: p.reshape(s) for n, p, s in zip(self.names, parts, self.shapes)})
        return out

    def outputs(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The model's outputs ``f(x; theta)`` for one batch (eval mode, buffers fixed).

        Parameters
        ----------
        theta : torch.Tensor
            The selected parameters (flat, differentiable through).
        x : torch.Tensor
            A batch of inputs.

        Returns
        -------
        torch.Tensor
            The outputs the evaluator's loss takes.
        """
        return self.evaluator.forward(self.params_dict(theta), x)

    def batch_loss(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The batch's share of the loss: ``sum_{i in batch} l_i / N`` (``N`` the evaluator's ``num_targets``).

        Parameters
        ----------
        theta : torch.Tensor
            The selected parameters (flat).
        x, y : torch.Tensor
            One batch of inputs and targets.

        Returns
        -------
        torch.Tensor
            A scalar; its sum over the evaluator's batches is ``L(theta)``.
        """
        ev = self.evaluator
        return ev.loss.per_sample(self.outputs(theta, x), y).sum() / ev.num_targets

    def loss(self) -> float:
        """``L(theta)`` at the operator's point.

        Returns
        -------
        float
            The mean loss over all of the evaluator's data.
        """
        with torch.no_grad():
            return float(sum(self.batch_loss(self.theta, x, y).double() for x, y in self.evaluator.batches))

    def gradient(self) -> torch.Tensor:
        """``grad L(theta)`` (flat, on the device).

        Returns
        -------
        torch.Tensor
            Length ``dim``.
        """
        g = torch.zeros_like(self.theta)
        with second_order(self.mode, self.kind, self.forward_mode_fix):
            for x, y in self.evaluator.batches:
                g += grad(self.batch_loss)(self.theta, x, y)
        return g

    # ---------------------------------------------------------- linear operator
    def batch_product(self, index: int, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One batch's share of ``C v`` (the sum over batches is the product); set by each kind.

        Parameters
        ----------
        index : int
            The batch's position in the evaluator's batches.
        x, y : torch.Tensor
            The batch's inputs and targets.
        v : torch.Tensor
            The vector (length ``dim``, on the device, in the evaluator's dtype).

        Returns
        -------
        torch.Tensor
            Length ``dim``.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define batch_product")

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        """``C v`` for a flat vector ``v`` of length ``dim`` (one product, counted in ``matvecs``).

        Parameters
        ----------
        v : torch.Tensor
            Length ``dim`` (moved to the operator's device and dtype).

        Returns
        -------
        torch.Tensor
            ``C v`` summed over the evaluator's batches.

        Raises
        ------
        ConfigError
            ``v`` does not have length ``dim``.
        CurvatureError
            An operation of the model or loss lacks a derivative the product needs (attention runs
            with the twice-differentiable math kernel, see :mod:`.second_order`).
        """
        if v.shape != (self.dim,):
            raise ConfigError(f"the {self.kind} product needs a vector of length {self.dim}, "
                              f"got shape {tuple(v.shape)}")
        v = v.to(self.device, self.dtype)
        out = torch.zeros_like(self.theta)
        with second_order(self.mode, self.kind, self.forward_mode_fix):
            for index, (x, y) in enumerate(self.evaluator.batches):
                out += self.batch_product(index, x, y, v).detach()
        self.matvecs += 1
        return out

    __call__ = matvec

    def dense(self, max_dim: int = 5000) -> torch.Tensor:
        """The full matrix (``dim`` products; only for small problems and tests).

        Parameters
        ----------
        max_dim : int
            Largest ``dim`` accepted.

        Returns
        -------
        torch.Tensor
            ``(dim, dim)``, row ``i`` being ``C e_i``.

        Raises
        ------
        ConfigError
            ``dim > max_dim``.
        """
        if self.dim > max_dim:
            raise ConfigError(f"the {self.kind} matrix has {self.dim} rows; dense() is limited to {max_dim}. "
                              "Use the iterative estimators (hessian_eigenvalues, hessian_trace) instead.")
        eye = torch.eye(self.dim, device=self.device, dtype=self.dtype)
        return torch.stack([self.matvec(e) for e in eye])

    def to_scipy(self) -> Any:
        """A ``scipy.sparse.linalg.LinearOperator`` (float64 in and out) of this operator.

        Returns
        -------
        scipy.sparse.linalg.LinearOperator
            See :func:`~.linear.scipy_view`.
        """
        return scipy_view(self)

    # ---------------------------------------------------------------- checks
    def _check_determinism(self) -> None:
        x, _ = self.evaluator.batches[0]
        x = leading(x, 8)
        with torch.no_grad():
            first = self.outputs(self.theta, x)
            second = self.outputs(self.theta, x)
        if not torch.allclose(first, second, rtol=0, atol=0, equal_nan=True):  # NaN outputs are not randomness
            raise ConfigError("the model gives different outputs for the same input and weights (dropout "
                              "or other randomness active in eval mode?), so its curvature is not defined. "
                              "Disable the randomness in the module's forward before computing curvature.")


def jvp_quietly(fn: Callable[[torch.Tensor], Any], primal: torch.Tensor, tangent: torch.Tensor) -> tuple[Any, Any]:
    """``torch.func.jvp(fn, (primal,), (tangent,))`` without torch's first-call warning.

    Torch warns on its first jvp, when it jit-scripts its decompositions.

    Parameters
    ----------
    fn : callable
        The function of one tensor.
    primal, tangent : torch.Tensor
        Where, and in which direction, to differentiate.

    Returns
    -------
    tuple
        ``(fn(primal), J tangent)``.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.script.*", category=FutureWarning)
        return jvp(fn, (primal,), (tangent,))
