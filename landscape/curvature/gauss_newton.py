r"""Gauss-Newton and Fisher curvature: ``C = (1/N) sum_n J_n^T Lambda_n J_n``.

With ``f_n = f(x_n; theta)`` the model's outputs for sample ``n``, ``J_n = d f_n / d theta`` and
``l_n = l(f_n, y_n)`` the per-sample loss of the evaluator (its mean over all ``N`` samples is
the loss ``L``):

* **GGN** (generalised Gauss-Newton, Schraudolph 2002; Martens 2020), ``kind="ggn"``::

      G = (1/N) sum_n J_n^T H_n J_n,    H_n = d^2 l(f, y_n) / d f^2  at f = f_n

  the Hessian with the second derivatives of the model dropped,
  ``H = G + (1/N) sum_n sum_k (d l_n / d f_nk) d^2 f_nk / d theta^2``: equal to the Hessian for a
  model linear in ``theta`` (with MSE, a linear least-squares problem), positive semi-definite
  whenever the loss is convex in the outputs. Output Hessians, for the evaluator's losses
  (:mod:`landscape.evaluation.losses`): cross-entropy ``H_n = diag(p_n) - p_n p_n^T`` with
  ``p_n = softmax(f_n)`` (per position for outputs ``(batch, classes, ...)``; targets equal to
  the ignore index -100 contribute nothing, as to the loss); MSE, summed over the output entries
  (``l_n = ||f_n - y_n||^2``), ``H_n = 2 I``; token losses (``causal_lm``, ``masked_lm``,
  ``token``: logits ``(batch, positions, vocabulary)``), ``H_t = diag(p_t) - p_t p_t^T`` per
  counted token ``t`` (for ``causal_lm`` the logits at ``t`` against the label at ``t + 1``),
  and ``N`` is then the number of counted tokens, as in the loss. Other losses raise a
  ConfigError.
* **Fisher** (Monte-Carlo, Martens 2020), ``kind="fisher"``: with labels drawn from
  the model's predictive distribution ``p(y | f_n)``, whose negative log-likelihood is the loss::

      F = (1/N) sum_n E_{y ~ p(.|f_n)} [g_n(y) g_n(y)^T],   g_n(y) = J_n^T s_n(y),  s_n(y) = d l(f_n, y) / d f

  estimated with ``mc_samples`` labels ``y_nm`` per input,
  ``F_hat = (1/N) sum_n (1/M) sum_m J_n^T s_nm s_nm^T J_n``. Cross-entropy: ``y ~ Categorical(p_n)``,
  ``s = p_n - e_y``, and ``E[s s^T] = diag(p_n) - p_n p_n^T``. MSE: ``||f - y||^2`` is, up to a
  constant, the negative log-likelihood of ``y ~ N(f, I / 2)``; ``y = f_n + eps / sqrt(2)``,
  ``s = -sqrt(2) eps`` and ``E[s s^T] = 2 I``. Token losses: one label per counted token
  from ``Categorical(p_t)``, and ``s_t s_t^T`` per token (tokens are the samples of the token
  loss). For all, ``E[s s^T] = H_n``: the Fisher *equals*
  the GGN (Martens 2020: so it is for a loss that is the negative log-likelihood of an
  exponential family in its natural parameters), and ``F_hat`` is an unbiased estimate of it whose error
  shrinks as ``1 / sqrt(N M)``. The labels are drawn once, when the operator is built, from a
  CPU ``torch.Generator`` seeded with ``seed``: the operator is one fixed symmetric matrix over
  all its products (as Lanczos needs), the same on every device.

Products are exact, batch by batch and memory-flat (``mode="jvp-vjp"``): a forward-mode product
``u = J v`` (``torch.func.jvp``, which also gives the outputs), the output-space product
``Lambda u`` per sample, and a reverse-mode product ``J^T (Lambda u) / N`` (``torch.func.vjp``).
:class:`OuterProductOperator` holds this product; the empirical Fisher
(:mod:`.empirical_fisher`) uses it too.

References: N. N. Schraudolph, *Fast curvature matrix-vector products for second-order gradient
descent*, Neural Computation 14 (2002); J. Martens, *New insights and perspectives on the natural
gradient method*, JMLR 21 (2020).

Examples
--------
The identity ``H = G + (1/N) sum_n sum_k (d l_n / d f_nk) d^2 f_nk / d theta^2``: for a model
linear in ``theta`` with MSE the second term vanishes and the GGN is the Hessian; through a tanh
layer it does not, and the GGN stays positive semi-definite where the Hessian is indefinite.

>>> import torch, landscape
>>> _ = torch.manual_seed(0)
>>> x, y = torch.randn(20, 3, dtype=torch.float64), torch.randn(20, 2, dtype=torch.float64)
>>> def dense(model: torch.nn.Module, kind: str) -> torch.Tensor:
...     ev = landscape.Evaluator(model, (x, y), loss="mse", dtype=torch.float64, progress=False)
...     op = landscape.curvature_operator(model, ev, kind=kind)
...     return torch.stack([op.matvec(e) for e in torch.eye(op.size, dtype=torch.float64)])
>>> linear = torch.nn.Linear(3, 2).double()
>>> torch.allclose(dense(linear, "ggn"), dense(linear, "hessian"))
True
>>> mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double()
>>> g, h = dense(mlp, "ggn"), dense(mlp, "hessian")
>>> torch.allclose(g, h), bool(torch.linalg.eigvalsh(g).min() > -1e-12), bool(torch.linalg.eigvalsh(h).min() < 0)
(False, True, True)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import torch
from torch.func import vjp

from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError
from ..infra.options import Options, option
from ..space.params import ModelLike
from .operators import CurvatureOperator, jvp_quietly
from .registry import operator_kind

#: Most Monte-Carlo labels per input of the Fisher.
MAX_MC_SAMPLES = 1_000
_IGNORE_INDEX = -100  # cross-entropy's default ignore_index


def _per_sample_dots(s: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``s_n . u_n`` per draw and sample, over all of a sample's outputs, broadcastable against ``s``."""
    dots = (s * u).reshape(s.shape[0], s.shape[1], -1).sum(-1)
    return dots.reshape(*dots.shape, *[1] * (u.ndim - 1))


