"""Weight matching: the permutation of model B's units that best matches model A's weights.

Git Re-Basin (Ainsworth et al. 2023), section 3.2 and Algorithm 1: maximise
``sum_l <W_l^A, P_l W_l^B P_{l-1}^T>`` over the permutations ``P`` by coordinate descent. For
one group ``l`` with the others held fixed the objective is linear in ``P_l``, a linear
assignment problem solved exactly (``scipy.optimize.linear_sum_assignment``); groups are
visited in a random order each sweep until a sweep improves nothing. GroupNorm groups are
solved block by block (permutations stay inside the normalisation groups).
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from scipy.optimize import linear_sum_assignment
from torch import nn

from .graph import Group, PermutationSpec
from .matchers import MATCHERS, Matcher
from .permute import identity_permutations, members_by_tensor, permute_member, unit_view


def assignment(cost: torch.Tensor, block: int = 0) -> torch.Tensor:
    """The permutation ``perm`` maximising ``sum_i cost[i, perm[i]]`` (a linear assignment).

    Parameters
    ----------
    cost : torch.Tensor
        (n, n) gain of pairing A's unit ``i`` with B's unit ``j``.
    block : int
        If > 0, solve within diagonal blocks of ``block`` units (GroupNorm groups); 0: whole matrix.

    Returns
    -------
    torch.Tensor
        (n,) long permutation; B's unit ``perm[i]`` is matched to A's unit ``i``.
    """
    n = cost.shape[0]
    size = block or n
    perm = torch.empty(n, dtype=torch.long)
    c = cost.double().cpu().numpy()
    for start in range(0, n, size):
        sub = c[start:start + size, start:start + size]
        rows, cols = linear_sum_assignment(sub, maximize=True)
        perm[start + rows] = torch.from_numpy(cols + start).long()
    return perm


def group_cost(gi: int, group: Group, a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor],
               by_tensor: dict, perms: list[torch.Tensor]) -> torch.Tensor:
    """``C[i, j] = sum over the group's tensors of <A unit i, B unit j>`` (Ainsworth et al. 2023, Alg. 1).

    B's units of the other groups are permuted by the current permutations: this is the linear
    term of Algorithm 1 for group ``gi``.

    Parameters
    ----------
    gi : int
        Index of the group in the spec.
    group : Group
        The group whose cost matrix is built.
    a, b : Mapping[str, torch.Tensor]
        Tensors (name -> tensor) of the reference and of the model to permute; names absent
        from ``a`` (buffers) are skipped.
    by_tensor : dict
        Tensor name -> ``(group index, member)`` pairs, from :func:`~.permute.members_by_tensor`.
    perms : list[torch.Tensor]
        Current permutation of every group.

    Returns
    -------
    torch.Tensor
        (size, size) float64 cost matrix.
    """
    cost = torch.zeros(group.size, group.size, dtype=torch.float64)
    for m in group.members:
        if m.name not in a:
            continue  # a buffer: moves with the units, takes no part in the objective
        tb = b[m.name]
        for gj, other in by_tensor[m.name]:
            if other is not m:
                tb = permute_member(tb, other, perms[gj])
        ua = unit_view(a[m.name], m)[:, m.start:m.start + m.size].transpose(0, 1).reshape(m.size, -1)
        ub = unit_view(tb, m)[:, m.start:m.start + m.size].transpose(0, 1).reshape(m.size, -1)
        cost += ua.double() @ ub.double().T
    return cost


def weight_matching(spec: PermutationSpec, a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], *,
                    max_sweeps: int = 100, seed: int = 0, init: list[torch.Tensor] | None = None
                    ) -> tuple[list[torch.Tensor], dict]:
    """Permutations of ``b``'s units that maximise its inner product with ``a`` (Algorithm 1).

    Parameters
    ----------
    spec : PermutationSpec
        Permutation groups of the architecture.
    a, b : Mapping[str, torch.Tensor]
        Parameters (name -> tensor) of the reference and of the model to permute; only these
        enter the objective (buffers such as running statistics move along but do not vote).
    max_sweeps : int
        Bound on the coordinate-descent sweeps.
    seed : int
        Order in which groups are visited (its own ``torch.Generator``).
    init : list of torch.Tensor, optional
        Starting permutations (identity by default).

    Returns
    -------
    (perms, info)
        One permutation per group, and ``{"sweeps": int, "objective": float,
        "objective_before": float}`` with the objective ``sum <A, P(B)>`` before and after.
    """
    gen = torch.Generator().manual_seed(seed)
    perms = list(init) if init is not None else identity_permutations(spec)
    by_tensor = members_by_tensor(spec)
    a = {k: v.detach().double().cpu() for k, v in a.items()}
    b = {k: v.detach().double().cpu() for k, v in b.items()}
    before = _objective(spec, a, b, by_tensor, perms)
    sweeps = 0
    for sweeps in range(1, max_sweeps + 1):
        improved = False
        for gi in torch.randperm(len(spec.groups), generator=gen).tolist():
            group = spec.groups[gi]
            cost = group_cost(gi, group, a, b, by_tensor, perms)
            new = assignment(cost, group.block)
            if torch.equal(new, perms[gi]):
                continue
            # the linear term is exact unless the group sits on two axes of one tensor (a residual
            # layer's square weight): accept only a step that raises the true objective
            names = {m.name for m in group.members}
            trial = perms[:gi] + [new] + perms[gi + 1:]
            old_value = _objective(spec, a, b, by_tensor, perms, names)
            new_value = _objective(spec, a, b, by_tensor, trial, names)
            if new_value > old_value + 1e-12 * max(1.0, abs(old_value)):
                perms[gi], improved = new, True
        if not improved:
            break
    return perms, {"sweeps": sweeps, "objective_before": before,
                   "objective": _objective(spec, a, b, by_tensor, perms)}


def _objective(spec: PermutationSpec, a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor],
               by_tensor: dict, perms: list[torch.Tensor], names: set[str] | None = None) -> float:
    """``sum <A, P(B)>`` over the parameters (those in ``names`` only, if given)."""
    total = 0.0
    for name, mems in by_tensor.items():
        if name not in a or (names is not None and name not in names):
            continue
        tb = b[name]
        for gj, m in mems:
            tb = permute_member(tb, m, perms[gj])
        total += float((a[name] * tb).sum())
    return total


__all__ = ["assignment", "weight_matching"]


def match_weights(spec: PermutationSpec, reference: nn.Module, model: nn.Module, *, seed: int = 0,
                  max_sweeps: int = 100, **unused: Any) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """:func:`weight_matching` on the trainable tensors of two modules (the ``"weight"`` method).

    Parameters
    ----------
    spec : PermutationSpec
        The permutation groups.
    reference, model : nn.Module
        The model aligned to, and the model whose units are permuted.
    seed, max_sweeps : int
        As :func:`weight_matching`.
    **unused
        The options of other methods (``data``, ``samples``).

    Returns
    -------
    tuple
        The permutations and the search's numbers.
    """
    params = {n for n, _ in reference.named_parameters()}
    a = {k: v for k, v in reference.state_dict().items() if k in params}
    b = {k: v for k, v in model.state_dict().items() if k in params}
    return weight_matching(spec, a, b, max_sweeps=max_sweeps, seed=seed)


MATCHERS.add("weight", Matcher(match_weights))
