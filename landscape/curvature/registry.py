"""Registries of the curvature methods: eigen-solvers, trace estimators and operator kinds, by name.

A new method is one function in a module of this package, decorated with
:func:`eigen_solver` or :func:`trace_estimator`; a new kind of curvature operator is one subclass
of :class:`~landscape.curvature.operators.CurvatureOperator`, decorated with
:func:`operator_kind` (the ``kind=`` values and the CLI's ``--kind`` choices), whose class
attribute ``Options`` declares its options (a frozen :class:`~landscape.infra.options.Options`
dataclass: name, type, default, range, help). The public functions
(:func:`~landscape.curvature.functions.hessian_eigen`, ``hessian_trace``) and the CLI's
``--method`` choices find it here; their ``kind_options=`` mapping (the CLI's ``--kind-option
KEY=VALUE``) is checked against the kind's ``Options`` by :func:`kind_options`. Every solver sees
only the operator interface (:class:`~landscape.curvature.linear.SymmetricOperator`), so it works
on a Hessian and on an explicit matrix alike.

Solver signature: ``solver(op, k, *, tol, max_iter, generator, return_vectors) -> Eigenpairs``.
Estimator signature: ``estimator(op, *, tol, max_iter, generator, min_samples) -> TraceEstimate``.
Operator kind: ``cls(evaluator, point, *, params, include_frozen, check_determinism, seed, **options)``,
``options`` the fields of ``cls.Options``.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from ..infra.errors import ConfigError
from ..infra.registry import Registry
from ..infra.values import did_you_mean

#: name -> eigen-solver (k largest eigenpairs of a symmetric operator)
EIGEN_SOLVERS: Registry[Callable] = Registry("eigen-solver", package=__package__)
#: name -> trace estimator
TRACE_ESTIMATORS: Registry[Callable] = Registry("trace estimator", package=__package__)
#: name -> curvature operator class (Hessian, GGN, Fisher, ...)
OPERATOR_KINDS: Registry[Callable] = Registry("curvature kind", package=__package__)

#: ``@eigen_solver("name")`` registers an eigen-solver (the ``method=`` value that selects it)
eigen_solver = EIGEN_SOLVERS.register
#: ``@trace_estimator("name")`` registers a trace estimator (the ``method=`` value that selects it)
trace_estimator = TRACE_ESTIMATORS.register
#: ``@operator_kind("name")`` registers a curvature operator class (the ``kind=`` value that selects it)
operator_kind = OPERATOR_KINDS.register


def operator_class(kind: str) -> Any:
    """The class registered as ``kind``.

    Parameters
    ----------
    kind : str
        A registered kind (:data:`OPERATOR_KINDS`).

    Returns
    -------
    type
        The operator class; its ``Options`` declares the kind's options.

    Raises
    ------
    ConfigError
        ``kind`` not a string, or not registered (one line, with the closest registered name).
    """
    if not isinstance(kind, str):
        raise ConfigError(f"kind must be a string, one of {', '.join(OPERATOR_KINDS.names())}; got {kind!r}")
    return OPERATOR_KINDS.get(kind)


def kind_options(kind: str, values: Mapping[str, Any]) -> Any:
    """The options of ``kind``, ``values`` checked against its declaration (``cls.Options``).

    Parameters
    ----------
    kind : str
        A registered kind.
    values : Mapping[str, Any]
        Option name -> value; missing options take the kind's defaults.

    Returns
    -------
    Options
        The validated instance of the kind's ``Options`` (``.to_dict()`` gives the constructor's
        keywords).

    Raises
    ------
    ConfigError
        An unknown kind, an option the kind does not declare (naming the kind and its options, with
        the closest name), or a value of the wrong type or out of range.
    """
    declared = operator_class(kind).Options
    names = declared.fields()
    unknown = [key for key in values if key not in names]
    if unknown:
        offered = f"its options: {', '.join(names)}" if names else "it takes none"
        raise ConfigError(f"curvature kind {kind!r} has no option {unknown[0]!r}{did_you_mean(unknown[0], names)}; "
                          f"{offered}")
    return declared.from_mapping(values, owner=f"curvature kind {kind!r} option ")
