"""Exception classes. Every error says what was wrong and what to do about it."""
from __future__ import annotations

from typing import Mapping, Sequence


class LandscapeError(Exception):
    """Base class of every error raised by this toolkit."""


class CheckpointError(LandscapeError):
    """A checkpoint file cannot be read safely (corrupt, truncated, pickled objects, unknown format).

    Parameters
    ----------
    path
        The checkpoint (or what the state came from); kept as ``self.path`` (a string).
    problem
        What is wrong and what to do, kept as ``self.problem``; the message is
        ``"<path>: <problem>"``.
    """

    def __init__(self, path: object, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class ArchitectureMismatchError(LandscapeError):
    """A state_dict does not fit the template module.

    Parameters
    ----------
    missing
        Template keys absent from the state (kept as ``self.missing``).
    unexpected
        State keys the template does not have (``self.unexpected``).
    wrong_shape
        ``(key, expected shape, found shape)`` triples (``self.wrong_shape``).
    source
        What the state came from (a path, a class name), for the message.
    """

    def __init__(self, missing: Sequence[str], unexpected: Sequence[str],
                 wrong_shape: Sequence[tuple[str, tuple, tuple]], source: str = "state_dict"):
        self.missing = list(missing)
        self.unexpected = list(unexpected)
        self.wrong_shape = list(wrong_shape)
        parts = []
        if self.missing:
            parts.append(f"missing keys {_short(self.missing)}")
        if self.unexpected:
            parts.append(f"unexpected keys {_short(self.unexpected)}")
        if self.wrong_shape:
            shapes = [f"{k} (expected {tuple(e)}, got {tuple(g)})" for k, e, g in self.wrong_shape]
            parts.append(f"wrong-shape keys {_short(shapes)}")
        super().__init__(f"{source} does not match the template architecture: " + "; ".join(parts)
                         + ". Check that the template module is the architecture the weights came from.")


class NonFiniteWeightsError(LandscapeError):
    """A model contains NaN or infinite weights.

    Parameters
    ----------
    names
        The tensors holding NaN or infinite values (kept as ``self.names``).
    source
        What the model came from, for the message.
    """

    def __init__(self, names: Sequence[str], source: str = "model"):
        self.names = list(names)
        super().__init__(f"{source} has NaN or infinite values in {_short(self.names)}; "
                         "such a model has no meaningful loss: use a checkpoint from before training diverged.")


class TrainingDivergedError(NonFiniteWeightsError):
    """Training a curve or simplex produced a non-finite loss or non-finite weights.

    Parameters
    ----------
    what
        What was trained, e.g. ``"curve training"``.
    epoch
        The epoch (from 0) in which it diverged.
    names
        What became non-finite (``"loss"``, ``"weights"``; kept as ``self.names``).
    settings
        The optimiser settings, for the message (e.g. ``{"lr": 1e30, "momentum": 0.9}``).
    """

    def __init__(self, what: str, epoch: int, names: Sequence[str], settings: Mapping[str, float]):
        self.names = list(names)
        self.epoch = epoch
        shown = ", ".join(f"{k}={v:g}" for k, v in settings.items())
        LandscapeError.__init__(self, f"{what} diverged in epoch {epoch}: the {' and the '.join(self.names)} "
                                      f"became NaN or infinite with {shown}; lower the learning rate (or the "
                                      "momentum) and train again")


class DataError(LandscapeError):
    """The data cannot be used with the model (empty, wrong shapes, labels out of range)."""


class CacheError(LandscapeError):
    """The HDF5 cache is unreadable, locked by another writer, or of a format that cannot be extended."""


class FileWriteError(LandscapeError):
    """A file cannot be written: full disk, read-only location, or a link where a file or folder belongs.

    Parameters
    ----------
    path
        The file that could not be written (kept as ``self.path``, a string).
    problem
        What went wrong and what to do (``self.problem``); the message is ``"<path>: <problem>"``.
    """

    def __init__(self, path: object, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class ConfigError(LandscapeError):
    """An argument has an invalid value."""


class MetaDeviceError(ConfigError):
    """A model or state_dict on the meta device: it has shapes but no weights to analyse.

    Parameters
    ----------
    source
        What the model came from (a class name, ``"state_dict"``), for the message.
    """

    def __init__(self, source: str = "model"):
        super().__init__(f"{source} is on the meta device: it has shapes but no weights; load or materialise its "
                         "weights first (module.to_empty(device='cpu') then load_state_dict(...))")


class WeightOverflowError(LandscapeError):
    """A model's weights are finite but so large that arithmetic on them overflows.

    Differences of models, distances and plane coordinates overflow the evaluation dtype.
    """


class CurvatureError(LandscapeError):
    """Curvature cannot be computed for this model, e.g. an operation in it has no second derivative."""


class DistributedError(LandscapeError):
    """A worker process of a data-parallel computation failed, died, or did not finish in time."""


def _short(items: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(str(i) for i in list(items)[:limit])
    more = len(items) - limit
    return f"[{shown}{f', ... and {more} more' if more > 0 else ''}]"


class BatchNormWarning(UserWarning):
    """BatchNorm statistics are being interpolated (``bn="interpolate"``), which can decide a barrier.

    Silence it with ``warnings.simplefilter("ignore", landscape.BatchNormWarning)`` once the
    choice is deliberate; ``docs/batchnorm.md`` explains the modes.
    """


class NonFiniteLossWarning(RuntimeWarning):
    """Some points of a path or group have a non-finite loss, so its loss barrier is NaN or inf.

    The values are kept as they are (a barrier is never computed from the finite points alone);
    the message says how many points and which ones.
    """
