"""The keyword groups of the geometry functions (paths, planes, groups, basins) as option sets.

Each class declares once the keyword arguments that several callers share: their default
(that of the functions named in ``configures``), range, help and source. The ``landscape``
commands generate their flags from them (:func:`landscape.infra.flags.add_option_flags`),
``docs/api.md`` lists them, and the plane functions check their arguments with
:class:`PlaneOptions`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

from ..infra.errors import ConfigError
from ..infra.options import Options, option, seed_option
from .span import AUTO, check_span

#: Direction normalisations of a random plane (Li et al. 2018 filter normalisation, per layer, none).
NORMALIZATIONS = ("filter", "layer", "none")
#: Largest grid margin of :func:`~landscape.geometry.planes.plane` and
#: :func:`~landscape.geometry.planes.pca_plane`: the grid then spans 21 times the models'
#: bounding box, and the models already share a few cells of a 21-point grid.
MAX_MARGIN = 10.0


def check_margin(margin: float) -> None:
    """Refuse a grid margin that is not a finite number in ``[0, MAX_MARGIN]``.

    Parameters
    ----------
    margin
        The widening of the models' bounding box on each side, as a fraction of its size.

    Raises
    ------
    ConfigError
        Naming the accepted range; a margin above it says why it is too large.
    """
    ok = isinstance(margin, Real) and not isinstance(margin, bool) and math.isfinite(margin)
    if ok and 0 <= margin <= MAX_MARGIN:
        return
    what = "the fraction of the models' bounding box added on each side"
    if ok and margin > MAX_MARGIN:
        raise ConfigError(f"margin {margin:g} is too large: the accepted range is [0, {MAX_MARGIN:g}] ({what}; "
                          "beyond it the models shrink to a few grid cells, and a huge margin makes the grid "
                          "non-finite)")
    raise ConfigError(f"margin must be a finite number in [0, {MAX_MARGIN:g}] ({what}), got {margin!r}")


def _margin(text: str) -> float:
    """The typed margin as a number, once :func:`check_margin` accepts it (it explains a refusal)."""
    try:
        value = float(text)
    except ValueError:
        check_margin(text)  # type: ignore[arg-type]  # refuses the text, naming the accepted range
        raise
    check_margin(value)
    return value


def _span(text: str) -> float | str:
    """The typed span as a number, or as text (``"auto"``), once :func:`.span.check_span` accepts it."""
    try:
        value: float | str = float(text)
    except ValueError:
        value = text
    return check_span(value)


@dataclass(frozen=True)
class PathOptions(Options):
    """How a path between two models is sampled.

    Attributes
    ----------
    alphas
        Number of evenly spaced interpolation coefficients, 0 and 1 included.
    """

    configures = ("landscape.interpolate",)

    alphas: int = option(21, ge=2, help="evenly spaced alphas along each path, 0 and 1 included")


@dataclass(frozen=True)
class PlaneOptions(Options):
    """The grid of a plane: its resolution and extent, and the directions of a random plane.

    Attributes
    ----------
    resolution
        Grid points per axis.
    margin
        Widening of the models' bounding box on each side (planes through models, PCA planes).
    span
        Half-width of a random plane's grid, in direction units, or ``"auto"``.
    normalization
        Normalisation of a random plane's directions.
    seed
        Seed of a random plane's directions.
    """

    configures = ("landscape.plane", "landscape.random_plane", "landscape.pca_plane")

    resolution: int = option(21, ge=2, help="grid points per axis")
    margin: float = option(0.2, ge=0, le=MAX_MARGIN, parse=_margin,
                           help="grid margin (planes through models, PCA planes): the fraction of the models' "
                                "bounding box added on each side")
    span: float | str = option(1.0, gt=0, parse=_span, metavar="SPAN",
                               help=f"grid half-width of a random plane: a positive number, or {AUTO!r} to choose "
                                    "it from the loss's growth along the directions (docs/planes.md)")
    normalization: str = option("filter", choices=NORMALIZATIONS, source="Li et al. 2018 (filter normalisation)",
                                help="normalisation of a random plane's directions")
    seed: int = seed_option("seed of a random plane's directions")

    def check(self) -> None:
        """A span is a positive number or ``"auto"`` (:func:`.span.check_span`).

        Raises
        ------
        ConfigError
            For any other span.
        """
        check_span(self.span)


@dataclass(frozen=True)
class GroupOptions(Options):
    """The fusion weights of a group of models and the random subsets of its barrier by size.

    Attributes
    ----------
    weights
        Fusion weights (normalised), one per model; None: uniform.
    draws
        Random subsets per group size.
    seed
        Seed of the random subsets.
    """

    configures = ("landscape.group_barrier", "landscape.group_barrier_by_size")

    weights: list[float] | None = option(None, ge=0,
                                         help="fusion weights, non-negative, not all zero (normalised); default "
                                              "uniform")
    draws: int = option(5, ge=1, help="random subsets per group size")
    seed: int = seed_option("seed of the random subsets")

    def check(self) -> None:
        """Weights must not all be zero (they are normalised to sum to one).

        Raises
        ------
        ConfigError
            When every weight is zero.
        """
        if self.weights is not None and sum(self.weights) <= 0:
            raise ConfigError("weights must not all be zero (they are normalised to sum to one)")


@dataclass(frozen=True)
class BasinOptions(Options):
    """The sublevel set of a basin analysis.

    Attributes
    ----------
    level
        Loss level below which points belong to a basin; None: the highest loss at the models.
    """

    configures = ("landscape.basin",)

    level: float | None = option(None, help="sublevel of the basin analysis (default: highest loss at the models)")
