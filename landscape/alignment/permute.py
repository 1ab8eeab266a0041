"""Apply permutations of hidden units to a state_dict.

A permutation of a group is a ``LongTensor`` ``perm`` of the group's size: unit ``i`` of the
permuted model is unit ``perm[i]`` of the original, in every tensor that holds the group
(Git Re-Basin, Eq. 1: ``W'_l = P_l W_l P_{l-1}^T``, biases and normalisation parameters
permuted with their units).
"""
from __future__ import annotations

import copy
from typing import Mapping, Sequence

import torch
from torch import nn

from ..infra.errors import ConfigError
from .graph import Group, Member, PermutationSpec

Permutations = Sequence[torch.Tensor]


def unit_view(tensor: torch.Tensor, m: Member) -> torch.Tensor:
    """``tensor`` with the member's axis viewed as (outer, units, inner) and moved to the front.

    Parameters
    ----------
    tensor : torch.Tensor
        A tensor holding the member's units.
    m : Member
        Where the units sit in it.

    Returns
    -------
    torch.Tensor
        A view (or reshaped copy) of shape (outer, units, inner, rest).
    """
    moved = tensor.movedim(m.axis, 0)
    return moved.reshape(m.outer, m.units, m.inner, -1)


def permute_member(tensor: torch.Tensor, m: Member, perm: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` with the member's units reordered by ``perm`` (Git Re-Basin Eq. 1).

    Parameters
    ----------
    tensor : torch.Tensor
        A tensor holding the member's units (not modified).
    m : Member
        Where the units sit in it.
    perm : torch.Tensor
        (m.size,) permutation: new unit ``i`` is old unit ``perm[i]``.

    Returns
    -------
    torch.Tensor
        The permuted copy, of the same shape.
    """
    moved = tensor.movedim(m.axis, 0)
    view = moved.reshape(m.outer, m.units, m.inner, -1).clone()
    view[:, m.start:m.start + m.size] = view[:, m.start:m.start + m.size][:, perm]
    return view.reshape(moved.shape).movedim(0, m.axis)


def members_by_tensor(spec: PermutationSpec) -> dict[str, list[tuple[int, Member]]]:
    """For every tensor name, its (group index, member) pairs.

    Parameters
    ----------
    spec : PermutationSpec
        Permutation groups of the architecture.

    Returns
    -------
    dict[str, list[tuple[int, Member]]]
        Tensor name -> the group positions it holds, in group order.
    """
    out: dict[str, list[tuple[int, Member]]] = {}
    for gi, group in enumerate(spec.groups):
        for m in group.members:
            out.setdefault(m.name, []).append((gi, m))
    return out


def check_permutations(spec: PermutationSpec, perms: Permutations) -> None:
    """Check that ``perms`` holds one valid permutation per group of ``spec``.

    Parameters
    ----------
    spec : PermutationSpec
        Permutation groups of the architecture.
    perms : Sequence[torch.Tensor]
        One permutation per group.

    Raises
    ------
    ConfigError
        If the count is wrong, a tensor is not a permutation of its group's size, or it moves
        units across GroupNorm blocks.
    """
    if len(perms) != len(spec.groups):
        raise ConfigError(f"{len(perms)} permutations for {len(spec.groups)} groups")
    for i, (g, p) in enumerate(zip(spec.groups, perms)):
        if p.shape != (g.size,) or not torch.equal(torch.sort(p).values, torch.arange(g.size)):
            raise ConfigError(f"permutation {i} is not a permutation of {g.size} units")
        if g.block and not torch.equal(p // g.block, torch.arange(g.size) // g.block):
            raise ConfigError(f"permutation {i} moves units across GroupNorm blocks of {g.block}")


def permute_state(state: Mapping[str, torch.Tensor], spec: PermutationSpec, perms: Permutations
                  ) -> dict[str, torch.Tensor]:
    """A new state_dict with every group's units reordered (Git Re-Basin Eq. 1).

    Parameters
    ----------
    state : Mapping[str, torch.Tensor]
        The state_dict to permute (not modified).
    spec : PermutationSpec
        Its permutation groups.
    perms : Sequence[torch.Tensor]
        One permutation per group.

    Returns
    -------
    dict[str, torch.Tensor]
        Permuted copies of the tensors (those not in any group are copied unchanged).

    Raises
    ------
    ConfigError
        If ``perms`` is invalid (:func:`check_permutations`) or ``state`` lacks a tensor of ``spec``.
    """
    check_permutations(spec, perms)
    out = {k: v.detach().clone() for k, v in state.items()}
    for name, mems in members_by_tensor(spec).items():
        if name not in out:
            raise ConfigError(f"the state_dict has no entry {name!r} of the permutation spec")
        t = out[name]
        for gi, m in mems:
            t = permute_member(t, m, perms[gi].to(t.device))
        out[name] = t
    return out


def apply_permutation(model: nn.Module, spec: PermutationSpec, perms: Permutations) -> nn.Module:
    """A functionally identical copy of ``model`` with its hidden units permuted.

    Parameters
    ----------
    model : torch.nn.Module
        The model (not modified).
    spec : PermutationSpec
        Its permutation groups (:func:`~.graph.discover`).
    perms : Permutations
        One permutation per group.

    Returns
    -------
    nn.Module
        A deep copy whose state is :func:`permute_state` of the model's.
    """
    out = copy.deepcopy(model)
    out.load_state_dict(with_aliases(model, permute_state(model.state_dict(), spec, perms)))
    return out


def with_aliases(model: nn.Module, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with every alias of a tied tensor (a language model's output layer) set to its first name's value.

    Parameters
    ----------
    model : torch.nn.Module
        The model whose tied tensors are looked up.
    state : Mapping[str, torch.Tensor]
        A state_dict of it in which only the first name of a tied tensor may have changed.

    Returns
    -------
    dict[str, torch.Tensor]
        A copy that loads consistently with ``load_state_dict`` (tied tensors receive one value).
    """
    first: dict[int, str] = {}
    out = dict(state)
    for name, tensor in model.state_dict(keep_vars=True).items():
        out[name] = out[first.setdefault(id(tensor), name)]
    return out


def identity_permutations(spec: PermutationSpec) -> list[torch.Tensor]:
    """The identity permutation of every group.

    Parameters
    ----------
    spec : PermutationSpec
        Permutation groups of the architecture.

    Returns
    -------
    list[torch.Tensor]
        ``arange(size)`` per group.
    """
    return [torch.arange(g.size) for g in spec.groups]


def random_permutations(spec: PermutationSpec, seed: int = 0) -> list[torch.Tensor]:
    """Uniformly random permutations of every group (within GroupNorm blocks).

    Parameters
    ----------
    spec : PermutationSpec
        Permutation groups of the architecture.
    seed : int
        Seed of the permutations' own ``torch.Generator``.

    Returns
    -------
    list[torch.Tensor]
        One permutation per group.
    """
    gen = torch.Generator().manual_seed(seed)
    return [_random(g, gen) for g in spec.groups]


def _random(group: Group, gen: torch.Generator) -> torch.Tensor:
    block = group.block or group.size
    parts = [torch.randperm(block, generator=gen) + start for start in range(0, group.size, block)]
    return torch.cat(parts)


def invert(perms: Permutations) -> list[torch.Tensor]:
    """The inverse permutations: ``permute_state(permute_state(s, p), invert(p)) == s``.

    Parameters
    ----------
    perms : Sequence[torch.Tensor]
        Permutations to invert.

    Returns
    -------
    list[torch.Tensor]
        ``argsort(p)`` of each.
    """
    return [torch.argsort(p) for p in perms]
