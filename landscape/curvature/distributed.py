"""Curvature products of one model summed over the ranks of a ``torch.distributed`` process group.

The operators of :mod:`.operators` compute ``C v`` as a sum over the evaluator's batches of
each batch's share, ``(1/N) sum_{i in batch} C_i v`` (for the Hessian, ``C_i = d^2 l_i / d theta^2``
and each share is a Hessian-vector product by Pearlmutter's R-operator, 1994, as
forward-over-reverse or reverse-over-reverse differentiation). The sum splits over ranks:

``H v = (1/N) sum_n H_n v = sum_r [ sum_{b in shard r} (1/N) sum_{i in b} H_i v ]``,

so rank ``r`` of a world of ``R`` processes holds a contiguous block of the batches, computes its
bracket with the single-process code (the same batches, the same ``1/N`` with the *whole* data's
``N``), and one ``all_reduce(SUM)`` in float64 gives every rank the same full-data product. Each
batch's share is then bitwise the single process's; only the order of the sum over batches
differs, so the products agree to float rounding of that sum (at most ``2 B u sum_b |share_b|``
per entry for ``B`` batches and unit roundoff ``u``). At construction the ranks all-reduce their
sample counts and parameter counts and refuse to go on unless they add up to the evaluator's.

Every rank runs the same solver on the same products, so every rank takes the same steps (the
all-reduced vectors are identical) and the solvers of this package (Lanczos, Hutchinson, Hutch++,
SLQ) need no change. :func:`distributed_operator` is the entry point inside a process group the
user started (``torchrun``, or ``torch.distributed.init_process_group`` in each process);
:mod:`.distributed_launch` starts the worker processes itself.

A kind whose products do not split this way says why in its ``unshardable`` attribute and is
refused: the Monte-Carlo Fisher draws its labels batch after batch from one seeded generator, so
a shard would draw other labels than one process does. The kind's options (``kind_options``) pass
through unchanged, but for the choices it makes from the data (``hvp="auto"``), made once on the
whole data (:meth:`~.operators.CurvatureOperator.whole_data_options`).
"""
from __future__ import annotations

import copy
from typing import Any, Sequence

import torch
import torch.distributed as dist

from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError
from ..space.params import ModelLike
from .at_point import KindOptions, curvature_operator, flat_point, resolve_kind_options, with_bn_mode
from .linear import scipy_view
from .operators import CurvatureOperator
from .registry import operator_class

__all__ = ["DistributedOperator", "batch_block", "check_kind", "distributed_operator", "samples"]


class DistributedOperator:
    """A curvature operator whose products are summed over the ranks of a process group.

    ``matvec(v)`` is ``all_reduce_SUM(local.matvec(v))`` in float64, returned in the local
    operator's dtype and device: the full-data product when each rank's ``local`` operator covers
    its block of the batches and divides by the whole data's count (as :func:`distributed_operator`
    builds it). Every rank must call ``matvec`` the same number of times, in the same order.

    Parameters
    ----------
    local : CurvatureOperator
        This rank's operator (its evaluator holding this rank's batches).
    total_samples : int
        The number of samples of the whole data (the ranks' blocks must add up to it).
    group : ProcessGroup, optional
        The process group (default: the default group).

    Attributes
    ----------
    size, dim : int
        The number of differentiated parameters.
    dtype, device
        Of the vectors ``matvec`` takes and returns.
    kind, mode : str
        The local operator's kind and product mode.
    rank, world : int
        This process's rank and the group's size.
    matvecs : int
        Products computed so far.

    Raises
    ------
    ConfigError
        No process group is initialised, or the ranks' sample counts do not add up to
        ``total_samples`` or their parameter counts differ (different data or models on the ranks).
    """

    def __init__(self, local: CurvatureOperator, total_samples: int, *, group: Any = None):
        _require_group()
        self.local = local
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.size = self.dim = local.dim
        self.dtype, self.device = local.dtype, local.device
        self.kind, self.mode = local.kind, local.mode
        self.matvecs = 0
        nccl = dist.get_backend(group) == "nccl"
        self._wire = local.device if nccl else torch.device("cpu")
        count = self._reduce(torch.tensor([float(samples(local.evaluator.batches))]), dist.ReduceOp.SUM)
        dims = self._reduce(torch.tensor([float(self.dim), -float(self.dim)]), dist.ReduceOp.MAX)
        if int(count[0]) != total_samples or dims[0] != -dims[1]:
            raise ConfigError(f"the {self.world} ranks hold {int(count[0])} samples in all (expected {total_samples}) "
                              f"and {int(-dims[1])} to {int(dims[0])} parameters: every rank must pass the same "
                              "model and evaluator")

    def _reduce(self, t: torch.Tensor, op: Any) -> torch.Tensor:
        t = t.to(self._wire, torch.float64)
        dist.all_reduce(t, op=op, group=self.group)
        return t

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        """``C v`` over the whole data (one collective product, counted in ``matvecs``).

        Parameters
        ----------
        v : torch.Tensor
            Length ``size``; the same vector on every rank.

        Returns
        -------
        torch.Tensor
            The full-data product, identical on every rank.

        Raises
        ------
        ConfigError
            ``v`` does not have length ``size``.
        """
        out = self._reduce(self.local.matvec(v), dist.ReduceOp.SUM)
        self.matvecs += 1
        return out.to(self.device, self.dtype)

    __call__ = matvec

    def to_scipy(self) -> Any:
        """A ``scipy.sparse.linalg.LinearOperator`` (float64 in and out) of this operator.

        Returns
        -------
        scipy.sparse.linalg.LinearOperator
            See :func:`~.linear.scipy_view`.
        """
        return scipy_view(self)


