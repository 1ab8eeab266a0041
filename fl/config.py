"""The run configuration.

:class:`RunConfig` (every ``fl.run`` setting, typed), its digest, and the schema of a
stored ``config.json``.

Bounds (a value outside gives a one-line ``ConfigError``): they refuse what cannot be
meant, not what is unusual. Learning rates lie in ``(0, 100]``, momentum in ``[0, 1)``
(SGD diverges at 1), weight decay in ``[0, 1]``, the per-round decay in ``[0, 1)``, every
number is finite, counts are positive and below sizes no run on one machine reaches
(100 000 clients, 10^6 rounds), seeds lie in ``[0, 2^63)`` (torch's generator range).

Robust aggregation (``aggregator``, ``aggregator_options``, ``clip_norm``;
:mod:`fl.algorithms.robust`) and landscape tracking (``track``, :mod:`fl.tracking`) were added
after version 1 of config.json: a stored configuration without these keys reads with their
defaults (plain FedAvg averaging, no tracking), and they enter the
configuration digest only when they differ from their defaults, so the digest (the default
folder name) of every earlier run is unchanged.

A run started from a checkpoint (``init``) records the digest of the weights it started from as
``init_digest`` (:mod:`fl.initial`). The digest, not the path, is part of the configuration digest
and of the resume check: ``init`` itself is volatile, so the same weights moved elsewhere resume
the run, and other weights put at the same path never do.
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
from typing import Any, Literal, Mapping

from landscape.infra.errors import ConfigError
from landscape.infra.options import Options, check_value, did_you_mean, option

from .partition import METHODS
from .partition import partition as partition_clients
from .tracking import Track
from .update_checks import BAD_CLIENT_POLICIES

#: Version written to config.json; this version reads only its own.
CONFIG_VERSION = 1
BACKENDS = ("sequential", "vectorized", "auto", "loky", "processes", "ray", "dask")
SAVE_MODES = ("all", "last", "none")
#: Stored keys besides the RunConfig fields: derived from the data and the model.
DERIVED_KEYS = ("version", "options", "num_classes", "input_shape", "model_digest", "init_digest", "recipe",
                "recipe_dropped", "frozen")
#: Keys a stored config.json must hold (all others default to their RunConfig default).
REQUIRED_KEYS = ("version", "algorithm", "dataset", "model", "clients", "rounds", "seed", "options",
                 "num_classes", "input_shape")
MAX_CLASSES = 100_000
#: Aggregation rules of client updates (:mod:`fl.algorithms.robust`).
AGGREGATORS = ("mean", "median", "trimmed_mean", "krum", "multi_krum")
#: The ``aggregator_options`` each rule accepts.
AGGREGATOR_KEYS: dict[str, tuple[str, ...]] = {"mean": (), "median": (), "trimmed_mean": ("trim",),
                                               "krum": ("f",), "multi_krum": ("f", "m")}
#: Settings that enter the configuration digest only when they differ from their default (added
#: after configurations of version 1 were first written: the digests of earlier runs stay).
DIGEST_WHEN_SET = ("aggregator", "aggregator_options", "clip_norm", "track")


@dataclasses.dataclass(frozen=True)
class AggregatorOptions(Options):
    """The options of the robust aggregation rules (``fl.run(..., aggregator_options={...})``).

    Each rule accepts only its own keys (:data:`AGGREGATOR_KEYS`); see
    :mod:`fl.algorithms.robust` for the formulas.

    Parameters
    ----------
    trim, f, m
        See each field's help.
    """

    trim: float = option(0.2, ge=0, lt=0.5, help="trimmed_mean: share beta of the clients trimmed at each end "
                                                  "(floor(beta n) per end)",
                         source="Yin et al. 2018, Def. 2; Flower's FedTrimmedAvg default 0.2")
    f: int = option(0, ge=0, le=100_000, help="krum, multi_krum: number f of Byzantine clients assumed "
                                              "(needs n > 2f + 2 clients per round)",
                    source="Blanchard et al. 2017 (Krum); Flower's Krum default 0")
    m: int | None = option(None, ge=1, le=100_000, help="multi_krum: number m of lowest-scored updates "
                                                        "averaged (default n - f)",
                           source="Blanchard et al. 2017 (Multi-Krum)")


def sample_size(num_clients: int, participation: float) -> int:
    """The number of clients sampled in a round: ``max(1, floor(participation * K + 0.5))``.

    The share rounded half up (Python's ``round`` rounds halves to even).

    Parameters
    ----------
    num_clients : int
        K.
    participation : float
        Share of clients per round, in (0, 1].

    Returns
    -------
    int
        Between 1 and K.
    """
    return min(num_clients, max(1, math.floor(participation * num_clients + 0.5)))


def check_krum(rule: str, n: int, f: int, m: int | None = None) -> None:
    """Refuse a Krum configuration that cannot work: ``n <= 2f + 2``, or ``m`` outside ``[1, n]``.

    Parameters
    ----------
    rule : str
        ``"krum"`` or ``"multi_krum"`` (named in the message).
    n : int
        Client updates per round.
    f : int
        Byzantine clients assumed.
    m : int, optional
        Multi-Krum's number of averaged updates.

    Raises
    ------
    ConfigError
        One line naming ``n``, ``f`` (and ``m``) and what to change.
    """
    if n <= 2 * f + 2:
        raise ConfigError(f"{rule} needs n > 2f + 2 client updates per round, got n = {n} and f = {f}; lower "
                          "aggregator_options f or sample more clients per round")
    if m is not None and not 1 <= m <= n:
        raise ConfigError(f"{rule} averages 1 <= m <= n of the n client updates of a round, got m = {m} and "
                          f"n = {n}; lower aggregator_options m")


def check_aggregator(rule: str, options: Mapping[str, Any], clients: int | None = None) -> AggregatorOptions:
    """Validate an aggregation rule's options, and its client count when known.

    Parameters
    ----------
    rule : str
        One of :data:`AGGREGATORS`.
    options : Mapping[str, Any]
        The ``aggregator_options`` given.
    clients : int, optional
        The number n of client updates aggregated per round.

    Returns
    -------
    AggregatorOptions
        The validated options (defaults filled in).

    Raises
    ------
    ConfigError
        For an unknown rule, a key the rule does not accept (naming the rule it belongs to, or
        the closest valid key), a wrong type or range, Krum with ``n <= 2f + 2``, or multi-Krum
        with ``m > n``.
    """
    if rule not in AGGREGATORS:
        raise ConfigError(f"unknown aggregator {rule!r}{did_you_mean(str(rule), AGGREGATORS)}; "
                          f"valid: {', '.join(AGGREGATORS)}")
    valid = AGGREGATOR_KEYS[rule]
    for key in options:
        if key not in valid:
            owners = [r for r, keys in AGGREGATOR_KEYS.items() if key in keys]
            hint = (f" (an option of {' and '.join(owners)})" if owners else did_you_mean(str(key), valid))
            raise ConfigError(f"unknown aggregator option {key!r} for aggregator={rule!r}{hint}; valid for "
                              f"{rule}: {', '.join(valid) or 'none'}")
    opts = AggregatorOptions.from_mapping(options, owner="aggregator option ")
    if clients is not None and rule in ("krum", "multi_krum"):
        check_krum(rule, clients, opts.f, opts.m if rule == "multi_krum" else None)
    return opts


@dataclasses.dataclass(frozen=True)
class RunConfig(Options):
    """Every setting of ``fl.run`` except the algorithm's own options.

    See ``fl.algorithms.registry()``; each algorithm declares its options next to its
    code.

    Parameters
    ----------
    algorithm, dataset, model, init, clients, rounds, participation, local_epochs, batch_size, lr,
    momentum, weight_decay, lr_decay, partition, alpha, partition_options,
    local_test_fraction, seed, device, backend, n_jobs, save_clients, bad_clients, eval_batch_size,
    data_root, download, ima, aggregator, aggregator_options, clip_norm, track
        See each field's help (``fl-run --help`` prints them).
    """

    algorithm: str = option("fedavg", help="FL algorithm (fl-run --list-algorithms)")
    dataset: str = option("digits", help="digits (embedded), mnist1d (generated) or a torchvision "
                                         "dataset: mnist, fashionmnist, cifar10, cifar100, svhn")
    model: str | None = option(None, help="zoo model name (fl.models.MODELS); default: the dataset's model")
    init: str | None = option(None, volatile=True, help="start from these weights instead of the model's random "
                                                        "initialisation: a .safetensors/.pt state_dict (e.g. from "
                                                        "fl.pretrain) or a finished run folder (its last global "
                                                        "model); the weights' digest is part of the configuration")
    clients: int = option(10, ge=1, le=100_000, help="number of clients K")
    rounds: int = option(20, ge=0, le=1_000_000, help="training rounds T (round 0 is the initial model)")
    participation: float = option(1.0, gt=0, le=1, help="share of clients sampled each round")
    local_epochs: int = option(3, ge=1, le=10_000, help="local epochs E per round",
                                source="ours: defaults that train, benchmarks/default_accuracy.py")
    batch_size: int = option(32, ge=1, le=10_000_000, help="local mini-batch size")
    lr: float = option(0.1, gt=0, le=100, help="client learning rate",
                      source="ours: defaults that train, benchmarks/default_accuracy.py")
    momentum: float = option(0.9, ge=0, lt=1, help="SGD momentum of local training",
                            source="ours: defaults that train, benchmarks/default_accuracy.py")
    weight_decay: float = option(0.0, ge=0, le=1, help="SGD weight decay of local training")
    lr_decay: float = option(0.0, ge=0, lt=1, help="per-round decay gamma: lr_r = lr (1 - gamma)^(r-1)",
                             source="IMA Sec. 7.1.3")
    partition: Literal[METHODS] = option("dirichlet", help="how the training set is split over the "  # type: ignore[valid-type]
                                                          "clients (fl.partition)")
    alpha: float = option(0.5, gt=0, le=1e6, help="Dirichlet concentration of the partition")
    partition_options: dict[str, Any] = option({}, help="extra keyword arguments of fl.partition.partition "
                                                        "(JSON), e.g. {\"min_size\": 2}")
    local_test_fraction: float = option(0.0, ge=0, lt=1, help="share of each client's data held out as "
                                                               "its local test split")
    seed: int = option(0, ge=0, le=2**63 - 1, help="run seed (partition, initial model, sampling, batches)")
    device: str = option("auto", volatile=True, help="auto, cpu, cuda or cuda:N")
    backend: Literal[BACKENDS] = option("sequential", volatile=True,  # type: ignore[valid-type]
                                        help="sequential; vectorized (a round's clients at once, "
                                             "fl.vectorized); auto (vectorized where fl.vectorized."
                                             "choose_backend's rule says so); loky, processes, ray, "
                                             "dask (workers)")
    n_jobs: int | None = option(None, ge=1, le=4096, volatile=True, help="workers of a parallel back end "
                                                                        "(default 2)")
    save_clients: Literal[SAVE_MODES] | list[int] = option(  # type: ignore[valid-type]
        "all", ge=1, help="client models stored: all, last, none or a JSON list of rounds")
    bad_clients: Literal[BAD_CLIENT_POLICIES] = option(  # type: ignore[valid-type]
        "stop", volatile=True, help="a client whose update is refused (fl.update_checks): stop the run, or drop "
                                    "it from the round and record why")
    eval_batch_size: int = option(1024, ge=1, le=10_000_000, help="batch size of test evaluation")
    data_root: str | None = option(None, volatile=True, help="folder of the torchvision datasets")
    download: bool = option(False, volatile=True, help="allow torchvision downloads")
    ima: bool | dict[str, Any] | None = option(False, help="IMA on top of the algorithm: true or a JSON "
                                                           "dict of IMA options")
    aggregator: Literal[AGGREGATORS] = option(  # type: ignore[valid-type]
        "mean", help="rule combining the client updates: mean (sample-weighted FedAvg) or the unweighted "
                     "robust rules median, trimmed_mean, krum, multi_krum (fl.algorithms.robust)",
        source="Yin et al. 2018 (median, trimmed mean); Blanchard et al. 2017 (Krum)")
    aggregator_options: dict[str, Any] = option({}, help="options of the aggregator (JSON): trim for "
                                                         "trimmed_mean, f for krum, f and m for multi_krum")
    clip_norm: float | None = option(None, gt=0, le=1e12, help="scale each client update w_k - w to L2 norm "
                                                               "at most C before aggregating (None: off)",
                                     source="Sun et al. 2019 (norm thresholding)")
    track: dict[str, Any] | None = option(None, help="landscape tracking during training: fl.Track's fields as JSON, "
                                                     "e.g. {\"every\": 10} (None: off; docs/tracking.md)")

    def check(self) -> None:
        """Rounds named by ``save_clients`` exist.

        ``partition_options`` are arguments of the partition function; ``init`` is not an
        empty path; ``aggregator_options`` are the aggregator's (:func:`check_aggregator`, with
        the number of clients sampled per round).
        """
        if self.init is not None and not self.init.strip():
            raise ConfigError("init is an empty path; name a checkpoint file or a finished run folder, or leave "
                              "init unset for the model's random initialisation")
        if isinstance(self.save_clients, list):
            late = [r for r in self.save_clients if r > self.rounds]
            if late:
                raise ConfigError(f"save_clients names round {late[0]} but the run has {self.rounds} rounds")
        accepted = set(inspect.signature(partition_clients).parameters) - {"labels", "num_clients", "method",
                                                                   "alpha", "seed"}
        for key in self.partition_options:
            if key not in accepted:
                raise ConfigError(f"unknown partition option {key!r}{did_you_mean(key, sorted(accepted))}; "
                                  f"valid: {', '.join(sorted(accepted))}")
        check_aggregator(self.aggregator, self.aggregator_options, sample_size(self.clients, self.participation))
        if self.track is not None:
            Track.from_mapping(self.track, owner="track option ")


def volatile_keys() -> tuple[str, ...]:
    """Config keys that may differ when a stored run is resumed (device, back end, ...).

    Returns
    -------
    tuple[str, ...]
        The RunConfig fields declared ``volatile`` plus ``recipe`` and ``recipe_dropped``
        (the resolved values are stored; the name and what was left out are labels).
    """
    return tuple(n for n, f in RunConfig.fields().items() if f.metadata["volatile"]) + ("recipe", "recipe_dropped")


def config_digest(config: Mapping[str, Any]) -> str:
    """Short digest of the parts of a configuration that determine the results.

    Parameters
    ----------
    config : Mapping[str, Any]
        A stored configuration (as written to config.json).

    Returns
    -------
    str
        The first 10 hex digits of the SHA-256 of the sorted JSON of its non-volatile keys
        (those of :data:`DIGEST_WHEN_SET` only when they differ from their defaults).
    """
    skip = volatile_keys()
    defaults = RunConfig.defaults()
    stable = {k: v for k, v in config.items() if k not in skip and not (k in DIGEST_WHEN_SET and v == defaults[k])}
    return hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()[:10]


def config_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Keys whose values differ between two stored configurations (volatile keys ignored).

    Parameters
    ----------
    old, new : Mapping[str, Any]
        Stored configurations.

    Returns
    -------
    list[str]
        The differing keys, sorted.
    """
    skip = volatile_keys()
    return sorted(k for k in set(old) | set(new) if k not in skip and old.get(k) != new.get(k))


