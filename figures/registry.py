"""The figures by name and by the result they draw: :data:`FIGURES` and :func:`draw`.

A figure is a pair of functions, matplotlib and plotly, drawn from the same result object
(:class:`FigureKind`). :data:`FIGURES` is a :class:`~landscape.infra.registry.Registry` that
imports every module of this package before it answers, so a figure registers itself in the
module that draws it, and a new figure is one file in ``figures/`` that ends with
``FIGURES.add("name", FigureKind((MyResult,), my_figure, my_plotly))``; :func:`draw` then finds it
for a ``MyResult``.

>>> FIGURES.get("plane").result_types
(<class 'landscape.results.geometry.PlaneResult'>,)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Sequence

from landscape.infra.errors import ConfigError
from landscape.infra.registry import Registry


@dataclass(frozen=True)
class FigureKind:
    """One figure: the result types it draws and its two renderings.

    Parameters
    ----------
    result_types : tuple[type, ...]
        The result classes it draws (one result, or a mapping or sequence of them for
        comparison figures).
    matplotlib : callable
        ``f(result, **options) -> matplotlib.figure.Figure``.
    plotly : callable
        ``f(result, **options) -> plotly.graph_objects.Figure``.
    """

    result_types: tuple[type, ...]
    matplotlib: Callable[..., Any]
    plotly: Callable[..., Any]


FIGURES: Registry[FigureKind] = Registry("figure", package=__package__)


def kind_of(result: Any) -> str:
    """The name of the registered figure that draws ``result``.

    Parameters
    ----------
    result : Result, or a mapping or sequence of results of one type
        What to draw.

    Returns
    -------
    str
        The figure's name in :data:`FIGURES`.

    Raises
    ------
    ConfigError
        When no registered figure draws that type.
    """
    sample = result
    if isinstance(result, Mapping) and result:
        sample = next(iter(result.values()))
    elif isinstance(result, Sequence) and not isinstance(result, str) and result:
        sample = result[0]
    for name, kind in FIGURES.entries().items():
        if isinstance(sample, kind.result_types):
            return name
    raise ConfigError(f"no figure draws a {type(sample).__name__}; figures: {', '.join(FIGURES.names())} "
                      "(add one with figures.FIGURES.add)")


def draw(result: Any, *, backend: Literal["matplotlib", "plotly"] = "matplotlib", **options: Any) -> Any:
    """The figure of a result, by its type.

    Parameters
    ----------
    result : Result, or a mapping or sequence of results of one type
        What to draw.
    backend : {"matplotlib", "plotly"}
        Which rendering.
    **options : Any
        The figure function's options (``metric=``, ``title=``, ...).

    Returns
    -------
    matplotlib.figure.Figure or plotly.graph_objects.Figure
        The figure.

    Raises
    ------
    ConfigError
        For a type no figure draws, or an unknown backend.
    """
    if backend not in ("matplotlib", "plotly"):
        raise ConfigError(f"backend must be 'matplotlib' or 'plotly', got {backend!r}")
    kind = FIGURES.get(kind_of(result))
    return getattr(kind, backend)(result, **options)
