r"""K-FAC and EKFAC: Kronecker-factored curvature, ``kind="kfac"`` and ``kind="ekfac"``.

Both are block-diagonal, one block per ``nn.Linear`` / ``nn.Conv2d`` layer holding its weight and
bias together (the bias as a homogeneous coordinate of the input, see :mod:`.kronecker`). With
the layer inputs ``a_nt`` (``t`` the positions of a convolution, "expand" convention) and the
backpropagated output gradients ``g_nkt`` of the chosen ``fisher_type``:

* **K-FAC** (Martens & Grosse 2015, eq. 1 and section 3; Grosse & Martens 2016 for convolutions)
  approximates the block ``C = E[vec(D) vec(D)^T]`` by a Kronecker product of two small factors::

      C ~ A (x) G,    A = (1/(N T)) sum_{n,t} a_nt a_nt^T,    G = (1/N) sum_{n,k,t} g_nkt g_nkt^T

  (positions averaged in ``A`` and summed in ``G``, as curvlinops' ``kfac_approx="expand"``); with
  ``A = Q_A diag(alpha) Q_A^T`` and ``G = Q_G diag(gamma) Q_G^T``, its eigenvalues are the products
  ``gamma_i alpha_j`` with eigenvectors ``q_G,i (x) q_A,j``.
* **EKFAC** (George et al. 2018, eq. 12) keeps K-FAC's eigenbasis and re-fits the eigenvalues to
  the per-sample pseudo-gradients ``D_nk = sum_t g_nkt a_nt^T`` projected into it::

      C ~ (Q_G (x) Q_A) diag(s) (Q_G (x) Q_A)^T,    s_ij = (1/N) sum_{n,k} (Q_G^T D_nk Q_A)_ij^2

  ``s`` is the diagonal of the exact block in that basis, ``diag(Q^T C Q)``: of all matrices with
  these eigenvectors the closest to ``C`` in Frobenius norm, so EKFAC is never farther from
  ``C`` than K-FAC.

In the operator's coordinates the block of a layer acts on ``M = [W, b]`` (``out x (in + 1)``,
the weight row-major as in ``theta``) as ``M -> G M A``; the inverse and the eigenvalues are exact
through the factors' eigendecompositions: ``(C + lambda I)^{-1}`` maps ``M`` to
``Q_G [(Q_G^T M Q_A) / (Lambda + lambda)] Q_A^T``, ``Lambda`` the grid of eigenvalues
(:meth:`KFACOperator.inverse_matvec`, :meth:`KFACOperator.eigenvalues`). The factors are computed
once, when the operator is built; products cost two small matrix products per layer.

``fisher_type`` chooses the expectation (as curvlinops' option of that name): ``"type-2"`` (the
GGN, exact output Hessians through their square roots; the default here, curvlinops defaults to
``"mc"``), ``"mc"`` (``mc_samples`` labels per input drawn as by ``kind="fisher"``, same seed,
same labels) or ``"empirical"`` (the data's labels). The loss is the evaluator's mean over its
``N`` samples (curvlinops' ``reduction="mean"`` for cross-entropy; for ``loss="mse"``, whose
per-sample loss sums the squared errors over the outputs, curvlinops' ``MSELoss(reduction="sum")``
divided by ``N``).

References: J. Martens and R. Grosse, *Optimizing neural networks with Kronecker-factored
approximate curvature*, ICML 2015; R. Grosse and J. Martens, *A Kronecker-factored approximate
Fisher matrix for convolution layers*, ICML 2016; T. George, C. Laurent, X. Bouthillier,
N. Ballas and P. Vincent, *Fast approximate natural gradient descent in a Kronecker-factored
eigenbasis*, NeurIPS 2018.

Examples
--------
One linear layer, MSE and one sample: ``a a^T (x) 2 I`` is the layer's exact GGN.

>>> import torch, landscape
>>> _ = torch.manual_seed(0)
>>> x, y = torch.randn(1, 3, dtype=torch.float64), torch.randn(1, 2, dtype=torch.float64)
>>> model = torch.nn.Linear(3, 2).double()
>>> ev = landscape.Evaluator(model, (x, y), loss="mse", dtype=torch.float64, progress=False)
>>> kfac = landscape.curvature_operator(model, ev, kind="kfac")
>>> ggn = landscape.curvature_operator(model, ev, kind="ggn")
>>> torch.allclose(kfac.dense(), ggn.dense())
True
>>> v = torch.randn(kfac.size, dtype=torch.float64)
>>> u = kfac.inverse_matvec(v, damping=0.1)
>>> torch.allclose(kfac.matvec(u) + 0.1 * u, v)
True
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Sequence

import torch

from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError, CurvatureError
from ..infra.options import Options, option
from ..space.params import ModelLike
from .gauss_newton import MAX_MC_SAMPLES, output_loss
from .kronecker import FISHER_TYPES, KroneckerLayer, backpropagated, check_fisher_type, kronecker_layers
from .operators import CurvatureOperator
from .registry import operator_kind

CURVLINOPS = "curvlinops (Dangel et al.)"


@dataclass(frozen=True)
class KFACOptions(Options):
    """Options of K-FAC and EKFAC (``kind="kfac"``, ``kind="ekfac"``).

    Attributes
    ----------
    fisher_type
        The expectation the factors approximate (:data:`~.kronecker.FISHER_TYPES`).
    mc_samples
        Labels drawn per input for ``fisher_type="mc"``.
    """

    fisher_type: str = option("type-2", choices=FISHER_TYPES, source=CURVLINOPS,
                              help="type-2 (the GGN: exact output Hessians), mc (mc_samples labels drawn from the "
                                   "model, as kind fisher) or empirical (the data's labels)")
    mc_samples: int = option(1, ge=1, le=MAX_MC_SAMPLES, source=CURVLINOPS,
                             help="labels drawn per input when fisher_type is mc (seeded by the function's seed)")


@operator_kind("kfac")
class KFACOperator(CurvatureOperator):
    """K-FAC: one Kronecker product ``A (x) G`` per ``nn.Linear`` / ``nn.Conv2d`` layer (Martens & Grosse 2015).

    Parameters
    ----------
    evaluator, point, params, include_frozen, check_determinism, seed
        As for :class:`~.operators.CurvatureOperator`; every selected parameter must be a weight or
        bias of an ``nn.Linear`` or ``nn.Conv2d`` (``seed`` draws the labels of ``fisher_type="mc"``).
    fisher_type
        ``"type-2"``, ``"mc"`` or ``"empirical"`` (see the module's docstring).
    mc_samples
        Labels per input for ``"mc"``.

    Attributes
    ----------
    layers : list of KroneckerLayer
        The blocks, in the order of ``theta``.
    factors : list of tuple of torch.Tensor
        Per layer ``(A, G)``: ``(columns, columns)`` and ``(out, out)``.
    draws : list of torch.Tensor
        Per batch, the labels drawn for ``fisher_type="mc"`` (empty otherwise).

    Raises
    ------
    ConfigError
        A parameter of another layer, an unsupported convolution or loss, ``mc_samples > 1`` without
        ``fisher_type="mc"``, or as for :class:`~.operators.CurvatureOperator`.
    """

    kind: ClassVar[str] = "kfac"
    Options: ClassVar[type[Options]] = KFACOptions
    unshardable: ClassVar[str] = ("kind='kfac'/'ekfac' builds its Kronecker factors from all of the data when it is "
                                  "built, not product by product; use one process")
    mode = "kronecker"

    def __init__(self, evaluator: PointEvaluator, point: ModelLike | torch.Tensor, *,
                 params: Sequence[str] | str | None = None, include_frozen: bool = False,
                 check_determinism: bool = True, seed: int = 0, fisher_type: str = "type-2", mc_samples: int = 1):
        checked = KFACOptions.from_mapping({"fisher_type": fisher_type, "mc_samples": mc_samples},
                                           owner=f"curvature kind {self.kind!r} option ")
        if checked.mc_samples != 1 and checked.fisher_type != "mc":
            raise ConfigError(f"mc_samples={mc_samples} needs fisher_type='mc', got fisher_type={fisher_type!r}")
        super().__init__(evaluator, point, params=params, include_frozen=include_frozen,
                         check_determinism=check_determinism, seed=seed)
        self.fisher_type, self.mc_samples = checked.fisher_type, checked.mc_samples
        check_fisher_type(self, self.fisher_type)
        self.layers: list[KroneckerLayer] = kronecker_layers(self)
        self.draws: list[torch.Tensor] = []
        if self.fisher_type == "mc":
            generator = torch.Generator().manual_seed(self.seed)
            labels = output_loss(evaluator, self.kind)
            with torch.no_grad():
                self.draws = [labels.draw(self.outputs(self.theta, x), self.mc_samples, generator)
                              for x, _ in evaluator.batches]
        self.factors = self._kronecker_factors()

    def _kronecker_factors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``A = (1/(N T)) sum a a^T`` and ``G = (1/N) sum g g^T`` of every layer, over all batches."""
        a_sums = [torch.zeros(la.columns, la.columns, dtype=self.dtype, device=self.device) for la in self.layers]
        g_sums = [torch.zeros(la.out_features, la.out_features, dtype=self.dtype, device=self.device)
                  for la in self.layers]
        for weights, inputs, grads in backpropagated(self, self.layers, self.fisher_type, self.draws):
            for i, (a, g) in enumerate(zip(inputs, grads)):
                a_sums[i] += torch.einsum("bti,btj,b->ij", a, a, weights) / a.shape[1]
                g_sums[i] += torch.einsum("kbto,kbtp->op", g, g)
        n = self.evaluator.num_targets
        return [(a / n, g / n) for a, g in zip(a_sums, g_sums)]

    # ------------------------------------------------------------ per-block algebra
    def blocks(self, v: torch.Tensor) -> list[torch.Tensor]:
        """``v`` (``(dim, k)``) as each layer's matrices ``M = [W, b]``, ``(out, columns, k)``.

        Parameters
        ----------
        v : torch.Tensor
            ``(dim, k)``: ``k`` vectors of the operator's coordinates.

        Returns
        -------
        list of torch.Tensor
            One per layer.
        """
        out = []
        for layer in self.layers:
            parts = [v[s].reshape(layer.out_features, -1, v.shape[1]) for s in (layer.weight, layer.bias)
                     if s is not None]
            out.append(torch.cat(parts, 1))
        return out

    def unblocks(self, blocks: list[torch.Tensor]) -> torch.Tensor:
        """The inverse of :meth:`blocks`: ``(dim, k)`` from each layer's ``(out, columns, k)``.

        Parameters
        ----------
        blocks : list of torch.Tensor
            One per layer.

        Returns
        -------
        torch.Tensor
            ``(dim, k)``.
        """
        out = torch.empty(self.dim, blocks[0].shape[-1], dtype=blocks[0].dtype, device=blocks[0].device)
        for layer, m in zip(self.layers, blocks):
            if layer.weight is not None:
                out[layer.weight] = m[:, :layer.in_features].reshape(-1, m.shape[-1])
            if layer.bias is not None:
                out[layer.bias] = m[:, -1]
        return out

    @cached_property
    def spectra(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per layer ``(alpha, Q_A, gamma, Q_G)``: the factors' eigenvalues (ascending) and eigenvectors (columns).

        Returns
        -------
        list of tuple of torch.Tensor
        """
        return [(*torch.linalg.eigh(a), *torch.linalg.eigh(g)) for a, g in self.factors]

    def eigenvalue_grids(self) -> list[torch.Tensor]:
        """Per layer the ``(out, columns)`` eigenvalues ``gamma_i alpha_j`` of ``A (x) G`` in its eigenbasis.

        Returns
        -------
        list of torch.Tensor
            Entry ``(i, j)`` belongs to the eigenvector ``q_G,i q_A,j^T`` (in ``M`` form).
        """
        return [torch.outer(gamma, alpha) for alpha, _, gamma, _ in self.spectra]

    def _in_eigenbasis(self, v: torch.Tensor, scale: list[torch.Tensor]) -> torch.Tensor:
        """``Q diag(scale) Q^T v`` block by block, ``Q = Q_G (x) Q_A``."""
        out = []
        for m, (_, qa, _, qg), s in zip(self.blocks(v), self.spectra, scale):
            rotated = torch.einsum("oi,ojk,jl->ilk", qg, m, qa) * s[:, :, None]
            out.append(torch.einsum("io,ojk,lj->ilk", qg, rotated, qa))
        return self.unblocks(out)

    def _checked(self, v: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """``v`` as ``(dim, k)`` on the device, and whether it was one vector."""
        single = v.ndim == 1
        if v.ndim not in (1, 2) or v.shape[0] != self.dim:
            raise ConfigError(f"the {self.kind} product needs a vector of length {self.dim} or a ({self.dim}, k) "
                              f"matrix, got shape {tuple(v.shape)}")
        v = v.to(self.device, self.dtype)
        return (v[:, None] if single else v), single

    # ---------------------------------------------------------------- products
    def matmat(self, v: torch.Tensor) -> torch.Tensor:
        """``C V`` for ``k`` vectors at once (``k`` products counted in ``matvecs``).

        Parameters
        ----------
        v : torch.Tensor
            ``(dim, k)``, or a vector of length ``dim``.

        Returns
        -------
        torch.Tensor
            Shaped as ``v``.

        Raises
        ------
        ConfigError
            ``v`` of another shape.
        """
        m, single = self._checked(v)
        out = self._product(m)
        self.matvecs += m.shape[1]
        return out[:, 0] if single else out

    def _product(self, m: torch.Tensor) -> torch.Tensor:
        """``G M A`` per layer."""
        return self.unblocks([torch.einsum("op,pjk,jl->olk", g, block, a)
                              for block, (a, g) in zip(self.blocks(m), self.factors)])

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        """``C v`` (one product, counted in ``matvecs``).

        Parameters
        ----------
        v : torch.Tensor
            Length ``dim``.

        Returns
        -------
        torch.Tensor
            Length ``dim``.

        Raises
        ------
        ConfigError
            ``v`` not of length ``dim``.
        """
        if v.ndim != 1:
            raise ConfigError(f"the {self.kind} product needs a vector of length {self.dim}, "
                              f"got shape {tuple(v.shape)}")
        return self.matmat(v)

    __call__ = matvec

    def inverse_matvec(self, v: torch.Tensor, damping: float = 0.0) -> torch.Tensor:
        """``(C + damping I)^{-1} v``, exactly through the factors' eigendecompositions (no iterations).

        Parameters
        ----------
        v : torch.Tensor
            Length ``dim``, or ``(dim, k)``.
        damping : float
            ``>= 0``, added to every eigenvalue.

        Returns
        -------
        torch.Tensor
            Shaped as ``v``.

        Raises
        ------
        ConfigError
            A negative or non-finite ``damping``, or ``v`` of another shape.
        CurvatureError
            An eigenvalue plus ``damping`` is not positive (the damped matrix is singular).
        """
        if isinstance(damping, bool) or not isinstance(damping, (int, float)) or not 0 <= damping < math.inf:
            raise ConfigError(f"damping must be a finite number >= 0, got {damping!r}")
        m, single = self._checked(v)
        grids = self.eigenvalue_grids()
        smallest = min(float(grid.min()) for grid in grids) + damping
        if not smallest > 0:
            raise CurvatureError(f"the damped {self.kind} matrix is singular: its smallest eigenvalue plus "
                                 f"damping={damping:g} is {smallest:.3g}; raise damping")
        out = self._in_eigenbasis(m, [1.0 / (grid + damping) for grid in grids])
        return out[:, 0] if single else out

    def eigenvalues(self) -> torch.Tensor:
        """Every eigenvalue of the operator, ascending (as ``torch.linalg.eigvalsh`` of its dense matrix).

        Returns
        -------
        torch.Tensor
            ``dim`` values, float64, on the CPU.
        """
        return torch.sort(torch.cat([grid.reshape(-1) for grid in self.eigenvalue_grids()])).values.double().cpu()


@operator_kind("ekfac")
class EKFACOperator(KFACOperator):
    """EKFAC: K-FAC's eigenbasis with eigenvalues re-fitted to projected per-sample gradients (George et al. 2018).

    Parameters
    ----------
    evaluator, point, params, include_frozen, check_determinism, seed, fisher_type, mc_samples
        As for :class:`KFACOperator`.

    Attributes
    ----------
    scalings : list of torch.Tensor
        Per layer the ``(out, columns)`` eigenvalues ``s_ij = (1/N) sum_{n,k} (Q_G^T D_nk Q_A)_ij^2``.

    Raises
    ------
    ConfigError
        As for :class:`KFACOperator`.
    """

    kind: ClassVar[str] = "ekfac"

    def __init__(self, evaluator: PointEvaluator, point: ModelLike | torch.Tensor, *,
                 params: Sequence[str] | str | None = None, include_frozen: bool = False,
                 check_determinism: bool = True, seed: int = 0, fisher_type: str = "type-2", mc_samples: int = 1):
        super().__init__(evaluator, point, params=params, include_frozen=include_frozen,
                         check_determinism=check_determinism, seed=seed, fisher_type=fisher_type,
                         mc_samples=mc_samples)
        sums = [torch.zeros(la.out_features, la.columns, dtype=self.dtype, device=self.device) for la in self.layers]
        for _, inputs, grads in backpropagated(self, self.layers, self.fisher_type, self.draws):
            for i, (a, g, (_, qa, _, qg)) in enumerate(zip(inputs, grads, self.spectra)):
                pa = a @ qa
                for gk in g @ qg:  # one column at a time: (B, out, columns) projected per-sample gradients
                    sums[i] += torch.einsum("bto,bti->boi", gk, pa).square().sum(0)
        self.scalings = [s / self.evaluator.num_targets for s in sums]

    def eigenvalue_grids(self) -> list[torch.Tensor]:
        """The re-fitted eigenvalues :attr:`scalings` (see :meth:`KFACOperator.eigenvalue_grids`).

        Returns
        -------
        list of torch.Tensor
        """
        return self.scalings

    def _product(self, m: torch.Tensor) -> torch.Tensor:
        """``Q diag(s) Q^T M`` per layer."""
        return self._in_eigenbasis(m, self.scalings)
