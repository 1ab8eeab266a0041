"""The options of the bias/variance/covariance decomposition (IMA Thm. 1), as an option set.

:class:`DecomposeOptions` declares once the keyword arguments of
:func:`~landscape.decomposition.ima.decompose` that the command line offers; ``landscape
decompose`` generates its flags from it and ``docs/api.md`` lists it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..infra.options import Options, option


@dataclass(frozen=True)
class DecomposeOptions(Options):
    """The client weights of the averaged model.

    Attributes
    ----------
    weights
        Client weights ``p_k`` (normalised); None: proportional to the clients' data sizes.
    """

    configures = ("landscape.decompose",)

    weights: list[float] | None = option(None, ge=0, source="IMA Thm. 1 (p_k = |D_k| / |D|)",
                                         help="client weights p_k, non-negative, not all zero (default |D_k|/|D|)")
