"""Early refusal of sizes the host cannot hold, and the bounds of counts typed on the command line.

Sizes such as ``plane --resolution 10001`` or ``path --alphas 10**8`` are refused early; the bounds of
the counts are documented.

The estimate is :func:`landscape.infra.host_memory.points_bytes` (the analysis itself) plus
:data:`FIGURE_POINT_BYTES` per point when the command draws its figures.

Counts are bounded by the ranges of their options (declared once, in the option sets the flags
are generated from), so a usage error names the option and the limit: Hessian-vector products
(``--max-iter``) and Lanczos steps (``--iterations``, ``--density-iterations``) by
:data:`landscape.curvature.budget.MAX_ITERATIONS`, density probes (``--runs``) by
:data:`~landscape.curvature.budget.MAX_RUNS`, and the number of classes (given by
``--num-classes`` or inferred from the labels) by :data:`MAX_CLASSES`.
"""
from __future__ import annotations

from landscape.infra.host_memory import POINT_BYTES, check_fits, points_bytes

#: Host bytes per plotted point of a path or plane: the matplotlib contour and image of the
#: grid and the plotly page that embeds it. Measured with ``landscape plane`` on a small MLP:
#: the peak resident memory grows by 1044 bytes per grid point with figures (resolution
#: 101 -> 301 -> 501) against 56 without them.
FIGURE_POINT_BYTES = 1100
#: Most classes (model outputs) of a model built from a module spec: ``--num-classes``, or the
#: largest integer label + 1 when it is inferred from the data (ImageNet-21k has 21,841).
MAX_CLASSES = 100_000


def check_points(n_points: int, option: str, what: str, *, figures: bool) -> None:
    """Refuse a point set whose estimated memory exceeds the host's available memory.

    Parameters
    ----------
    n_points : int
        Number of points to evaluate.
    option : str
        The option as typed, e.g. ``"--resolution 10001"``.
    what : str
        What it asks for, e.g. ``"a 10001 x 10001 grid"``.
    figures : bool
        Whether the command draws the points (adds :data:`FIGURE_POINT_BYTES` per point).

    Raises
    ------
    ConfigError
        Naming the option, the number of points and the estimate.
    """
    per_point = POINT_BYTES + (FIGURE_POINT_BYTES if figures else 0)
    check_fits(points_bytes(n_points, per_point), f"{option} ({what}, {n_points:,} points)",
               advice=f"choose a smaller {option.split()[0]}" + (" or pass --no-figures" if figures else ""))
