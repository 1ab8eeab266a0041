"""Measuring the landscape at tracked rounds (:class:`Tracker`), for ``fl.run(..., track=...)``.

The measures are those of :class:`fl.tracking.Track`, computed by the analysis core's own
functions (:func:`landscape.interpolate`, :func:`landscape.group_barrier`,
:func:`landscape.hessian_eigenvalues`, :func:`landscape.hessian_trace`,
:func:`landscape.sharpness`) on the run's stored models (the plain architecture, as
``global/`` and ``clients/`` hold them) with one :class:`landscape.Evaluator` on the fixed
evaluation set. The core is imported on the first tracked round, so ``import fl`` stays light.
The evaluator's strategy is fixed by the device (``loop`` on CPU, ``vmap`` on GPU), so a run and
its resumed copy compute every measure the same way.
"""
from __future__ import annotations

import math
import time
import warnings
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from .store import RunStore
from .tracking import MEASURES, PREFIX, Track, evaluation_indices

State = dict[str, Tensor]


class Tracker:
    """Computes the tracked measures of a run at its tracked rounds.

    Parameters
    ----------
    track : Mapping[str, Any]
        The run's ``track`` settings (:class:`fl.tracking.Track` fields).
    rounds : int
        The run's last round.
    template : nn.Module
        The plain architecture (the module of the stored checkpoints).
    frozen : Sequence[str]
        Parameters the run does not train (missing from client checkpoints; the global model's).
    train_x, train_y : Tensor
        The training set.
    client_train : Sequence[np.ndarray]
        Each client's training indices (the evaluation set is drawn from them).
    device : torch.device
        Where the measures are computed.
    store : RunStore
        The run folder (the previous round's global model is read from it for the spread).
    """

    def __init__(self, track: Mapping[str, Any], rounds: int, template: nn.Module, frozen: Sequence[str],
                 train_x: Tensor, train_y: Tensor, client_train: Sequence[np.ndarray], device: torch.device,
                 store: RunStore):
        self.track = Track.from_mapping(track, owner="track option ")
        self.rounds = int(rounds)
        self.template = template
        self.frozen = set(frozen)
        self.samples = evaluation_indices(client_train, self.track.samples, self.track.seed)
        index = torch.as_tensor(self.samples, device=train_x.device)
        self.data = (train_x[index], train_y[index])
        self.device = device
        self.store = store
        self.trainable = [n for n, p in template.named_parameters() if n not in self.frozen]
        self._evaluator: Any = None

    def due(self, round: int) -> bool:
        """Whether ``round`` is tracked (:meth:`fl.tracking.Track.due`)."""
        return self.track.due(round, self.rounds)

    @property
    def evaluator(self) -> Any:
        """The :class:`landscape.Evaluator` on the evaluation set (built on first use)."""
        if self._evaluator is None:
            from landscape.evaluation.evaluator import Evaluator

            strategy = "loop" if self.device.type == "cpu" else "vmap"
            self._evaluator = Evaluator(self.template, self.data, device=self.device, progress=False,
                                        strategy=strategy)
        return self._evaluator

    def record(self, round: int, global_state: Mapping[str, Tensor], clients: Mapping[int, Mapping[str, Tensor]]
               ) -> dict[str, Any]:
        """The ``track_*`` fields of round ``round``'s metrics record (empty when the round is not tracked).

        Parameters
        ----------
        round : int
            The round.
        global_state : Mapping[str, Tensor]
            Its global model, plain architecture (as stored in ``global/``).
        clients : Mapping[int, Mapping[str, Tensor]]
            The models of the clients aggregated in the round, in the record's ``clients`` order
            (as stored in ``clients/``: frozen parameters may be left out).

        Returns
        -------
        dict[str, Any]
            Measure -> finite float or None (clients' lists follow ``clients``); round 0 also
            ``track_samples``, the evaluation set's indices.
        """
        if not self.due(round):
            return {}
        start = time.perf_counter()
        chosen = set(self.track.measures)
        full = {k: {n: s[n] if n in s else global_state[n] for n in global_state} for k, s in clients.items()}
        out: dict[str, Any] = {}
        with warnings.catch_warnings():  # small probe budgets: unconverged estimates are expected
            warnings.simplefilter("ignore")
            for name in MEASURES:
                if name in chosen:
                    out.update(getattr(self, f"_{name}")(round, global_state, full))
        out = {PREFIX + k: _finite(v) for k, v in out.items()}
        out[PREFIX + "time"] = time.perf_counter() - start
        if round == 0:
            out[PREFIX + "samples"] = [int(i) for i in self.samples]
        return out

    # ----------------------------------------------------------------- measures
    def _barriers(self, round: int, global_state: State, clients: dict[int, State]) -> dict[str, Any]:
        from landscape.geometry.paths import interpolate

        paths = [interpolate(s, global_state, self.evaluator, alphas=self.track.points) for s in clients.values()]
        return {"client_barriers": [p.loss_barrier for p in paths] if clients else None,
                "client_accuracy_barriers": [p.accuracy_barrier for p in paths] if clients else None}

    def _group_barrier(self, round: int, global_state: State, clients: dict[int, State]) -> dict[str, Any]:
        if len(clients) < 2:
            return {}
        from landscape.geometry.groups import group_barrier

        group = group_barrier(list(clients.values()), self.evaluator)
        return {"group_barrier": group.loss_barrier, "group_accuracy_barrier": group.accuracy_barrier}

    def _eigenvalue(self, round: int, global_state: State, clients: dict[int, State]) -> dict[str, Any]:
        from landscape.curvature.functions import hessian_eigenvalues

        values = hessian_eigenvalues(global_state, self.evaluator, k=1, max_iter=self.track.iterations,
                                     seed=self.track.seed)
        return {"top_eigenvalue": float(values[0])}

    def _trace(self, round: int, global_state: State, clients: dict[int, State]) -> dict[str, Any]:
        from landscape.curvature.functions import hessian_trace

        probes = self.track.probes
        estimate = hessian_trace(global_state, self.evaluator, method="hutchinson", max_iter=probes,
                                 min_samples=probes, seed=self.track.seed)
        return {"trace": estimate.value, "trace_stderr": estimate.stderr}

    def _sharpness(self, round: int, global_state: State, clients: dict[int, State]) -> dict[str, Any]:
        from landscape.curvature.sharpness import sharpness

        result = sharpness(global_state, self.evaluator, rho=self.track.rho, kind="l2", steps=self.track.steps,
                           restarts=1, seed=self.track.seed, bound=False)
        return {"sharpness": result.value}

    def _spread(self, round: int, global_state: State, clients: dict[int, State]) -> dict[str, Any]:
        if not clients:
            return {}
        previous = self.store.read_state(self.store.global_path(round - 1))
        return update_spread([s for s in clients.values()], previous, self.trainable)


