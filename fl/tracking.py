"""Landscape tracking during training: :class:`Track` (what, how often) and its stored records.

``fl.run(..., track=fl.Track(every=10))`` measures, at every tracked round, how the clients'
models connect to the global model and how sharp the global model is, on one fixed evaluation
set drawn when the run starts (:func:`evaluation_indices`); :mod:`fl.tracker` computes the
measures with the analysis core. They are stored in the round's record of ``metrics.jsonl``
(keys ``track_*``, :data:`RECORD_KEYS`), so a tracked round is written atomically with its round,
listed in the manifest and resumed like the rest of the run; round 0's record also holds the
evaluation set's sample indices (``track_samples``). ``Run.track()`` reads them back as a
:class:`~landscape.results.tracking.TrackTable` (:func:`track_table`).

The ``Track`` settings are part of the run's configuration (``config.json`` key ``track``, in the
configuration digest only when set): resuming a run with other ``Track`` settings is refused
like any other change of configuration.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

import numpy as np

from landscape.infra.errors import ConfigError
from landscape.infra.options import MAX_SEED, Options, did_you_mean, option

#: The measures :class:`Track` can record, in the order of the table's columns.
MEASURES = ("barriers", "group_barrier", "eigenvalue", "trace", "sharpness", "spread")
#: Record key (without the ``track_`` prefix) -> the measure that writes it. Client lists follow ``clients``.
RECORD_KEYS = {"client_barriers": "barriers", "client_accuracy_barriers": "barriers",
               "group_barrier": "group_barrier", "group_accuracy_barrier": "group_barrier",
               "top_eigenvalue": "eigenvalue", "trace": "trace", "trace_stderr": "trace", "sharpness": "sharpness",
               "update_distance": "spread", "update_cosine": "spread"}
PREFIX = "track_"


@dataclasses.dataclass(frozen=True)
class Track(Options):
    """What ``fl.run(..., track=Track(...))`` measures during training, and how often.

    At round 0 (the initial model), at every round ``r`` with ``r % every == 0`` and at the last
    round, on a fixed evaluation set of ``samples`` training samples drawn once with ``seed``
    from the clients' training data (the same set at every tracked round and, since it does not
    depend on the run seed, for every seed of a run):

    * ``barriers``: each client's loss and accuracy barrier to the global model on the straight
      line ``(1 - alpha) w_k + alpha w`` at ``points`` evenly spaced ``alpha`` (FedGuCci Eq. 3/4,
      :func:`landscape.interpolate`);
    * ``group_barrier``: the barrier of the round's clients as a group, their uniform average
      against their mean loss and accuracy (FedGuCci Eq. 9/10, :func:`landscape.group_barrier`);
    * ``eigenvalue``: the global model's top Hessian eigenvalue (Lanczos, ``iterations``
      Hessian-vector products, :func:`landscape.hessian_eigenvalues`);
    * ``trace``: the global model's Hessian trace by Hutchinson's estimator with ``probes``
      Rademacher probes, with its standard error (Hutchinson 1989, :func:`landscape.hessian_trace`);
    * ``sharpness``: the global model's worst-case L2 sharpness ``max_{||e|| <= rho} L(w + e) - L(w)``
      from one start and ``steps`` ascent steps (SAM's sharpness, Foret et al. 2021 Eq. 1, as used
      by FedSAM, Qu et al. 2022, and FedLESAM, Fan et al. 2024; :func:`landscape.sharpness`), a
      lower bound of the maximum;
    * ``spread``: how far the client updates ``d_k = w_k - w_prev`` (client model minus the
      previous round's global model, trainable parameters) spread: the mean L2 distance of the
      ``d_k`` to their mean, and their mean pairwise cosine similarity (1: all clients move the
      same way; client drift, Karimireddy et al. 2020).

    Round 0 has no clients: only the global model's measures are recorded there. A measure that
    cannot be computed (one client: no group barrier, no cosine; a non-finite value) is stored
    as missing (NaN in the table). Curvature is of the loss over the whole evaluation set,
    evaluated in float32 on the run's device, BatchNorm statistics interpolated with the weights.

    Defaults: cheap measures, small probe counts, every 10th round. On the MNIST-1D recipe
    (``fedgucci-mnist1d``, 150 rounds) they add about 8% to a FedAvg run's time and under 3% to a
    FedGuCci run's, whose rounds cost more (``benchmarks/bench_track.py``, its table in
    ``benchmarks/README.md``); a run of few rounds tracks a larger share of them, and the first
    tracked round of a process also loads the analysis core.

    Parameters
    ----------
    every : int
        Track every ``every`` rounds (plus rounds 0 and the last).
    measures : list of str
        Names from :data:`MEASURES` (default: all).
    samples : int
        Size of the fixed evaluation set (capped at the clients' training data).
    points : int
        Points on each client-to-global line, ends included.
    iterations : int
        Lanczos Hessian-vector products for the top eigenvalue.
    probes : int
        Hutchinson probes for the trace.
    rho : float
        Radius of the sharpness ball (SAM's default 0.05).
    steps : int
        Ascent steps of the sharpness (one restart).
    seed : int
        Seed of the evaluation set and of the probes and starts.

    Raises
    ------
    ConfigError
        One line naming the bad argument (on construction).
    """

    every: int = option(10, ge=1, le=1_000_000, help="track rounds r with r % every == 0, round 0 and the last")
    measures: list[str] = option(list(MEASURES), help=f"measures to record, from {', '.join(MEASURES)}")
    samples: int = option(256, ge=2, le=10_000_000, help="size of the fixed evaluation set of training samples")
    points: int = option(5, ge=3, le=1001, help="points on each client-to-global line (ends included)")
    iterations: int = option(20, ge=1, le=10_000, help="Lanczos Hessian-vector products (top eigenvalue)")
    probes: int = option(10, ge=2, le=10_000, help="Hutchinson probes (Hessian trace)",
                         source="Hutchinson 1989")
    rho: float = option(0.05, gt=0, le=1e6, help="radius of the L2 sharpness ball",
                        source="Foret et al. 2021 (SAM's default rho)")
    steps: int = option(5, ge=1, le=10_000, help="ascent steps of the sharpness (one restart)")
    seed: int = option(0, ge=0, le=MAX_SEED, help="seed of the evaluation set, probes and starts")

    def __post_init__(self) -> None:
        self.validate()

    def check(self) -> None:
        """Every measure is known, named once, and at least one is asked for."""
        if not self.measures:
            raise ConfigError(f"Track measures is empty; name at least one of {', '.join(MEASURES)}")
        for name in self.measures:
            if name not in MEASURES:
                raise ConfigError(f"unknown Track measure {name!r}{did_you_mean(name, MEASURES)}; "
                                  f"valid: {', '.join(MEASURES)}")
        if len(set(self.measures)) != len(self.measures):
            raise ConfigError(f"Track measures names a measure twice: {self.measures}")

    def due(self, round: int, rounds: int) -> bool:
        """Whether ``round`` of a run of ``rounds`` rounds is tracked.

        Parameters
        ----------
        round : int
            A round (0: the initial model).
        rounds : int
            The run's last round.

        Returns
        -------
        bool
            True for round 0, multiples of ``every`` and the last round.
        """
        return round % self.every == 0 or round == rounds


def resolve_track(value: Any) -> dict[str, Any] | None:
    """The stored form of ``fl.run``'s ``track=``: every field of :class:`Track`, or None.

    Parameters
    ----------
    value : Track, Mapping, str, bool or None
        A :class:`Track`, a dict of its fields (or its JSON text, as a Flower run configuration
        or a command line gives it), True (the defaults), or False/None (off).

    Returns
    -------
    dict or None
        The JSON-ready settings (defaults filled in, so equal settings give equal digests).

    Raises
    ------
    ConfigError
        For another type or a bad field.
    """
    if value is None or value is False:
        return None
    if value is True:
        return Track().to_dict()
    if isinstance(value, Track):
        return value.to_dict()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ConfigError(f"track must be JSON text of fl.Track's fields, got {value!r}") from None
    if isinstance(value, Mapping):
        return Track.from_mapping(value, owner="track option ").to_dict()
    raise ConfigError(f"track must be an fl.Track, a dict of its fields, True or None, got {value!r}")


def evaluation_indices(client_train: Sequence[np.ndarray], samples: int, seed: int) -> np.ndarray:
    """The fixed evaluation set: ``samples`` indices drawn without replacement from the clients' training data.

    Parameters
    ----------
    client_train : Sequence[np.ndarray]
        Each client's training indices into the training set.
    samples : int
        How many (all of them when the clients hold fewer).
    seed : int
        The draw's seed (numpy ``default_rng``).

    Returns
    -------
    np.ndarray
        Sorted int64 indices into the training set.
    """
    pool = np.unique(np.concatenate([np.asarray(p, dtype=np.int64) for p in client_train]))
    if samples >= pool.size:
        return pool
    return np.sort(np.random.default_rng(seed).choice(pool, size=samples, replace=False))


def track_table(records: Sequence[Mapping[str, Any]], config: Mapping[str, Any]) -> Any:
    """The tracked rounds of a run's metrics records as a table.

    Parameters
    ----------
    records : Sequence[Mapping[str, Any]]
        The run's records (``Run.metrics``), round 0 first.
    config : Mapping[str, Any]
        The run's configuration (``track``, ``clients``, ``algorithm``, ``seed``).

    Returns
    -------
    TrackTable
        One row per tracked round (:class:`landscape.results.tracking.TrackTable`).

    Raises
    ------
    ConfigError
        When the run was not tracked.
    """
    from landscape.results.tracking import TrackTable

    if not config.get("track"):
        raise ConfigError("this run was not tracked; pass track=fl.Track() to fl.run (docs/tracking.md)")
    rows = [r for r in records if any(k.startswith(PREFIX) and k != PREFIX + "samples" for k in r)]
    clients = int(config["clients"])

    def column(key: str) -> np.ndarray:
        return np.array([np.nan if r.get(PREFIX + key) is None else float(r[PREFIX + key]) for r in rows])

    def per_client(key: str) -> np.ndarray:
        out = np.full((len(rows), clients), np.nan)
        for i, r in enumerate(rows):
            for k, v in zip(r.get("clients", []), r.get(PREFIX + key) or []):
                out[i, k] = np.nan if v is None else v
        return out

    scalars = {k: column(k) for k in RECORD_KEYS if not k.startswith("client_")}
    samples = records[0].get(PREFIX + "samples", []) if records else []
    return TrackTable(rounds=np.array([r["round"] for r in rows], dtype=np.int64),
                      client_barrier=per_client("client_barriers"),
                      client_accuracy_barrier=per_client("client_accuracy_barriers"), time=column("time"),
                      samples=np.asarray(samples, dtype=np.int64), **scalars,
                      spec={"track": dict(config["track"]), "algorithm": config["algorithm"],
                            "seed": int(config["seed"]), "dataset": config["dataset"]})
