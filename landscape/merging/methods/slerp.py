"""Spherical linear interpolation (SLERP) of two models, tensor by tensor.

For each tensor, with ``cos(Omega) = <theta_0, theta_1> / (|theta_0| |theta_1|)``::

    theta(t) = sin((1 - t) Omega) / sin(Omega) theta_0 + sin(t Omega) / sin(Omega) theta_1

(Shoemake 1985, the slerp formula), applied to the tensors as they are (their norms are not
changed first), as mergekit does. Where the tensors are (nearly) colinear, ``|cos(Omega)| >
dot_threshold``, or one of them is zero, ``sin(Omega)`` vanishes and the formula is replaced by
the straight line ``(1 - t) theta_0 + t theta_1``, its limit for parallel tensors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ...infra.options import Options, option
from ..registry import METHODS, MergeMethod


@dataclass(frozen=True)
class SlerpOptions(Options):
    """Options of SLERP.

    Attributes
    ----------
    t
        Position on the arc: 0 is the first model, 1 the second.
    dot_threshold
        Above this ``|cos(Omega)|`` the tensors count as colinear and are interpolated linearly.
    """

    t: float = option(0.5, ge=0, le=1, help="position on the arc from the first model (0) to the second (1)")
    dot_threshold: float = option(0.9995, gt=0, le=1, source="mergekit's DOT_THRESHOLD",
                                  help="|cos(angle)| above which two tensors are interpolated linearly")


def slerp_rule(thetas: torch.Tensor, base: torch.Tensor | None, weights: torch.Tensor | None, options: Any,
               generator: torch.Generator) -> torch.Tensor:
    """SLERP of the two tensors at ``t`` (Shoemake 1985), linear where they are (nearly) colinear.

    Parameters
    ----------
    thetas
        ``(2, *shape)``: the tensor of each model.
    base, weights, generator
        Unused.
    options
        :class:`SlerpOptions`.

    Returns
    -------
    torch.Tensor
        The merged tensor.
    """
    a, b, t = thetas[0], thetas[1], options.t
    na, nb = float(a.double().norm()), float(b.double().norm())
    cos = float((a.double() * b.double()).sum()) / (na * nb) if na > 0 and nb > 0 else 1.0
    if abs(cos) > options.dot_threshold:
        return (1 - t) * a + t * b
    omega = math.acos(max(-1.0, min(1.0, cos)))
    return (math.sin((1 - t) * omega) * a + math.sin(t * omega) * b) / math.sin(omega)


METHODS.add("slerp", MergeMethod(SlerpOptions, slerp_rule, models=(2, 2),
                                 source="Shoemake 1985, spherical linear interpolation (as in mergekit)"))
