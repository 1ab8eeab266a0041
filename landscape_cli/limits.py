"""Early refusal of sizes the host cannot hold (``plane --resolution 10001``, ``path --alphas 10**8``)."""
from __future__ import annotations

from landscape.infra.host_memory import check_fits, points_bytes


def check_points(n_points: int, option: str, what: str) -> None:
    """Refuse a point set whose estimated memory exceeds the host's available memory.

    Parameters
    ----------
    n_points : int
        Number of points to evaluate.
    option : str
        The option as typed, e.g. ``"--resolution 10001"``.
    what : str
        What it asks for, e.g. ``"a 10001 x 10001 grid"``.

    Raises
    ------
    ConfigError
        Naming the option, the number of points and the estimate.
    """
    check_fits(points_bytes(n_points), f"{option} ({what}, {n_points:,} points)",
               advice=f"choose a smaller {option.split()[0]}")
