"""Where shards run: the :class:`Backend` description (name, workers, retries, devices, cluster).

The back ends themselves run in :mod:`landscape.infra.parallel`; ``docs/distributed.md`` describes
each (``local``, ``loky``/``processes``, ``ray``, ``dask`` and any registered joblib back end).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import ConfigError, LandscapeError

PROCESS_ALIASES = {"processes": "loky", "local": "sequential"}


class ShardError(LandscapeError):
    """A shard kept failing after all its retries."""


@dataclass(frozen=True)
class Backend:
    """Where shards run; the fields are checked on construction (:class:`ConfigError`).

    Attributes
    ----------
    name
        ``local`` | ``loky`` | ``processes`` | ``ray`` | ``dask`` or a joblib backend name.
    n_jobs, retries
        Number of workers (-1: all CPUs of the pool or cluster); extra attempts per failed shard.
    devices, address
        One device per worker (claimed round-robin) or None; a Ray or Dask cluster to attach to.
    ray_remote_args, options
        Options of the Ray tasks (e.g. ``{"num_gpus": 0.5}``) and of ``joblib.parallel_config``.
    """

    name: str = "local"
    n_jobs: int = 1
    retries: int = 1
    devices: tuple[str, ...] | None = None
    address: str | None = None
    ray_remote_args: Mapping[str, Any] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"backend must be a non-empty name, got {self.name!r}")
        known = known_backends()
        if self.name not in known:
            raise ConfigError(f"unknown back end {self.name!r}: use one of {', '.join(known)}")
        if self.n_jobs == 0 or self.n_jobs < -1:
            raise ConfigError(f"n_jobs must be a positive number of workers or -1 (all), got {self.n_jobs}")
        if self.retries < 0:
            raise ConfigError(f"retries must be >= 0, got {self.retries}")
        if self.devices is not None:
            object.__setattr__(self, "devices", tuple(str(d) for d in self.devices))
            if not self.devices:
                raise ConfigError("devices must list at least one device (e.g. ['cuda:0']) or be None")

    @property
    def joblib_name(self) -> str:
        """The joblib backend that runs ``name`` (``local`` is ``sequential``, ``processes`` ``loky``)."""
        return PROCESS_ALIASES.get(self.name, self.name)

    @property
    def workers(self) -> int:
        """Number of workers to plan shards for (1 for ``local``; CPU count for -1)."""
        if self.joblib_name == "sequential":
            return 1
        return self.n_jobs if self.n_jobs > 0 else (os.cpu_count() or 1)


def known_backends() -> tuple[str, ...]:
    """Back-end names :class:`Backend` accepts: ours, Ray, Dask and every registered joblib back end.

    Returns
    -------
    tuple of str
    """
    from joblib.parallel import BACKENDS

    return tuple(sorted({"local", "processes", "ray", "dask", *BACKENDS}))


def as_backend(backend: Backend | str | None = None, **overrides: Any) -> Backend:
    """A :class:`Backend` from a name or an existing one, with non-None ``overrides`` applied.

    Parameters
    ----------
    backend, overrides
        A :class:`Backend` or a name (None: ``"local"``); :class:`Backend` fields to replace.

    Returns
    -------
    Backend
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    if isinstance(backend, Backend):
        return Backend(**{**backend.__dict__, **given})
    return Backend(name=backend or "local", **given)
