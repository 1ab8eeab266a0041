"""Tallies of the fault-injection cases, shared by every test module that injects faults.

Kills survived, corrupt inputs tried, bad inputs and hostile files refused.

``conftest.pytest_terminal_summary`` prints the totals once at the end of the run, so the
summary line counts the cases of every module that ran.
"""
from __future__ import annotations

#: Category -> number of cases the tests ran and survived.
COUNTS: dict[str, int] = {"kills survived": 0, "corrupt inputs tried": 0, "bad inputs rejected": 0,
                          "hostile files refused": 0}


def tally(category: str, n: int = 1) -> None:
    """Add ``n`` cases to ``category`` (one of :data:`COUNTS`'s keys).

    Parameters
    ----------
    category
        The kind of fault.
    n
        How many cases the calling test ran.
    """
    if category not in COUNTS:
        raise KeyError(f"unknown fault category {category!r}; one of {sorted(COUNTS)}")
    COUNTS[category] += n


def summary() -> str:
    """The one-line summary printed after the run.

    Returns
    -------
    str
        ``"fault injection: kills survived: N, ..."``.
    """
    return "fault injection: " + ", ".join(f"{k}: {v}" for k, v in COUNTS.items())
