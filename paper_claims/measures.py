"""Measures of stored FL runs: client-model barriers (the examples) and the data of a run (the claims too).

The barriers among a run's final-round client models (FedGuCci Eq. 4, pairwise, and Eq. 10,
the group) on three choices of evaluation data (:data:`~paper_claims.definitions.EVAL_SETS`),
the resolution of such a barrier (one sample's worth), and the tensors of a run's data sets.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

import landscape

from .definitions import EVAL_SETS, GLOBAL_TEST, OWN


def tensors(dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)`` of a ``TensorDataset`` (what ``fl.Run`` returns)."""
    if hasattr(dataset, "tensors"):
        x, y = dataset.tensors[:2]
        return x, y
    xs, ys = zip(*(dataset[i] for i in range(len(dataset))))
    return torch.stack(xs), torch.as_tensor(ys)


def average(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float] | None = None
            ) -> dict[str, torch.Tensor]:
    """Weighted (default uniform) average of state_dicts, entry by entry."""
    w = np.ones(len(states)) if weights is None else np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    return {k: sum(float(wi) * s[k].double() for wi, s in zip(w, states)).to(states[0][k].dtype)
            for k in states[0]}


def _final_clients(run: Any) -> tuple[list[Mapping[str, torch.Tensor]], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Final-round client models and their training data (clients without data left out)."""
    states, data = run.client_states(-1), run.client_datasets()
    keep = [k for k in sorted(states) if len(data[k])]
    return [states[k] for k in keep], [tensors(data[k]) for k in keep]


def _union(parts: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def pairwise_barrier_values(run: Any, eval_sets: Sequence[str] = EVAL_SETS, **options: Any
                            ) -> dict[str, np.ndarray]:
    """Accuracy barrier of every pair of final-round client models, per evaluation set.

    The barrier is FedGuCci Eq. 4: a supremum over 11 alphas with the endpoints included, so
    never negative. Evaluation sets: the global test set, the union of the clients' training
    data, or, for a pair (i, j), the union of D_i and D_j.

    Parameters
    ----------
    run : fl.Run
        A run stored with the last round's client models.
    eval_sets : sequence of str
        Members of :data:`EVAL_SETS`.
    **options
        Keyword arguments of every ``landscape.Evaluator`` (e.g. ``cache``).

    Returns
    -------
    dict
        Evaluation set -> barriers of the pairs (i, j), i < j, in the order (0, 1), (0, 2), ...
        of the clients with data (the same order for two runs of one partition).
    """
    states, data = _final_clients(run)
    out = {}
    for e in eval_sets:
        if e == OWN:
            vals = [landscape.interpolate(states[i], states[j], landscape.Evaluator(
                        run.module(), _union([data[i], data[j]]), progress=False, **options),
                        alphas=11).accuracy_barrier
                    for i in range(len(states)) for j in range(i + 1, len(states))]
        else:
            xy = tensors(run.test_dataset()) if e == GLOBAL_TEST else _union(data)
            ev = landscape.Evaluator(run.module(), xy, progress=False, **options)
            vals = list(landscape.barrier_matrix(states, ev, alphas=11).accuracy_barrier[
                np.triu_indices(len(states), k=1)])
        out[e] = np.asarray(vals, dtype=np.float64)
    return out


def barrier_resolution(run: Any) -> dict[str, float]:
    """The resolution of an accuracy barrier per evaluation set.

    One sample's share of the accuracy at the run's plateau, ``1 / (n * plateau)``, ``n``
    the size of the data (for a pair's own data, two clients' mean size).

    Parameters
    ----------
    run : fl.Run
        A finished run (its ``convergence().plateau`` is the accuracy).

    Returns
    -------
    dict
        Evaluation set (:data:`EVAL_SETS`) -> smallest barrier one sample can make.
    """
    sizes = [len(d) for d in run.client_datasets().values()]
    counts = (len(run.test_dataset()), sum(sizes), 2 * float(np.mean(sizes)))  # in the order of EVAL_SETS
    return {e: 1.0 / (n * max(run.convergence().plateau, 1e-3)) for e, n in zip(EVAL_SETS, counts)}


def group_barriers(run: Any, eval_sets: Sequence[str] = EVAL_SETS, **options: Any) -> dict[str, float]:
    """Group accuracy barrier of the final-round client models per evaluation set.

    FedGuCci Eq. 10 with the uniform centroid: ``1 - A(centroid) / mean_k A(w_k)``, a ratio
    that is negative when the centroid beats its members; on each client's own data it is ``1 -
    sum_k A_k(centroid) / sum_k A_k(w_k)``, ``A_k`` the accuracy on client k's training data.

    Parameters
    ----------
    run : fl.Run
        A run stored with the last round's client models.
    eval_sets : sequence of str
        Members of :data:`EVAL_SETS`.
    **options
        Keyword arguments of every ``landscape.Evaluator`` (e.g. ``cache``).

    Returns
    -------
    dict
        Evaluation set -> group accuracy barrier.
    """
    states, data = _final_clients(run)
    out = {}
    for e in eval_sets:
        if e == OWN:
            fused = average(states)
            accs = np.array([landscape.Evaluator(run.module(), xy, progress=False, **options)
                             .evaluate([fused, w]).accuracy for w, xy in zip(states, data)])
            out[e] = float(1.0 - accs[:, 0].sum() / accs[:, 1].sum())
        else:
            xy = tensors(run.test_dataset()) if e == GLOBAL_TEST else _union(data)
            ev = landscape.Evaluator(run.module(), xy, progress=False, **options)
            out[e] = float(landscape.group_barrier(states, ev).accuracy_barrier)
    return out
