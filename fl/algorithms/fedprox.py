"""FedProx (Li et al. 2020): each client minimises
``L_k(w) + mu / 2 * ||w - w_g||^2`` where ``w_g`` is the model it received (during IMA, the
IMA model; IMA §3.4) and the norm runs over the trainable parameters. Aggregation is
FedAvg's."""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import Tensor

from landscape.infra.errors import ConfigError

from .base import Algorithm, LocalContext, State


class FedProx(Algorithm):
    """FedProx with proximal coefficient ``mu`` (default 0.01, the middle of the grid
    {0.1, 0.01, 0.001} searched in the IMA paper, Table 5)."""

    name = "fedprox"
    options = {"mu": 0.01}

    @classmethod
    def resolve_options(cls, given: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        opts = super().resolve_options(given, config)
        try:
            opts["mu"] = float(opts["mu"])
        except (TypeError, ValueError):
            raise ConfigError(f"fedprox option mu must be a number, got {opts['mu']!r}") from None
        if not opts["mu"] >= 0:
            raise ConfigError(f"fedprox option mu must be >= 0, got {opts['mu']}")
        return opts

    def extra_loss(self, ctx: LocalContext, params: State, x: Tensor, y: Tensor,
                   logits: Tensor) -> Tensor:
        """The proximal term ``mu / 2 * sum_j ||w_j - w_g,j||^2`` (FedProx Eq. 2)."""
        sq = sum(((p - ctx.global_state[name]) ** 2).sum() for name, p in params.items())
        return 0.5 * self.opts["mu"] * torch.as_tensor(sq)
