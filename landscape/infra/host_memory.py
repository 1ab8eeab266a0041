"""Host memory: how much is available, and an early refusal of work that cannot fit in it.

A grid, a path or a set of models whose bookkeeping would not fit in the host's memory is
refused before anything is allocated, with the estimate in the message (instead of an
allocation that runs until the machine is out of memory).
"""
from __future__ import annotations

import os

from .errors import ConfigError

#: Host bytes per evaluated point of a path or a plane: coordinates, per-point metrics, the
#: result arrays and the basin analysis. Measured with ``landscape plane --no-figures`` on a
#: small MLP: the peak resident memory grows by 56 bytes per grid point (resolution 101 ->
#: 301 -> 501); rounded up.
POINT_BYTES = 64


def available_bytes() -> int | None:
    """Memory the host can give to a new allocation without swapping.

    Returns
    -------
    int or None
        ``MemAvailable`` of ``/proc/meminfo`` (Linux), else the free physical pages; None
        when neither is known.
    """
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units, e.g. ``"23.8 GiB"``.

    Parameters
    ----------
    n : float
        A number of bytes.

    Returns
    -------
    str
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def points_bytes(n_points: int, per_point: int = POINT_BYTES) -> int:
    """Estimated host memory of evaluating ``n_points`` points of a path or plane.

    Parameters
    ----------
    n_points : int
        Number of points (a plane of resolution ``r`` has ``r**2``).
    per_point : int
        Bytes per point (:data:`POINT_BYTES` by default).

    Returns
    -------
    int
    """
    return int(n_points) * int(per_point)


def check_fits(needed: int, what: str, *, available: int | None = None, advice: str = "") -> None:
    """Refuse work whose estimated memory exceeds what the host has available.

    Parameters
    ----------
    needed : int
        Estimated bytes (e.g. from :func:`points_bytes`).
    what : str
        What needs them, naming the option, e.g. ``"--resolution 10001 (a 10001 x 10001 grid)"``.
    available : int, optional
        Bytes available (default: :func:`available_bytes`; nothing is refused when unknown).
    advice : str
        What to do instead, appended to the message.

    Raises
    ------
    ConfigError
        ``"<what> needs about X of memory, but only Y are available ..."``.
    """
    if available is None:
        available = available_bytes()
    if available is not None and needed > available:
        raise ConfigError(f"{what} needs about {format_bytes(needed)} of memory, but only "
                          f"{format_bytes(available)} are available{'; ' + advice if advice else ''}")
