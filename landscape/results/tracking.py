"""The landscape measures a federated run tracked during training, one row per tracked round.

Registered, so it round-trips through the HDF5 cache. The measures and their definitions are
those of ``fl.Track`` (FedGuCci Eq. 3/4 and 9/10 for the barriers, Lanczos and Hutchinson for the
curvature, SAM's L2 sharpness); a measure not recorded at a round is NaN.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .base import Result, register

#: Per-round scalar columns, in table order (besides ``round``).
SCALAR_COLUMNS = ("mean_client_barrier", "max_client_barrier", "mean_client_accuracy_barrier", "group_barrier",
                  "group_accuracy_barrier", "top_eigenvalue", "trace", "trace_stderr", "sharpness",
                  "update_distance", "update_cosine", "time")


@register
@dataclass(frozen=True, eq=False)
class TrackTable(Result):
    """Landscape measures of a federated run at its tracked rounds (``fl.Run.track()``).

    Column access: ``table["trace"]`` (any name of :attr:`columns`, or an attribute below),
    ``table.columns``, ``len(table)``; :meth:`to_pandas` for a DataFrame (needs pandas).

    Attributes
    ----------
    rounds : np.ndarray
        ``(R,)`` the tracked rounds, ascending.
    client_barrier : np.ndarray
        ``(R, K)`` loss barrier of each client's model to the global model on the straight line
        between them (FedGuCci Eq. 3); NaN for clients not trained in that round and at round 0.
    client_accuracy_barrier : np.ndarray
        ``(R, K)`` the same for the accuracy barrier (FedGuCci Eq. 4).
    group_barrier, group_accuracy_barrier : np.ndarray
        ``(R,)`` barriers of the round's clients as a group, uniform weights (FedGuCci Eq. 9/10).
    top_eigenvalue : np.ndarray
        ``(R,)`` the global model's largest Hessian eigenvalue.
    trace, trace_stderr : np.ndarray
        ``(R,)`` Hutchinson estimate of the global model's Hessian trace and its standard error.
    sharpness : np.ndarray
        ``(R,)`` worst-case L2 sharpness of the global model (SAM, Foret et al. 2021): a lower bound.
    update_distance : np.ndarray
        ``(R,)`` mean L2 distance of the client updates to their mean.
    update_cosine : np.ndarray
        ``(R,)`` mean pairwise cosine similarity of the client updates.
    time : np.ndarray
        ``(R,)`` seconds spent measuring at each tracked round.
    samples : np.ndarray
        ``(S,)`` indices into the training set of the fixed evaluation set.
    """

    rounds: np.ndarray
    client_barrier: np.ndarray
    client_accuracy_barrier: np.ndarray
    group_barrier: np.ndarray
    group_accuracy_barrier: np.ndarray
    top_eigenvalue: np.ndarray
    trace: np.ndarray
    trace_stderr: np.ndarray
    sharpness: np.ndarray
    update_distance: np.ndarray
    update_cosine: np.ndarray
    time: np.ndarray
    samples: np.ndarray

    array_fields: ClassVar[tuple[str, ...]] = ("rounds", "client_barrier", "client_accuracy_barrier", "group_barrier",
                                               "group_accuracy_barrier", "top_eigenvalue", "trace", "trace_stderr",
                                               "sharpness", "update_distance", "update_cosine", "time", "samples")

    @property
    def mean_client_barrier(self) -> np.ndarray:
        """``(R,)`` mean loss barrier over the clients of each round (NaN where none)."""
        return _row_stat(self.client_barrier, np.nanmean)

    @property
    def max_client_barrier(self) -> np.ndarray:
        """``(R,)`` largest client loss barrier of each round (NaN where none)."""
        return _row_stat(self.client_barrier, np.nanmax)

    @property
    def mean_client_accuracy_barrier(self) -> np.ndarray:
        """``(R,)`` mean accuracy barrier over the clients of each round (NaN where none)."""
        return _row_stat(self.client_accuracy_barrier, np.nanmean)

    @property
    def columns(self) -> list[str]:
        """The per-round columns: ``round`` then :data:`SCALAR_COLUMNS`."""
        return ["round", *SCALAR_COLUMNS]

    def __len__(self) -> int:
        return int(np.asarray(self.rounds).shape[0])

    def __getitem__(self, name: str) -> np.ndarray:
        """A column (``"round"``, a name of :attr:`columns`) or an array attribute, by name."""
        if name == "round":
            return np.asarray(self.rounds)
        if name in SCALAR_COLUMNS or name in self.array_fields:
            return np.asarray(getattr(self, name))
        raise KeyError(f"no column {name!r} in a TrackTable; columns: {', '.join(self.columns)}")

    def to_pandas(self) -> Any:
        """The per-round columns as a ``pandas.DataFrame`` indexed by round, one ``client_K`` column per client.

        Returns
        -------
        pandas.DataFrame
            :attr:`columns` (``round`` as the index) and the client loss barriers.

        Raises
        ------
        ImportError
            When pandas is not installed (it is optional: ``pip install pandas``).
        """
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError("TrackTable.to_pandas needs pandas (pip install pandas); the columns are also "
                              "available as table[name]") from exc
        data = {name: self[name] for name in SCALAR_COLUMNS}
        data.update({f"client_{k}": np.asarray(self.client_barrier)[:, k]
                     for k in range(np.asarray(self.client_barrier).shape[1])})
        return pd.DataFrame(data, index=pd.Index(self["round"], name="round"))


def _row_stat(matrix: np.ndarray, stat: Any) -> np.ndarray:
    """``stat`` over each row's finite entries (NaN for a row without any), without warnings."""
    matrix = np.asarray(matrix, dtype=np.float64)
    out = np.full(matrix.shape[0], np.nan)
    for i, row in enumerate(matrix):
        if np.isfinite(row).any():
            out[i] = stat(row)
    return out
