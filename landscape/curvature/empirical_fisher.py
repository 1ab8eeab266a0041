r"""The empirical Fisher, ``kind="empirical_fisher"`` (Martens 2020; Kunstner et al. 2019).

It is::

    F_emp = (1/N) sum_n g_n g_n^T,    g_n = d l(f(x_n; theta), y_n) / d theta

the outer products of the per-sample gradients at the *data's* labels. Scaling convention:
``g_n`` is the gradient of the per-sample loss ``l_n`` itself, the loss being their mean --
not of ``l_n / N`` (which would scale ``F_emp`` by ``1/N^2``) nor of batch means (which would
make it depend on the batch size); for MSE ``l_n`` sums over the output entries (a loss averaged
over the ``K`` entries instead would divide ``F_emp`` by ``K^2``). ``F_emp`` is not the Fisher:
it uses the observed labels rather than the model's, and Kunstner et al. (2019) show that it
approximates the Fisher (or the Hessian) only under strong assumptions (a well-specified model,
near a minimum, many samples) and can be a poor curvature proxy otherwise, its large eigenvalues
following the per-sample gradients rather than the curvature; it is here to be compared.

Products are exact, batch by batch. ``mode="vmap"``: per-sample gradients by
``torch.func.vmap(grad(l_n))`` over chunks of a batch (each chunk's gradient matrix at most
:data:`PER_SAMPLE_BUDGET` bytes), then ``G^T (G v) / N``. For a model vmap cannot batch (an
operation without a batching rule, data-dependent control flow), ``mode="jvp-vjp"`` computes the
same product batched, as ``J_l^T (J_l v) / N`` with ``J_l`` the Jacobian of the batch's vector of
per-sample losses (the product of :class:`~.gauss_newton.OuterProductOperator` with
``Lambda = I``); ``per_sample="auto"`` tries vmap on two samples when the operator is built and
falls back.

References: J. Martens, *New insights and perspectives on the natural gradient method*, JMLR 21
(2020); F. Kunstner, L. Balles and P. Hennig, *Limitations of the empirical Fisher approximation
for natural gradient descent*, NeurIPS 2019.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

import torch
from torch.func import grad, vmap

from ..evaluation.inputs import ModelInputs, leading, map_tensors
from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError
from ..infra.options import Options, option
from ..space.params import ModelLike
from .gauss_newton import OuterProductOperator
from .registry import operator_kind
from .second_order import second_order

#: Most bytes of per-sample gradients the empirical Fisher holds at once (``vmap`` mode).
PER_SAMPLE_BUDGET = 256 << 20
#: Ways of computing empirical-Fisher products (``"auto"``: vmap where the model allows it).
PER_SAMPLE_MODES = ("auto", "vmap", "jvp-vjp")


@dataclass(frozen=True)
class EmpiricalFisherOptions(Options):
    """Options of the empirical Fisher (``kind="empirical_fisher"``), given as ``kind_options={"per_sample": ...}``.

    Attributes
    ----------
    per_sample
        How products are computed (:data:`PER_SAMPLE_MODES`).
    """

    per_sample: str = option("auto", choices=PER_SAMPLE_MODES,
                             help="how products are computed: vmap (per-sample gradients, 256 MiB at a time), "
                                  "jvp-vjp (batched J^T (J v), for models vmap cannot batch) or auto (vmap unless it "
                                  "fails on two samples); the same numbers")


@operator_kind("empirical_fisher")
class EmpiricalFisherOperator(OuterProductOperator):
    """The empirical Fisher ``F_emp = (1/N) sum_n g_n g_n^T`` of the per-sample gradients (any loss).

    Parameters
    ----------
    evaluator, point, params, include_frozen, check_determinism, seed
        As for :class:`~.operators.CurvatureOperator` (``seed`` unused).
    per_sample
        ``"vmap"`` (per-sample gradients by ``torch.func.vmap``), ``"jvp-vjp"`` (batched
        ``J_l^T (J_l v)``) or ``"auto"`` (vmap unless it fails on the model); the choice is
        ``mode``.

    Raises
    ------
    ConfigError
        An unknown ``per_sample``, or as for :class:`~.operators.CurvatureOperator`.
    """

    kind: ClassVar[str] = "empirical_fisher"
    Options: ClassVar[type[Options]] = EmpiricalFisherOptions

    def __init__(self, evaluator: PointEvaluator, point: ModelLike | torch.Tensor, *,
                 params: Sequence[str] | str | None = None, include_frozen: bool = False,
                 check_determinism: bool = True, seed: int = 0, per_sample: str = "auto"):
        if per_sample not in PER_SAMPLE_MODES:
            raise ConfigError(f"per_sample must be one of {PER_SAMPLE_MODES}, got {per_sample!r}")
        super().__init__(evaluator, point, params=params, include_frozen=include_frozen,
                         check_determinism=check_determinism, seed=seed)
        self.chunk = max(1, PER_SAMPLE_BUDGET // (self.dim * self.dtype.itemsize))
        if per_sample == "auto":
            per_sample = "vmap" if self._vmap_works() else "jvp-vjp"
        self.mode = per_sample

    def batch_outputs(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The per-sample losses ``l_n`` of one batch (their Jacobian rows are the ``g_n``).

        Parameters
        ----------
        theta : torch.Tensor
            The selected parameters (flat).
        x, y : torch.Tensor
            The batch.

        Returns
        -------
        torch.Tensor
            ``(batch,)``.
        """
        return self.evaluator.loss.per_sample(self.outputs(theta, x), y)

    def output_product(self, index: int, out: torch.Tensor, y: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """``u`` itself: ``Lambda = I`` on the per-sample losses.

        Parameters
        ----------
        index : int
            Unused.
        out, y : torch.Tensor
            Unused.
        u : torch.Tensor
            ``(g_n . v)_n``.

        Returns
        -------
        torch.Tensor
            ``u``.
        """
        return u

    def per_sample_gradients(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The gradients ``g_n`` of the per-sample losses of some samples, by ``vmap(grad)``.

        Parameters
        ----------
        x, y : torch.Tensor
            Inputs and targets of the samples.

        Returns
        -------
        torch.Tensor
            ``(samples, dim)``.
        """
        def sample_loss(theta: torch.Tensor, xi: ModelInputs, yi: torch.Tensor) -> torch.Tensor:
            return self.batch_outputs(theta, map_tensors(xi, lambda t: t.unsqueeze(0)), yi.unsqueeze(0)).sum()

        return vmap(grad(sample_loss), in_dims=(None, 0, 0))(self.theta, x, y)

    def batch_product(self, index: int, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One batch's share ``sum_{n in batch} g_n (g_n . v) / N``.

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
        if self.mode == "jvp-vjp":
            return super().batch_product(index, x, y, v)
        out = torch.zeros_like(self.theta)
        for start in range(0, len(y), self.chunk):
            rows = slice(start, start + self.chunk)
            g = self.per_sample_gradients(map_tensors(x, lambda t: t[rows]), y[rows]).detach()
            out += g.T @ (g @ v)
        return out / self.evaluator.num_targets

    def _vmap_works(self) -> bool:
        x, y = self.evaluator.batches[0]
        try:
            with second_order("vmap", self.kind, self.forward_mode_fix):
                self.per_sample_gradients(leading(x, 2), y[:2])
        except (RuntimeError, NotImplementedError, ValueError):  # no batching rule, data-dependent control flow
            return False
        return True
