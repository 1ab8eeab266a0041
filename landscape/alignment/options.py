"""The options of aligning a model's hidden units to a reference, as an option set.

:class:`AlignOptions` declares once the keyword arguments of
:func:`~landscape.alignment.align.match` that the command line offers, with the function's
defaults, help and source; ``landscape align`` generates its flags from it and ``docs/api.md``
lists it. Method names are the live names of :data:`~landscape.alignment.matchers.MATCHERS`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..infra.options import Options, option, seed_option
from .matchers import MATCHERS


@dataclass(frozen=True)
class AlignOptions(Options):
    """How the permutation aligning a model to a reference is found.

    Attributes
    ----------
    method
        Registered matcher: weight or activation matching.
    seed
        Order of the weight-matching sweeps.
    strict
        Refuse operations whose units cannot be permuted (else leave those units in place).
    """

    configures = ("landscape.connectivity.match",)

    method: str = option("weight", choices=MATCHERS, source="Git Re-Basin (Ainsworth et al. 2023), Alg. 1",
                         help="weight matching (Git Re-Basin Alg. 1) or activation matching (Sec. 3.1, on the "
                              "data)")
    seed: int = seed_option("order of the weight-matching sweeps")
    strict: bool = option(True, help="refuse operations whose units cannot be permuted (--no-strict leaves their "
                                     "units in place)")
