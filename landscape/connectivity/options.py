"""The training and evaluation options of a curve between two models, as an option set.

:class:`CurveOptions` declares once the keyword arguments of
:func:`~landscape.connectivity.curves.curve` that the command line offers, with the function's
defaults, ranges, help and source; ``landscape curve`` generates its flags from it and
``docs/api.md`` lists it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..infra.options import Options, option, seed_option
from ..results.curve_shapes import KINDS


@dataclass(frozen=True)
class CurveOptions(Options):
    """A Bezier curve or polygonal chain between two models: its shape, SGD training and evaluation grid.

    Attributes
    ----------
    kind
        Curve family.
    bends
        Trainable knots.
    epochs, lr, momentum, batch_size, weight_decay
        SGD settings of the knots' training.
    points
        Evaluation points on the curve, both ends included.
    seed
        Mini-batch order and the draws of ``t``.
    """

    configures = ("landscape.curve",)

    kind: str = option("bezier", choices=KINDS, help="curve family")
    bends: int = option(1, ge=1, source="Garipov et al. 2018: the quadratic Bezier curve / three-point chain",
                        help="trainable knots")
    epochs: int = option(20, ge=1, help="training epochs")
    lr: float = option(0.05, gt=0, help="SGD learning rate")
    momentum: float = option(0.9, ge=0, lt=1, help="SGD momentum")
    batch_size: int = option(128, ge=1, flag="--train-batch-size", help="SGD mini-batch size")
    weight_decay: float = option(0.0, ge=0, help="SGD weight decay")
    points: int = option(21, ge=2, help="evaluation points on the curve (both ends included)")
    seed: int = seed_option("mini-batch order and t draws")