def batch_block(n_batches: int, rank: int, world: int) -> tuple[int, int]:
    """The ``[start, stop)`` batches of ``rank``: contiguous blocks, sizes differing by at most one.

    Parameters
    ----------
    n_batches, rank, world : int
        Number of batches, this rank and the number of ranks.

    Returns
    -------
    tuple of int

    Raises
    ------
    ConfigError
        Fewer batches than ranks (a rank would have nothing to do).
    """
    if n_batches < world:
        raise ConfigError(f"the evaluator has {n_batches} batch(es), fewer than the {world} workers; give it a "
                          f"smaller batch_size (at least one batch per worker)")
    return rank * n_batches // world, (rank + 1) * n_batches // world


def distributed_operator(model: ModelLike | torch.Tensor, evaluator: PointEvaluator, *, kind: str = "hessian",
                         kind_options: KindOptions = None, params: Sequence[str] | str | None = None,
                         include_frozen: bool = False, hvp: str = "auto", group: Any = None,
                         point_ready: bool = False) -> DistributedOperator:
    r"""Build this rank's view of a curvature operator whose products are summed over a process group.

    Call it on every rank of an initialised group with the same model and evaluator: rank ``r``
    keeps its contiguous block of the evaluator's batches (:func:`batch_block`; a shallow copy of the
    evaluator that shares the rest, the loss's divisor ``N`` included) and computes
    ``sum_{b in block} (1/N) sum_{i in b} C_i v``; ``matvec`` all-reduces these (float64) into
    ``C v = (1/N) sum_r sum_{i in shard r} C_i v`` on every rank (Hessian products by Pearlmutter's
    R-operator, 1994). Pass it to any solver (``lanczos_top``, ``hutchinson``, ``slq``) on every rank.

    Parameters
    ----------
    model
        A model-like or a flat vector of the evaluator's space.
    evaluator
        The :class:`~landscape.Evaluator` of the whole data (the same on every rank).
    kind, kind_options, params, include_frozen, hvp
        As for :func:`~landscape.curvature.at_point.curvature_operator`; choices made from the data
        (``hvp="auto"``) are made on the whole data, so every rank computes each of its batches as
        one process does.
    group
        The process group (default: the default group).
    point_ready
        The flat vector already carries the buffers of the evaluator's BatchNorm mode.

    Returns
    -------
    DistributedOperator

    Raises
    ------
    ConfigError
        No process group, a kind that does not split over ranks (``kind="fisher"``), fewer batches
        than ranks, ranks holding different data, or as for ``curvature_operator``.
    """
    _require_group()
    options = check_kind(kind, kind_options, hvp=hvp)
    options = operator_class(kind).whole_data_options(evaluator, options)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    point = flat_point(model, evaluator)
    if not point_ready:
        point = with_bn_mode(point, point, evaluator)
    start, stop = batch_block(len(evaluator.batches), rank, world)
    shard = copy.copy(evaluator)  # shares everything, the loss's divisor N included, but the batches
    shard.batches = evaluator.batches[start:stop]
    local = curvature_operator(point, shard, kind=kind, kind_options=options, params=params,
                               include_frozen=include_frozen, point_ready=True)
    return DistributedOperator(local, samples(evaluator.batches), group=group)


def samples(batches: Sequence[tuple[Any, torch.Tensor]]) -> int:
    """The number of samples in ``(inputs, targets)`` batches (targets' first dimension).

    Parameters
    ----------
    batches : sequence of (inputs, targets)
        An evaluator's batches.

    Returns
    -------
    int
    """
    return sum(len(y) for _, y in batches)


def check_kind(kind: str, kind_options: KindOptions = None, *, hvp: str = "auto") -> dict[str, Any]:
    """Refuse what cannot be distributed exactly: an unknown kind or option, and a kind whose products do not split.

    Parameters
    ----------
    kind, kind_options, hvp
        As for :func:`distributed_operator`.

    Returns
    -------
    dict[str, Any]
        The kind's options, checked (defaults filled).

    Raises
    ------
    ConfigError
        An unknown kind or option, or a kind whose ``unshardable`` says why it cannot be split
        (``kind="fisher"``).
    """
    options = resolve_kind_options(kind, kind_options, hvp=hvp)
    refusal = operator_class(kind).unshardable
    if refusal:
        raise ConfigError(refusal)
    return options


def _require_group() -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError("no torch.distributed process group: call torch.distributed.init_process_group in every "
                          "process first, or let landscape.curvature.distributed_curvature(workers=...) start them")