class _CrossEntropy:
    """Output Hessian ``diag(p) - p p^T`` and Categorical(p) labels of the cross-entropy (class dim 1)."""

    @staticmethod
    def kept(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor | float:
        if torch.is_floating_point(y) or y.ndim != out.ndim - 1:  # probabilities: nothing ignored
            return 1.0
        return (y != _IGNORE_INDEX).unsqueeze(1).to(out.dtype)

    @classmethod
    def hessian_product(cls, out: torch.Tensor, y: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(out, 1)
        pu = p * u * cls.kept(out, y)
        return (pu - p * pu.sum(1, keepdim=True)) * cls.kept(out, y)

    @staticmethod
    def draw(out: torch.Tensor, m: int, generator: torch.Generator) -> torch.Tensor:
        p = torch.softmax(out.double(), 1).movedim(1, -1)
        labels = torch.multinomial(p.reshape(-1, p.shape[-1]).cpu(), m, replacement=True, generator=generator)
        return labels.T.reshape(m, *p.shape[:-1]).to(out.device)

    @classmethod
    def sampled_gradients(cls, out: torch.Tensor, y: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        onehot = torch.nn.functional.one_hot(draws, out.shape[1]).to(out.dtype).movedim(-1, 2)
        return (torch.softmax(out, 1).unsqueeze(0) - onehot) * cls.kept(out, y)

    dots = staticmethod(_per_sample_dots)


class _TokenCrossEntropy:
    """Per-token ``diag(p) - p p^T`` and Categorical(p) labels of a token loss (vocabulary last).

    Position ``t`` of the logits is scored against label ``t + shift``; positions without a
    counted label (``-100``, or past the end after the shift) contribute nothing.
    """

    def __init__(self, shift: int):
        self.shift = shift

    def kept(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        keep = torch.zeros(out.shape[:2], dtype=out.dtype, device=out.device)
        keep[:, :out.shape[1] - self.shift] = (y[:, self.shift:] != _IGNORE_INDEX).to(out.dtype)
        return keep.unsqueeze(-1)

    def hessian_product(self, out: torch.Tensor, y: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(out, -1)
        keep = self.kept(out, y)
        pu = p * u * keep
        return (pu - p * pu.sum(-1, keepdim=True)) * keep

    @staticmethod
    def draw(out: torch.Tensor, m: int, generator: torch.Generator) -> torch.Tensor:
        p = torch.softmax(out.double(), -1)
        labels = torch.multinomial(p.reshape(-1, p.shape[-1]).cpu(), m, replacement=True, generator=generator)
        return labels.T.reshape(m, *p.shape[:-1]).to(out.device)

    def sampled_gradients(self, out: torch.Tensor, y: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        onehot = torch.nn.functional.one_hot(draws, out.shape[-1]).to(out.dtype)
        return (torch.softmax(out, -1).unsqueeze(0) - onehot) * self.kept(out, y)

    @staticmethod
    def dots(s: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """``s_t . u_t`` per draw and token (tokens are the token loss's samples)."""
        return (s * u).sum(-1, keepdim=True)


class _SquaredError:
    """Output Hessian ``2 I`` and ``N(f, I/2)`` labels of the summed squared error."""

    @staticmethod
    def hessian_product(out: torch.Tensor, y: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return 2.0 * u

    @staticmethod
    def draw(out: torch.Tensor, m: int, generator: torch.Generator) -> torch.Tensor:
        return torch.randn((m, *out.shape), generator=generator, dtype=torch.float64).to(out.device, out.dtype)

    @staticmethod
    def sampled_gradients(out: torch.Tensor, y: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        return math.sqrt(2.0) * draws  # s = 2 (f - y) = -sqrt(2) eps; the sign cancels in s s^T

    dots = staticmethod(_per_sample_dots)


_OUTPUT_LOSSES = {"cross_entropy": _CrossEntropy, "mse": _SquaredError, "causal_lm": _TokenCrossEntropy(1),
                  "masked_lm": _TokenCrossEntropy(0), "token": _TokenCrossEntropy(0)}


def output_loss(evaluator: PointEvaluator, kind: str) -> Any:
    """The output-space helpers of the evaluator's loss: its output Hessian's products and its label draws.

    Parameters
    ----------
    evaluator : PointEvaluator
        Its ``loss_name`` selects them.
    kind : str
        The curvature kind asking (named in the error).

    Returns
    -------
    Any
        An object with ``hessian_product``, ``draw`` and ``sampled_gradients``.

    Raises
    ------
    ConfigError
        A loss whose output Hessian is not known here.
    """
    loss = evaluator.loss_name
    if loss not in _OUTPUT_LOSSES:
        known = ", ".join(map(repr, _OUTPUT_LOSSES))
        raise ConfigError(f"kind={kind!r} needs a loss whose output Hessian is known ({known}), but the evaluator's "
                          f"loss is {loss!r}; use kind='hessian' or kind='empirical_fisher'")
    return _OUTPUT_LOSSES[loss]


class OuterProductOperator(CurvatureOperator):
    """``(1/N) sum_n J_n^T Lambda_n J_n`` with ``J_n`` the Jacobian of a per-sample output.

    The common product of the GGN, the Fisher and the empirical Fisher's ``"jvp-vjp"`` mode.

    Subclasses give the outputs (:meth:`batch_outputs`, default the model's) and the output-space
    product ``Lambda u`` (:meth:`output_product`).

    Parameters
    ----------
    evaluator, point, params, include_frozen, check_determinism
        As for :class:`~.operators.CurvatureOperator`.
    """

    mode = "jvp-vjp"

    def batch_outputs(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The outputs ``f_n`` of one batch whose Jacobian ``J`` the product uses.

        Parameters
        ----------
        theta : torch.Tensor
            The selected parameters (flat).
        x, y : torch.Tensor
            The batch.

        Returns
        -------
        torch.Tensor
            ``(batch, ...)``: the model's outputs.
        """
        return self.outputs(theta, x)

    def output_product(self, index: int, out: torch.Tensor, y: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """``Lambda_n u_n`` for every sample of a batch; set by each kind.

        Parameters
        ----------
        index : int
            The batch's position in the evaluator's batches.
        out, y : torch.Tensor
            The batch's outputs (from :meth:`batch_outputs`, detached) and targets.
        u : torch.Tensor
            ``J v``, shaped as ``out``.

        Returns
        -------
        torch.Tensor
            Shaped as ``out``.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define output_product")

    def batch_product(self, index: int, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One batch's share ``J^T Lambda J v / N``: a JVP, the output-space product, a VJP.

        Parameters
        ----------
        index : int
            The batch's position.
        x, y : torch.Tensor
            The batch.
        v : torch.Tensor
            The vector.

        Returns
        -------
        torch.Tensor
            Length ``dim``.
        """
        def f(theta: torch.Tensor) -> torch.Tensor:
            return self.batch_outputs(theta, x, y)

        out, jv = jvp_quietly(f, self.theta, v)
        weighted = self.output_product(index, out.detach(), y, jv.detach()) / self.evaluator.num_targets
        return vjp(f, self.theta)[1](weighted)[0]


@operator_kind("ggn")
class GGNOperator(OuterProductOperator):
    """The generalised Gauss-Newton matrix ``G = (1/N) sum_n J_n^T H_n J_n`` (Schraudolph 2002).

    Parameters
    ----------
    evaluator, point, params, include_frozen, check_determinism, seed
        As for :class:`~.operators.CurvatureOperator` (``seed`` unused); the evaluator's loss must
        have a known output Hessian (cross-entropy, MSE, the token losses).

    Raises
    ------
    ConfigError
        Another loss, or as for :class:`~.operators.CurvatureOperator`.
    """

    kind: ClassVar[str] = "ggn"

    def __init__(self, evaluator: PointEvaluator, point: ModelLike | torch.Tensor, *,
                 params: Sequence[str] | str | None = None, include_frozen: bool = False,
                 check_determinism: bool = True, seed: int = 0):
        self.output_loss = output_loss(evaluator, self.kind)
        super().__init__(evaluator, point, params=params, include_frozen=include_frozen,
                         check_determinism=check_determinism, seed=seed)

    def output_product(self, index: int, out: torch.Tensor, y: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """``H_n u_n``: the loss's Hessian with respect to the outputs, in closed form.

        Parameters
        ----------
        index : int
            Unused (the output Hessian depends on the outputs only).
        out, y, u : torch.Tensor
            As for :meth:`OuterProductOperator.output_product`.

        Returns
        -------
        torch.Tensor
            Shaped as ``out``.
        """
        return self.output_loss.hessian_product(out, y, u)


@dataclass(frozen=True)
class FisherOptions(Options):
    """Options of the Monte-Carlo Fisher (``kind="fisher"``); the functions' ``mc_samples=`` is short for its option.

    Attributes
    ----------
    mc_samples
        Labels drawn per input (``M``), at most :data:`MAX_MC_SAMPLES`.
    """

    mc_samples: int = option(1, ge=1, le=MAX_MC_SAMPLES, source="curvlinops' default (one label per input)",
                             help="labels drawn per input from the model's predictive distribution (seeded by the "
                                  "function's seed); the estimate's error shrinks as 1/sqrt(N mc_samples)")


@operator_kind("fisher")
class FisherOperator(OuterProductOperator):
    """The Monte-Carlo Fisher.

    ``mc_samples`` labels per input drawn from the model's predictive distribution (once,
    seeded); its expectation is the GGN for cross-entropy and MSE. Not split over the ranks of a
    process group (:attr:`unshardable`).

    Parameters
    ----------
    evaluator, point, params, include_frozen, check_determinism
        As for :class:`~.operators.CurvatureOperator`; the evaluator's loss must have a known
        output Hessian (cross-entropy, MSE, the token losses).
    mc_samples
        Labels drawn per input (``1 <= mc_samples <=`` :data:`MAX_MC_SAMPLES`).
    seed
        Seed of the labels.

    Attributes
    ----------
    draws : list of torch.Tensor
        Per batch, the drawn labels (cross-entropy, ``(mc_samples, batch, ...)`` class indices) or
        standard normal noise (MSE, ``(mc_samples, *outputs.shape)``).

    Raises
    ------
    ConfigError
        Another loss, ``mc_samples`` out of range, or as for :class:`~.operators.CurvatureOperator`.
    """

    kind: ClassVar[str] = "fisher"
    Options: ClassVar[type[Options]] = FisherOptions
    unshardable: ClassVar[str] = ("kind='fisher' draws its labels batch after batch from one generator, so a shard "
                                  "would draw other labels than one process; use kind='ggn' (its expectation) or one "
                                  "process")

    def __init__(self, evaluator: PointEvaluator, point: ModelLike | torch.Tensor, *,
                 params: Sequence[str] | str | None = None, include_frozen: bool = False,
                 check_determinism: bool = True, mc_samples: int = 1, seed: int = 0):
        self.mc_samples = FisherOptions.from_mapping({"mc_samples": mc_samples},
                                                     owner=f"curvature kind {self.kind!r} option ").mc_samples
        self.output_loss = output_loss(evaluator, self.kind)
        super().__init__(evaluator, point, params=params, include_frozen=include_frozen,
                         check_determinism=check_determinism, seed=seed)
        generator = torch.Generator().manual_seed(self.seed)
        with torch.no_grad():
            self.draws = [self.output_loss.draw(self.outputs(self.theta, x), self.mc_samples, generator)
                          for x, _ in evaluator.batches]

    def output_product(self, index: int, out: torch.Tensor, y: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """``(1/M) sum_m s_nm (s_nm . u_n)`` with the sampled output gradients ``s_nm``.

        Parameters
        ----------
        index : int
            The batch's position (selects its drawn labels).
        out, y, u : torch.Tensor
            As for :meth:`OuterProductOperator.output_product`.

        Returns
        -------
        torch.Tensor
            Shaped as ``out``.
        """
        s = self.output_loss.sampled_gradients(out, y, self.draws[index])
        return (s * self.output_loss.dots(s, u)).mean(0)

