"""Averaging of model states.

FedAvg's sample-weighted mean and the general weighted mean (IMA Eq. 5 window mean, LSS
pool averages).
"""
from __future__ import annotations

from typing import Collection, Mapping, Sequence

import torch
from torch import Tensor

from landscape.infra.errors import ConfigError

from .contexts import ClientUpdate, State


def sample_weighted_average(global_state: State, updates: Mapping[int, ClientUpdate],
                            keep: Collection[str] = ()) -> State:
    """FedAvg: ``w = sum_k n_k / sum_j n_j * w_k`` over the participants' states.

    Parameters
    ----------
    global_state : State
        The model broadcast this round (key order, device, and the result when no
        participant holds samples).
    updates : Mapping[int, ClientUpdate]
        Client id -> update.
    keep : Collection[str]
        Entries copied from ``global_state`` instead of averaged (frozen parameters).

    Returns
    -------
    State
        The weighted mean; a copy of ``global_state`` when the participants hold no samples
        at all (possible with ``min_size=0`` partitions: the round carries no information).
    """
    ids = sorted(updates)
    counts = [updates[k].num_samples for k in ids]
    if ids and sum(counts) == 0:
        return {k: v.clone() for k, v in global_state.items()}
    return weighted_average([updates[k].state for k in ids], counts, like=global_state, keep=keep)


def weighted_average(states: Sequence[Mapping[str, Tensor]], weights: Sequence[float],
                     like: Mapping[str, Tensor] | None = None, keep: Collection[str] = ()) -> State:
    """``sum_i (w_i / sum_j w_j) * state_i`` for every entry (FedAvg, IMA Eq. 5 window mean).

    Parameters
    ----------
    states : Sequence[Mapping[str, Tensor]]
        The states to average.
    weights : Sequence[float]
        Non-negative weights with a positive sum, one per state.
    like : Mapping[str, Tensor], optional
        Gives the key order and device of the result (default: the first state).
    keep : Collection[str]
        Entries copied from ``like`` (a clone) instead of averaged.

    Returns
    -------
    State
        Floating-point entries accumulated in float64 in the order given and cast back to
        their dtype; integer entries (``num_batches_tracked``) as the rounded weighted mean.

    Raises
    ------
    ConfigError
        For no states, or weights that are negative, of another count, or sum to 0.
    """
    if not states:
        raise ConfigError("cannot average an empty list of models")
    w = torch.tensor([float(v) for v in weights], dtype=torch.float64)
    if len(w) != len(states) or (w < 0).any() or w.sum() <= 0:
        raise ConfigError(f"averaging weights must be non-negative with a positive sum, got {weights}")
    w = w / w.sum()
    ref = like if like is not None else states[0]
    out: State = {}
    for name, target in ref.items():
        if name in keep:
            out[name] = target.clone()
            continue
        acc = torch.zeros(target.shape, dtype=torch.float64, device=target.device)
        for wi, s in zip(w.tolist(), states):
            acc += wi * s[name].to(target.device, torch.float64)
        out[name] = acc.to(target.dtype) if torch.is_floating_point(target) else acc.round().to(target.dtype)
    return out
