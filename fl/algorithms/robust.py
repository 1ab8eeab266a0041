"""Robust aggregation of client updates: median, trimmed mean, Krum, multi-Krum and norm clipping.

FedAvg's sample-weighted mean follows any single client as far as it likes: a client that sends
``w_k`` scaled by ``10^4`` and claims a huge sample count moves the average by as much. The rules
here bound what a minority of clients can do. Notation: ``w_1 .. w_n`` are the models of a
round's ``n`` clients and ``w`` the model the server sent.

* ``median`` (Yin et al. 2018, "Byzantine-robust distributed learning: towards optimal
  statistical rates", Def. 1): every coordinate ``i`` is ``med{w_1[i], .., w_n[i]}``; for an
  even ``n`` the mean of the two middle values (as ``numpy.median``).
* ``trimmed_mean`` (Yin et al. 2018, Def. 2): every coordinate is the mean of the values left
  once the ``b = floor(beta n)`` largest and the ``b`` smallest are removed, ``0 <= beta < 1/2``.
* ``krum`` (Blanchard et al. 2017, "Machine learning with adversaries: Byzantine tolerant
  gradient descent"): the score of update ``k`` is
  ``s(k) = sum_{j in N_k} ||w_k - w_j||_2^2`` over the ``n - f - 2`` updates ``N_k`` closest
  to it (``j != k``), with ``f`` the number of Byzantine clients assumed; Krum returns the
  update of lowest score. It needs ``n > 2f + 2``.
* ``multi_krum`` (Blanchard et al. 2017, the Multi-Krum variant): the plain mean of the ``m``
  updates of lowest score (default ``m = n - f``; ``m = 1`` is Krum, ``m = n`` the unweighted mean).
* clipping (Sun et al. 2019, "Can you really backdoor federated learning?", norm
  thresholding): before any rule, each update ``delta_k = w_k - w`` becomes
  ``delta_k * min(1, C / ||delta_k||_2)``, the norm taken over all entries aggregated robustly.

The robust rules are unweighted: a claimed sample count is exactly what an attacker inflates.
They act on the floating-point entries the run trains; integer entries (BatchNorm's
``num_batches_tracked``) take FedAvg's rounded sample-weighted mean and frozen entries keep the
sent values, exactly as :func:`~fl.algorithms.averaging.sample_weighted_average` does, which is
also the whole of the default rule ``mean``. A round whose clients hold no samples returns the
sent model under every rule.

:class:`Aggregator` is the configured rule of a run (``fl.run(aggregator=..., aggregator_options=...,
clip_norm=...)``); :meth:`fl.algorithms.base.Algorithm.combine` applies it, so every algorithm
that aggregates its client updates through ``combine`` (the default ``aggregate`` does) offers
every rule. The other functions are pure functions of lists of states.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Collection, Mapping, Sequence

import torch
from torch import Tensor

from landscape.infra.errors import ConfigError

from ..config import AggregatorOptions, check_aggregator, check_krum
from .averaging import sample_weighted_average, weighted_average
from .contexts import ClientUpdate, State

__all__ = ["Aggregator", "clip_update", "coordinate_median", "krum", "krum_scores", "multi_krum", "trimmed_mean"]


def coordinate_median(states: Sequence[Mapping[str, Tensor]]) -> State:
    """Coordinate-wise median (Yin et al. 2018, Def. 1).

    Parameters
    ----------
    states : Sequence[Mapping[str, Tensor]]
        The client models (floating-point entries of equal shapes).

    Returns
    -------
    State
        Every coordinate's median over the states, computed in float64 and cast back to each
        entry's dtype; for an even count the mean of the two middle values (``numpy.median``).

    Examples
    --------
    >>> coordinate_median([{"w": torch.tensor([1.0])}, {"w": torch.tensor([2.0])}, {"w": torch.tensor([100.0])}])
    {'w': tensor([2.])}
    >>> coordinate_median([{"w": torch.tensor([1.0])}, {"w": torch.tensor([2.0])}, {"w": torch.tensor([100.0])},
    ...                    {"w": torch.tensor([4.0])}])
    {'w': tensor([3.])}
    """
    n = len(_checked(states))

    def middle(x: Tensor) -> Tensor:
        return x[n // 2] if n % 2 else (x[n // 2 - 1] + x[n // 2]) / 2

    return _sorted_reduce(states, middle)


def trimmed_mean(states: Sequence[Mapping[str, Tensor]], trim: float) -> State:
    """Coordinate-wise trimmed mean (Yin et al. 2018, Def. 2).

    Parameters
    ----------
    states : Sequence[Mapping[str, Tensor]]
        The client models (floating-point entries of equal shapes).
    trim : float
        The share ``beta`` trimmed at each end, ``0 <= beta < 0.5``.

    Returns
    -------
    State
        Every coordinate's mean of its ``n - 2b`` middle values, ``b = floor(beta n)``
        (float64, cast back to each entry's dtype).

    Raises
    ------
    ConfigError
        For ``beta`` outside ``[0, 0.5)`` or no states.

    Examples
    --------
    >>> states = [{"w": torch.tensor([v])} for v in (1.0, 2.0, 3.0, 4.0, 100.0)]
    >>> trimmed_mean(states, 0.2)  # b = 1: the mean of 2, 3, 4
    {'w': tensor([3.])}
    """
    if not 0 <= trim < 0.5:
        raise ConfigError(f"the trimmed share beta must lie in [0, 0.5), got {trim}; trim less")
    n = len(_checked(states))
    b = math.floor(trim * n)
    return _sorted_reduce(states, lambda x: x[b:n - b].mean(dim=0))


def krum_scores(states: Sequence[Mapping[str, Tensor]], f: int) -> Tensor:
    """Krum's scores (Blanchard et al. 2017).

    Parameters
    ----------
    states : Sequence[Mapping[str, Tensor]]
        The client models; every entry given counts in the distances.
    f : int
        The number of Byzantine clients assumed.

    Returns
    -------
    Tensor
        Float64, one per state: ``s(k) = sum_{j in N_k} ||w_k - w_j||_2^2`` over the
        ``n - f - 2`` other states closest to state ``k``.

    Raises
    ------
    ConfigError
        When ``n <= 2f + 2``.

    Examples
    --------
    >>> states = [{"w": torch.tensor([v])} for v in (0.0, 1.0, 3.0, 10.0)]
    >>> krum_scores(states, 0)  # the 2 nearest: 0 -> {1, 3}, 1 -> {0, 3}, 3 -> {1, 0}, 10 -> {3, 1}
    tensor([ 10.,   5.,  13., 130.], dtype=torch.float64)
    """
    n = len(_checked(states))
    check_krum("krum", n, f)
    device = next(iter(states[0].values())).device if states[0] else torch.device("cpu")
    dist = torch.zeros(n, n, dtype=torch.float64, device=device)
    for name in states[0]:
        x = torch.stack([s[name].to(device, torch.float64).reshape(-1) for s in states])
        for i in range(n):
            dist[i] += ((x - x[i]) ** 2).sum(dim=1)
    dist.fill_diagonal_(math.inf)
    return dist.sort(dim=1).values[:, :n - f - 2].sum(dim=1).cpu()


def krum(states: Sequence[Mapping[str, Tensor]], f: int) -> State:
    """Krum (Blanchard et al. 2017): the state of lowest :func:`krum_scores`.

    Parameters
    ----------
    states : Sequence[Mapping[str, Tensor]]
        The client models.
    f : int
        The number of Byzantine clients assumed (``n > 2f + 2``).

    Returns
    -------
    State
        A copy of the chosen state (the first in the given order among equal scores).

    Examples
    --------
    >>> krum([{"w": torch.tensor([v])} for v in (0.0, 1.0, 3.0, 10.0)], 0)
    {'w': tensor([1.])}
    """
    best = _lowest(krum_scores(states, f), 1)[0]
    return {name: t.clone() for name, t in states[best].items()}


def multi_krum(states: Sequence[Mapping[str, Tensor]], f: int, m: int | None = None) -> State:
    """Multi-Krum (Blanchard et al. 2017): the mean of the ``m`` states of lowest score.

    Parameters
    ----------
    states : Sequence[Mapping[str, Tensor]]
        The client models.
    f : int
        The number of Byzantine clients assumed (``n > 2f + 2``).
    m : int, optional
        How many states are averaged, ``1 <= m <= n`` (default ``n - f``).

    Returns
    -------
    State
        Their unweighted mean, accumulated in float64 in the order of increasing score.

    Raises
    ------
    ConfigError
        When ``n <= 2f + 2`` or ``m`` lies outside ``[1, n]``.

    Examples
    --------
    >>> multi_krum([{"w": torch.tensor([v])} for v in (0.0, 1.0, 3.0, 10.0)], 0, m=2)  # scores 10, 5, 13, 130
    {'w': tensor([0.5000])}
    """
    m = len(_checked(states)) - f if m is None else m
    check_krum("multi_krum", len(states), f, m)
    scores = krum_scores(states, f)
    chosen = [states[i] for i in _lowest(scores, m)]
    return weighted_average(chosen, [1.0] * m)


def clip_update(state: Mapping[str, Tensor], sent: Mapping[str, Tensor], clip_norm: float,
                names: Collection[str] | None = None) -> State:
    """Norm clipping of one client update (Sun et al. 2019): ``w + delta * min(1, C / ||delta||_2)``.

    Parameters
    ----------
    state : Mapping[str, Tensor]
        The client's model ``w_k``.
    sent : Mapping[str, Tensor]
        The model ``w`` the server sent; ``delta = w_k - w``.
    clip_norm : float
        The bound ``C > 0`` on the update's L2 norm.
    names : Collection[str], optional
        The entries that form the update and are clipped (default: every floating-point
        entry of ``state``); the others are returned unchanged.

    Returns
    -------
    State
        ``state`` itself (a shallow copy) when ``||delta||_2 <= C``, else ``w + delta C / ||delta||_2``
        computed in float64 and cast back to each entry's dtype.

    Raises
    ------
    ConfigError
        For ``C <= 0`` or a non-finite ``C``.

    Examples
    --------
    >>> sent = {"w": torch.zeros(2, dtype=torch.float64)}
    >>> clip_update({"w": torch.tensor([6.0, 8.0], dtype=torch.float64)}, sent, 5.0)  # norm 10 -> 5
    {'w': tensor([3., 4.], dtype=torch.float64)}
    >>> clip_update({"w": torch.tensor([0.6, 0.8], dtype=torch.float64)}, sent, 5.0)  # norm 1: unchanged
    {'w': tensor([0.6000, 0.8000], dtype=torch.float64)}
    """
    if not (math.isfinite(clip_norm) and clip_norm > 0):
        raise ConfigError(f"clip_norm must be a positive number, got {clip_norm}; give C > 0 or None for no clipping")
    keys = [n for n in (state if names is None else names) if torch.is_floating_point(state[n])]
    deltas = {n: state[n].to(torch.float64) - sent[n].to(state[n].device, torch.float64) for n in keys}
    norm = math.sqrt(sum(float((d ** 2).sum()) for d in deltas.values()))
    out = dict(state)
    if norm <= clip_norm:
        return out
    scale = clip_norm / norm
    for n, d in deltas.items():
        out[n] = (sent[n].to(d.device, torch.float64) + scale * d).to(state[n].dtype)
    return out


@dataclasses.dataclass(frozen=True)
class Aggregator:
    """A run's aggregation of client updates: optional clipping, then one rule.

    Parameters
    ----------
    rule : str
        ``"mean"`` (FedAvg), ``"median"``, ``"trimmed_mean"``, ``"krum"`` or ``"multi_krum"``.
    options : AggregatorOptions
        ``trim``, ``f``, ``m`` (those of the rule; :class:`fl.config.AggregatorOptions`).
    clip_norm : float or None
        The clipping bound ``C`` (None: off).

    Examples
    --------
    >>> from fl.algorithms.contexts import ClientUpdate
    >>> sent = {"w": torch.zeros(1)}
    >>> updates = {k: ClientUpdate({"w": torch.tensor([v])}, 10) for k, v in enumerate((1.0, 2.0, 1e4))}
    >>> Aggregator.from_config({"aggregator": "median"})(sent, updates)
    {'w': tensor([2.])}
    """

    rule: str = "mean"
    options: AggregatorOptions = dataclasses.field(default_factory=AggregatorOptions)
    clip_norm: float | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "Aggregator":
        """The aggregator a run configuration names (defaults for the keys it lacks).

        Parameters
        ----------
        config : Mapping[str, Any]
            A run configuration (``aggregator``, ``aggregator_options``, ``clip_norm``).

        Returns
        -------
        Aggregator
            The validated aggregator.

        Raises
        ------
        ConfigError
            For an unknown rule or option (:func:`fl.config.check_aggregator`).
        """
        rule = config.get("aggregator", "mean")
        return cls(rule, check_aggregator(rule, config.get("aggregator_options") or {}), config.get("clip_norm"))

    def clip(self, sent: State, updates: Mapping[int, ClientUpdate], keep: Collection[str] = ()
             ) -> dict[int, ClientUpdate]:
        """The updates with their models clipped (:func:`clip_update`; unchanged without ``clip_norm``).

        Parameters
        ----------
        sent : State
            The model broadcast this round.
        updates : Mapping[int, ClientUpdate]
            Client id -> update.
        keep : Collection[str]
            Frozen entries (neither clipped nor counted in the norm).

        Returns
        -------
        dict[int, ClientUpdate]
            Client id -> update (the same objects when nothing is clipped).
        """
        if self.clip_norm is None:
            return dict(updates)
        names = _entries(sent, keep)
        return {k: dataclasses.replace(u, state=clip_update(u.state, sent, self.clip_norm, names))
                for k, u in updates.items()}

    def __call__(self, sent: State, updates: Mapping[int, ClientUpdate], keep: Collection[str] = ()) -> State:
        """The new global model from the round's client updates.

        Parameters
        ----------
        sent : State
            The model broadcast this round (key order, device, dtypes).
        updates : Mapping[int, ClientUpdate]
            Client id -> update.
        keep : Collection[str]
            Frozen entries, copied from ``sent``.

        Returns
        -------
        State
            ``mean``: :func:`~fl.algorithms.averaging.sample_weighted_average` of the (clipped)
            updates, bit for bit that function's result without clipping; a robust rule: the
            rule over the floating entries of the updates in client-id order, the other entries
            as ``mean``.
        """
        updates = self.clip(sent, updates, keep)
        if self.rule == "mean":
            return sample_weighted_average(sent, updates, keep=keep)
        ids = sorted(updates)
        names = _entries(sent, keep)
        if ids and sum(updates[k].num_samples for k in ids) == 0:
            return sample_weighted_average(sent, updates, keep=keep)  # no information: the sent model
        out = sample_weighted_average(sent, updates, keep={*keep, *names})
        states = [{n: updates[k].state[n] for n in names} for k in ids]
        robust = self._robust(states)
        out.update({n: robust[n].to(sent[n].device) for n in names})
        return out

    def _robust(self, states: Sequence[Mapping[str, Tensor]]) -> State:
        """The configured robust rule applied to the list of client states."""
        o = self.options
        rules = {"median": lambda: coordinate_median(states), "trimmed_mean": lambda: trimmed_mean(states, o.trim),
                 "krum": lambda: krum(states, o.f), "multi_krum": lambda: multi_krum(states, o.f, o.m)}
        if self.rule not in rules:
            raise ConfigError(f"unknown aggregator {self.rule!r}; valid: mean, {', '.join(rules)}")
        return rules[self.rule]()


def _entries(sent: Mapping[str, Tensor], keep: Collection[str]) -> list[str]:
    """The entries the robust rules and clipping act on: the floating-point ones not in ``keep``."""
    return [n for n, t in sent.items() if n not in keep and torch.is_floating_point(t)]


def _checked(states: Sequence[Mapping[str, Tensor]]) -> Sequence[Mapping[str, Tensor]]:
    """``states``, refused when empty."""
    if not states:
        raise ConfigError("cannot aggregate an empty list of models; a round needs at least one client update")
    return states


def _sorted_reduce(states: Sequence[Mapping[str, Tensor]], reduce: Any) -> State:
    """``reduce(values sorted along the clients)`` for every entry, in float64, cast back."""
    _checked(states)
    out: State = {}
    for name, ref in states[0].items():
        x = torch.stack([s[name].to(ref.device, torch.float64) for s in states]).sort(dim=0).values
        out[name] = reduce(x).to(ref.dtype)
    return out


def _lowest(scores: Tensor, m: int) -> list[int]:
    """Indices of the ``m`` lowest scores, lowest first (ties: the earlier index)."""
    return sorted(range(len(scores)), key=lambda i: (float(scores[i]), i))[:m]
