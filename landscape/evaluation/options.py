"""Every option of the :class:`~landscape.evaluation.evaluator.Evaluator`, in one typed dataclass.

:class:`EvaluatorOptions` is declared with the toolkit's one option mechanism
(:mod:`landscape.infra.options`, shared with the FL run configuration and the algorithms'
options): the ``Evaluator`` keyword arguments, their validation (types, choices, ranges, finite
numbers), the CLI flags and their help (:func:`landscape.infra.flags.add_option_flags`) all
come from the field declarations below.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch

from ..infra.backends import as_backend
from ..infra.devices import resolve_device
from ..infra.errors import ConfigError
from ..infra.options import Options, option
from .losses import LOSSES
from .metrics import resolve_metric

BN_MODES = ("interpolate", "keep", "recompute")
STRATEGIES = ("auto", "loop", "vmap")
DTYPES = {"float32": torch.float32, "float64": torch.float64}
AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}

#: Where to read logits when a model's forward returns a dict, tuple or list (see ``output``).
OutputSelector = str | int | Callable[[Any], torch.Tensor] | None


def _named(table: dict[str, torch.dtype], what: str, none: bool = False) -> Callable[[str], torch.dtype | None]:
    def parse(name: str) -> torch.dtype | None:
        if none and name.lower() in ("none", ""):
            return None
        if name not in table:
            raise ConfigError(_dtype_problem(what, name))
        return table[name]
    return parse


def _dtype_problem(what: str, value: Any) -> str:
    """The message for a ``dtype`` or ``autocast`` value outside the accepted ones."""
    table, other, hint = ((DTYPES, AUTOCAST_DTYPES, "reduced-precision forward passes are autocast=")
                          if what == "dtype" else (AUTOCAST_DTYPES, DTYPES, "the evaluation dtype is dtype="))
    name = str(value).removeprefix("torch.")
    also = f"; {hint}{name!r}" if name in other else ""
    return (f"{what} must be one of {', '.join(map(repr, table))} (or the torch dtypes of these names) or None, "
            f"got {value!r}{also}")


def _loss_names() -> tuple[str, ...]:
    """The registered losses, in the order of registration (the classic ones first)."""
    return tuple(LOSSES.entries())


def _compile(text: str) -> bool | str:
    return {"true": True, "false": False}.get(text.lower(), text)


def _device(text: str) -> str:
    """The device as typed, once :func:`~landscape.infra.devices.resolve_device` accepts it."""
    resolve_device(text)
    return text


def _key_or_index(text: str) -> str | int:
    """An integer for text made of digits (an index), the text itself otherwise (a key)."""
    return int(text) if text.lstrip("-").isdigit() else text


@dataclass(frozen=True)
class EvaluatorOptions(Options):
    """Options of an :class:`~landscape.evaluation.evaluator.Evaluator` (validated on creation).

    Attributes
    ----------
    loss
        A loss of the registry :data:`~landscape.evaluation.losses.LOSSES`
        (``"cross_entropy"``, ``"mse"``, ``"nll"``, ``"causal_lm"``, ``"masked_lm"``,
        ``"token"``) or a per-sample callable.
    metric
        The metric reported next to the loss, from :data:`~landscape.evaluation.metrics.METRICS`
        (``"accuracy"``, ``"token_accuracy"``, ``"top<k>_accuracy"``, ``"perplexity"``).
    device
        ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``torch.device``.
    bn
        BatchNorm mode along paths and planes (``docs/batchnorm.md``).
    bn_batches
        Batches of ``bn_data`` used by ``bn="recompute"`` (None: all).
    dtype
        Evaluation dtype: ``torch.float32`` or ``torch.float64``, or their names (None: float32).
    strategy
        ``"loop"``, ``"vmap"`` or ``"auto"``.
    chunk_size, batch_size, memory_budget
        Points per chunk, evaluation batch size, bytes a chunk may use (None: automatic).
    autocast
        Forward passes under ``torch.autocast`` with this dtype: ``torch.bfloat16`` or
        ``torch.float16``, or their names (None: off).
    compile
        ``torch.compile`` the per-batch step (True, False or a backend name).
    backend, n_jobs
        Back end sharding missing points over workers, and its number of workers.
    input_shortcut
        The exact CPU input-layer expansion.
    progress
        Progress bar (None: when on a terminal).
    flush_interval
        Seconds between writes of finished points to the cache.
    output
        Key, index or callable selecting the logits of a dict/tuple/list output.

    Raises :class:`~landscape.ConfigError` naming the option for any invalid value.
    """

    loss: str | Callable[..., Any] = option(
        "cross_entropy", help="loss: a registered name (causal_lm: next-token cross-entropy of a language "
        "model, labels -100 ignored; masked_lm/token: per-position) or (Python only) a callable "
        "(outputs, targets) -> per-sample losses", choices=_loss_names)
    metric: str = option(
        "accuracy", help="metric next to the loss: accuracy, token_accuracy, top<k>_accuracy (e.g. "
        "top5_accuracy) or perplexity (exp of the mean loss)", metavar="NAME",
        flag="--eval-metric")
    device: str | torch.device = option(
        "auto", help="device to evaluate on: auto (CUDA when available), cpu, cuda, cuda:N", parse=_device)
    bn: Literal["interpolate", "keep", "recompute"] = option(
        "interpolate", help="BatchNorm running statistics along paths and planes: interpolate (they move "
        "with the weights, as FedAvg averages a state_dict), keep (the reference model's), recompute "
        "(re-estimated at every point from bn_batches batches of bn_data); see docs/batchnorm.md")
    bn_batches: int | None = option(
        None, help="batches of bn_data used to re-estimate BatchNorm statistics under bn=recompute "
        "(default: all)", ge=1)
    dtype: torch.dtype | None = option(
        None, help="evaluation dtype: float32 (default) or float64", parse=_named(DTYPES, "dtype"))
    strategy: Literal["auto", "loop", "vmap"] = option(
        "auto", help="loop (one point at a time), vmap (a chunk of points at once) or auto (loop on CPU, "
        "timed on a GPU)")
    chunk_size: int | None = option(None, help="points per chunk (default: from the memory budget)", ge=1)
    batch_size: int | None = option(None, help="evaluation batch size for tensor data", ge=1)
    memory_budget: int | None = option(
        None, help="bytes a chunk may use (default: half the free GPU memory, 1 GiB on CPU)", ge=1)
    autocast: torch.dtype | None = option(
        None, help="forward passes under torch.autocast with this dtype (bfloat16 or float16)",
        parse=_named(AUTOCAST_DTYPES, "autocast", none=True))
    compile: bool | str = option(
        False, help="torch.compile the per-batch step: true, false or a backend name", parse=_compile)
    backend: Any = option(
        None, help="shard missing points over workers: loky, processes, ray, dask (default: this process)",
        parse=str)
    n_jobs: int | None = option(None, help="number of workers of the back end", ge=1)
    input_shortcut: bool = option(
        True, help="exact CPU shortcut: expand an input Linear/Conv over the point set's directions")
    progress: bool | None = option(None, help="progress bar (default: when attached to a terminal)")
    flush_interval: float = option(
        1.0, help="seconds between writes of finished points to the cache (bounds the work lost when "
        "a run is killed)", ge=0.01)
    output: str | int | Callable[..., Any] | None = option(
        None, help="for models whose forward returns a dict/tuple/list: the key or index of the logits "
        "(Python: also a callable)", parse=_key_or_index, metavar="KEY|INDEX")

    def __post_init__(self) -> None:
        for name, table in (("dtype", DTYPES), ("autocast", AUTOCAST_DTYPES)):
            value = getattr(self, name)
            if isinstance(value, str):  # the names the command line takes are accepted from Python too
                object.__setattr__(self, name, _named(table, name, none=name == "autocast")(value))
            elif value is not None and not isinstance(value, torch.dtype):
                raise ConfigError(_dtype_problem(name, value))
        self.validate()

    def check(self) -> None:
        """Constraints the annotations cannot express: the allowed dtypes, compile back ends and metrics.

        Raises
        ------
        ConfigError
            A dtype or autocast dtype outside the supported ones, an unknown ``torch.compile``
            back end or an unknown metric.
        """
        if isinstance(self.backend, str):
            as_backend(self.backend)  # refuses an unknown back-end name
        resolve_metric(self.metric)  # refuses an unknown metric name
        if isinstance(self.compile, str) and self.compile not in torch.compiler.list_backends(exclude_tags=()):
            raise ConfigError(f"compile={self.compile!r} is not a torch.compile backend; available: "
                              f"{', '.join(torch.compiler.list_backends())}")
        if self.dtype is not None and self.dtype not in DTYPES.values():
            raise ConfigError(_dtype_problem("dtype", self.dtype))
        if self.autocast is not None and self.autocast not in AUTOCAST_DTYPES.values():
            raise ConfigError(_dtype_problem("autocast", self.autocast))

    def replace(self, **changes: Any) -> "EvaluatorOptions":
        """A copy with some fields changed (validated).

        Parameters
        ----------
        **changes
            Field names and their new values.

        Returns
        -------
        EvaluatorOptions
        """
        return type(self)(**{**self.to_dict(), **changes})
