"""The options of each claim check (its thresholds and metric) as option sets.

The claim checks also take the keyword groups of the analyses they run: a path's
:class:`~landscape.geometry.options.PathOptions`, a plane's
:class:`~landscape.geometry.options.PlaneOptions`, a group's
:class:`~landscape.geometry.options.GroupOptions` and the eigen-solver's
:class:`~landscape.curvature.options.EigenOptions`; the classes here hold what is the claim's
own. ``landscape check CLAIM`` generates its flags from both, and ``docs/api.md`` lists them.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..curvature.budget import MAX_ITERATIONS
from ..infra.options import Options, option
from ..results.barriers import DEFAULT_THRESHOLD, METRICS

#: The source of :data:`~landscape.results.barriers.DEFAULT_THRESHOLD`.
THRESHOLD_SOURCE = "ours: a 5% relative accuracy drop (Eq. 4/10) or 0.05 nats (Eq. 3/9)"


@dataclass(frozen=True)
class TransitivityOptions(Options):
    """FedGuCci Hypothesis 3.1: when two paths count as connected, and what a baseline must show.

    Attributes
    ----------
    threshold
        Largest barrier counted as connected.
    min_reduction
        With a baseline pair: smallest relative barrier reduction that supports the claim.
    metric
        Barrier metric.
    """

    configures = ("landscape.claims.transitivity",)

    threshold: float = option(DEFAULT_THRESHOLD, ge=0, source=THRESHOLD_SOURCE,
                              help="largest barrier counted as connected (accuracy: relative drop, Eq. 4; loss: "
                                   "Eq. 3)")
    min_reduction: float = option(0.1, help="with a baseline pair: smallest relative barrier reduction that "
                                            "supports the claim")
    metric: str = option("accuracy", choices=METRICS, help="barrier metric")


@dataclass(frozen=True)
class GroupConnectivityOptions(Options):
    """FedGuCci Definition 3.6: when a group of models counts as connected.

    Attributes
    ----------
    threshold
        Largest group barrier counted as connected.
    metric
        Barrier metric.
    by_size
        Also the barriers of random subsets of every size.
    """

    configures = ("landscape.claims.group_connectivity",)

    threshold: float = option(DEFAULT_THRESHOLD, ge=0, source=THRESHOLD_SOURCE,
                              help="largest group barrier counted as connected")
    metric: str = option("accuracy", choices=METRICS, help="barrier metric (Eq. 10 / 9)")
    by_size: bool = option(False, help="also barriers of random subsets of every size K")


@dataclass(frozen=True)
class SharedBasinOptions(Options):
    """IMA Sec. 4 (C2): the plane, the basin level and the barriers of the shared-basin check.

    Attributes
    ----------
    plane_kind
        A plane through the first three clients, or the clients' top-2 PCA around the global model.
    level
        Sublevel ``c`` of the basin; None: the highest loss at the clients.
    barrier_threshold
        Largest client-global barrier consistent with one basin.
    metric
        Barrier metric of the client-global paths.
    """

    configures = ("landscape.claims.shared_basin",)

    plane_kind: str = option("clients", choices=("clients", "pca"),
                             help="plane through the first three clients, or the clients' top-2 PCA around the "
                                  "global model")
    level: float | None = option(None, help="sublevel c of the basin (default: highest loss at the clients)")
    barrier_threshold: float = option(DEFAULT_THRESHOLD, ge=0, source=THRESHOLD_SOURCE,
                                      help="largest client-global barrier consistent with one basin")
    metric: str = option("loss", choices=METRICS, help="barrier metric")


@dataclass(frozen=True)
class FlatterOptions(Options):
    """Model a is flatter than b: the required margin and the optional spectral densities.

    Attributes
    ----------
    margin
        A's top eigenvalue must be below ``(1 - margin)`` times B's.
    density
        Also both spectral densities.
    density_iterations
        Lanczos steps of the densities.
    """

    configures = ("landscape.claims.flatter",)

    margin: float = option(0.0, ge=0, lt=1, help="A must be below (1 - margin) times B")
    density: bool = option(False, help="also both spectral densities (and a figure of them)")
    density_iterations: int = option(50, ge=1, le=MAX_ITERATIONS, help="Lanczos steps of the densities")