def check_stored_config(config: Any, where: str) -> dict[str, Any]:
    """Validate a configuration read from a run folder's ``config.json``.

    Parameters
    ----------
    config : Any
        The parsed JSON.
    where : str
        The file, named in messages.

    Returns
    -------
    dict[str, Any]
        The configuration, with RunConfig keys it lacks set to their defaults.

    Raises
    ------
    ConfigError
        When it is not a configuration of this version: another version, a missing or
        unexpected key, or a value of the wrong type or out of range.
    """
    if not isinstance(config, dict):
        raise ConfigError(f"{where} does not hold a run configuration (a JSON object)")
    version = config.get("version")
    if version != CONFIG_VERSION:
        raise ConfigError(f"{where} was written by another version of fl (config version {version!r}); "
                          f"this version reads version {CONFIG_VERSION}")
    missing = [k for k in REQUIRED_KEYS if k not in config]
    if missing:
        raise ConfigError(f"{where} lacks {', '.join(missing)}: not a complete run configuration")
    fields = RunConfig.fields()
    extra = sorted(set(config) - set(fields) - set(DERIVED_KEYS))
    if extra:
        raise ConfigError(f"{where} holds unexpected key {extra[0]!r}{did_you_mean(extra[0], fields)}")
    out = {**{k: v for k, v in RunConfig.defaults().items() if k not in config}, **config}
    try:
        RunConfig.from_mapping({k: out[k] for k in fields}, owner="")
        check_value("model", out["model"], str, {})
        check_value("num_classes", out["num_classes"], int, {"ge": 1, "le": MAX_CLASSES})
        check_value("input_shape", out["input_shape"], list[int], {"ge": 1, "le": 1_000_000})
        check_value("options", out["options"], dict[str, Any], {})
        check_value("model_digest", out.get("model_digest"), str | None, {})
        check_value("init_digest", out.get("init_digest"), str | None, {})
        check_value("recipe", out.get("recipe"), str | None, {})
        check_value("recipe_dropped", out.get("recipe_dropped"), dict[str, Any] | None, {})
        check_value("frozen", out.get("frozen"), list[str] | None, {})
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not 1 <= len(out["input_shape"]) <= 4:
        raise ConfigError(f"{where}: input_shape must have 1 to 4 dimensions, got {out['input_shape']}")
    if (out["init"] is None) != (out.get("init_digest") is None):
        raise ConfigError(f"{where}: init and init_digest must be given together (a run started from a "
                          "checkpoint records both)")
    return out