def update_spread(clients: Sequence[Mapping[str, Tensor]], previous: Mapping[str, Tensor],
                  names: Sequence[str]) -> dict[str, float | None]:
    """How far client updates spread: mean distance to their mean, mean pairwise cosine.

    With ``d_k`` the flattened difference ``w_k - w_prev`` over the parameters ``names`` (in
    float64), ``update_distance = (1/K) sum_k ||d_k - mean(d)||_2`` and ``update_cosine`` the mean
    of ``cos(d_k, d_l)`` over the pairs ``k < l``.

    Parameters
    ----------
    clients : Sequence[Mapping[str, Tensor]]
        The clients' models.
    previous : Mapping[str, Tensor]
        The model they started from (the previous round's global model).
    names : Sequence[str]
        The parameters compared (the trainable ones).

    Returns
    -------
    dict[str, float or None]
        ``update_distance`` and ``update_cosine`` (None with one client or a zero update).
    """
    deltas = torch.stack([torch.cat([(s[n].detach().cpu().double() - previous[n].detach().cpu().double()).reshape(-1)
                                     for n in names]) for s in clients])
    distance = float((deltas - deltas.mean(0)).norm(dim=1).mean())
    norms = deltas.norm(dim=1)
    if len(clients) < 2 or bool((norms == 0).any()):
        return {"update_distance": distance, "update_cosine": None}
    unit = deltas / norms[:, None]
    cosines = unit @ unit.T
    k = len(clients)
    pairs = cosines[torch.triu_indices(k, k, offset=1).unbind()]
    return {"update_distance": distance, "update_cosine": float(pairs.mean())}


def _finite(value: Any) -> Any:
    """``value`` with non-finite numbers (also inside lists) replaced by None: a missing measure."""
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if value is None or not math.isfinite(float(value)):
        return None
    return float(value)


def tracker_for(config: Mapping[str, Any], template: nn.Module, train_x: Tensor, train_y: Tensor,
                client_train: Sequence[Any], device: torch.device, store: RunStore) -> Tracker | None:
    """The tracker of a run configuration, or None when the run is not tracked.

    Parameters
    ----------
    config : Mapping[str, Any]
        The stored configuration (``track``, ``rounds``, ``frozen``).
    template : nn.Module
        The plain architecture.
    train_x, train_y : Tensor
        The training set.
    client_train : Sequence
        Each client's training indices (arrays or index tensors).
    device : torch.device
        Where to measure.
    store : RunStore
        The run folder.

    Returns
    -------
    Tracker or None
        The tracker.
    """
    if not config.get("track"):
        return None
    parts = [np.asarray(p.cpu() if isinstance(p, Tensor) else p, dtype=np.int64) for p in client_train]
    return Tracker(config["track"], int(config["rounds"]), template, config.get("frozen") or [], train_x, train_y,
                   parts, device, store)
