"""The keyword arguments of :func:`landscape.merge` that are not a method's own, as an option set.

:class:`MergeOptions` declares the merge's method and how the merge is checked on the landscape
(paths to the endpoints, curvature, alignment first) once, with :func:`landscape.merge`'s
defaults; ``landscape merge`` generates its flags from it and ``docs/api.md`` lists it. Each
method's own options are the option set of its module in :mod:`landscape.merging.methods`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..infra.errors import ConfigError
from ..infra.options import Options, option
from .registry import METHODS

#: ``alphas`` that asks for the adaptive barrier search (``landscape.interpolate``).
ADAPTIVE = "adaptive"


def parse_alphas(text: str) -> int | str:
    """``--alphas``: a number of points, or ``adaptive``.

    Parameters
    ----------
    text : str
        The flag's value.

    Returns
    -------
    int or str

    Raises
    ------
    ConfigError
        Neither an integer nor ``adaptive``.
    """
    if text == ADAPTIVE:
        return text
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--alphas must be a number of points or 'adaptive', got {text!r}") from None


@dataclass(frozen=True)
class MergeOptions(Options):
    """How models are merged and how the merge is checked.

    Attributes
    ----------
    method
        Registered merge method.
    align
        Permutation-align the models first (to the base, or to the first model).
    curvature
        Also the sharpness and top Hessian eigenvalue of the merge and of each endpoint.
    rho
        Radius of the L2 ball of the sharpness.
    alphas
        Points of each path from the merge to an endpoint, or ``"adaptive"``.
    tol
        Tolerance of the adaptive barrier search.
    """

    configures = ("landscape.merge",)

    method: str = option("mean", choices=METHODS.names, help="merge method")
    align: str | None = option(None, choices=("weight", "activation"),
                               help="permutation-align the models to the base (or the first model) before merging "
                                    "(Git Re-Basin); the plain merge's numbers are kept as 'unaligned'")
    curvature: bool = option(False, help="also the L2 sharpness and the top Hessian eigenvalue of the merge and of "
                                         "each model")
    rho: float = option(0.05, gt=0, le=1e6, source="SAM's default radius (Foret et al. 2021)",
                        help="radius of the L2 ball of the sharpness (weight units)")
    alphas: int | str = option(ADAPTIVE, ge=2, le=100_000, parse=parse_alphas, metavar="N|adaptive",
                               help="points of each path from the merge to a model, or 'adaptive' (batched "
                                    "bisection of the barrier to within --tol)")
    tol: float | None = option(None, gt=0, le=1, help="tolerance of the adaptive barrier search (default 1e-3)")

    def check(self) -> None:
        """Refuse ``alphas`` that is another string than ``"adaptive"``.

        Raises
        ------
        ConfigError
        """
        if isinstance(self.alphas, str) and self.alphas != ADAPTIVE:
            raise ConfigError(f"alphas must be a number of points or 'adaptive', got {self.alphas!r}")
