"""Typed option sets: one frozen dataclass per set of options, one source of truth.

A field is declared with :func:`option`, whose metadata carries the help text, the source of
the default (a paper equation, the official code, or a choice of ours), the allowed range
(``ge``/``gt``/``le``/``lt``) and, for the command line, its flag, choices and metavar. From
these declarations come:

* validation (:meth:`Options.from_mapping`, :func:`.values.check_value`): unknown keys (with a
  did-you-mean), wrong types, NaN and infinite numbers, values out of range, names outside the
  choices, each a one-line ``ConfigError`` naming the option;
* the command-line flags with their help, range, source, choices and checks
  (:func:`landscape.infra.flags.add_option_flags`, the one generator: ``fl-run`` and every
  ``landscape`` command);
* the option tables of ``docs/api.md`` (``scripts/option_tables.py``, when the docs site is built);
* the configuration digest (``fl.config.config_digest``: fields marked ``volatile`` are left
  out).

Used by every option set of the toolkit: the FL run configuration and each algorithm's options
(``fl``), the evaluator's options (:class:`landscape.evaluation.options.EvaluatorOptions`), the
keyword groups of the analysis functions (``options`` modules of the core's subpackages) and
the command line's own groups (beside each ``landscape_cli`` command, and ``fl.cli``).

Supported annotations: those of :func:`.values.check_value`.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, Callable, ClassVar, Iterable, Mapping, Sequence, TypeVar

from .errors import ConfigError
from .values import RANGE_KEYS, check_value, did_you_mean

T = TypeVar("T", bound="Options")
#: Largest seed accepted: ``torch.Generator.manual_seed`` takes values in ``[0, 2**63)``.
MAX_SEED = 2**63 - 1

__all__ = ["MAX_SEED", "Options", "check_value", "did_you_mean", "field_default", "option", "seed_option"]


def option(default: Any, *, help: str, source: str | None = None, ge: float | None = None,
           gt: float | None = None, le: float | None = None, lt: float | None = None,
           volatile: bool = False, parse: Any = None, cli: bool = True, flag: str | Sequence[str] | None = None,
           metavar: str | tuple[str, ...] | None = None,
           choices: Iterable[str] | Callable[[], Sequence[str]] | None = None, required: bool = False,
           repeat: bool = False) -> Any:
    """Declare a dataclass field of an :class:`Options` class.

    Parameters
    ----------
    default : Any
        Default value (a dict or list default is copied for every instance).
    help : str
        One-line help shown by the command line.
    source : str, optional
        Where the default comes from, e.g. ``"FedProx Eq. 2"`` or ``"official code"``.
    ge, gt, le, lt : float, optional
        Bounds of a number (or of every number of a list): ``>=``, ``>``, ``<=``, ``<``.
    volatile : bool
        True for options that may change when a stored run is resumed (device, back end):
        they are left out of the configuration digest and of the stored-run comparison.
    parse : callable, optional
        Turns a command-line string into the value (for types argparse cannot convert alone);
        it may raise ``ConfigError`` or ``ValueError`` for bad text.
    cli : bool
        False for options that only make sense from Python (callables, data).
    flag : str or sequence of str, optional
        The command-line flag(s) when not ``--field-name`` (e.g. ``"--train-batch-size"``, or
        ``("--option", "-o")``); the parsed value is then stored under the first flag's name.
    metavar : str or tuple of str, optional
        The value's name in the command line's usage (default by type: ``N``, ``X``, ...).
    choices : sequence of str, registry or callable, optional
        The names a string option accepts; a :class:`~landscape.infra.registry.Registry` (iterated
        for its live names) or a callable is asked each time, so names registered later count (the
        option tables of ``docs/api.md`` then say "any registered ..." rather than list them).
    required : bool
        The command line refuses to run without this flag.
    repeat : bool
        The flag may be given several times; the value is the list of its occurrences.

    Returns
    -------
    dataclasses.Field
        The field, to be assigned in the class body.
    """
    cli_keys = {"flag": (flag,) if isinstance(flag, str) else tuple(flag) if flag else None,
                "metavar": metavar, "choices": choices, "required": required or None, "repeat": repeat or None}
    meta = {"help": help, "source": source, "volatile": volatile, "cli": cli,
            **({"parse": parse} if parse is not None else {}),
            **{k: v for k, v in cli_keys.items() if v is not None},
            **{k: v for k, v in zip(RANGE_KEYS, (ge, gt, le, lt)) if v is not None}}
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def seed_option(help: str) -> Any:
    """Declare the ``seed`` field of an option set: an integer in ``[0, MAX_SEED]``, default 0.

    Parameters
    ----------
    help : str
        What the seed draws, e.g. ``"seed of the random directions"``.

    Returns
    -------
    dataclasses.Field
        The field.
    """
    return option(0, ge=0, le=MAX_SEED, help=help)


@dataclasses.dataclass(frozen=True)
class Options:
    """Base class of a typed option set (subclass it as a frozen dataclass).

    Subclasses may override :meth:`resolved` (defaults derived from the run configuration)
    and :meth:`check` (constraints between fields), and name in :attr:`configures` the
    functions whose keyword arguments the fields are (their defaults must agree).
    """

    #: Dotted names of the functions whose keyword arguments these options are (e.g.
    #: ``"landscape.plane"``); empty for option sets of their own (a command's, a run's).
    configures: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def fields(cls) -> dict[str, dataclasses.Field]:
        """The declared fields by name.

        Returns
        -------
        dict[str, dataclasses.Field]
            Field objects in declaration order.
        """
        return {f.name: f for f in dataclasses.fields(cls)}

    @classmethod
    def types(cls) -> dict[str, Any]:
        """The evaluated annotation of every field.

        Returns
        -------
        dict[str, Any]
            Field name -> type (``typing`` objects, strings resolved in the class's module).
        """
        hints = typing.get_type_hints(cls)
        return {name: hints[name] for name in cls.fields()}

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Default values of the fields.

        Returns
        -------
        dict[str, Any]
            Field name -> default (fresh copies of dict and list defaults).
        """
        return {name: field_default(f) for name, f in cls.fields().items()}

    @classmethod
    def from_mapping(cls: type[T], values: Mapping[str, Any], *, owner: str = "") -> T:
        """Validate ``values`` (missing keys take their defaults) and build the option set.

        Parameters
        ----------
        values : Mapping[str, Any]
            Option name -> value.
        owner : str
            Prefix naming the option set in messages, e.g. ``"fedprox option "``.

        Returns
        -------
        Options
            The validated instance (ints stay ints, numbers given for floats become floats).

        Raises
        ------
        ConfigError
            For an unknown key (with the closest valid name), a wrong type, a non-finite
            number, a value out of range, or a failed :meth:`check`.
        """
        fields = cls.fields()
        unknown = [k for k in values if k not in fields]
        if unknown:
            raise ConfigError(f"unknown {owner or 'option '}{unknown[0]!r}{did_you_mean(unknown[0], fields)}; "
                              f"valid: {', '.join(fields)}")
        types_ = cls.types()
        given = {**cls.defaults(), **values}
        checked = {name: check_value(f"{owner}{name}", given[name], types_[name], fields[name].metadata)
                   for name in fields}
        instance = cls(**checked)
        instance.check()
        return instance

    def to_dict(self) -> dict[str, Any]:
        """The options as a plain (JSON-ready) dict.

        Returns
        -------
        dict[str, Any]
            Field name -> value, in declaration order.
        """
        return {name: getattr(self, name) for name in self.fields()}

    def resolved(self: T, config: Mapping[str, Any]) -> T:
        """Defaults that depend on the run configuration filled in (default: unchanged).

        Parameters
        ----------
        config : Mapping[str, Any]
            The run configuration (``rounds``, ``local_epochs``, ...).

        Returns
        -------
        Options
            An instance without unresolved (``None``) derived defaults.
        """
        return self

    def check(self) -> None:
        """Constraints between fields (default: none); raise ``ConfigError``."""

    def validate(self) -> None:
        """Check every field of this instance against its annotation and range, then :meth:`check`.

        For option sets that validate on construction (call it from ``__post_init__``); values
        are normalised in place as :func:`check_value` does.

        Raises
        ------
        ConfigError
            Naming the first invalid option.
        """
        types_ = self.types()
        for name, f in self.fields().items():
            object.__setattr__(self, name, check_value(name, getattr(self, name), types_[name], f.metadata))
        self.check()


def field_default(field: dataclasses.Field) -> Any:
    """The default of a field declared with :func:`option` (a fresh copy of a dict or list).

    Parameters
    ----------
    field : dataclasses.Field
        The field.

    Returns
    -------
    Any
        Its default value.
    """
    return field.default_factory() if field.default is dataclasses.MISSING else field.default  # type: ignore[misc]
