"""FedProx (Li et al. 2020).

Each client minimises ``L_k(w) + mu / 2 * ||w - w_g||^2`` where ``w_g`` is the model it
received (during IMA, the IMA model; IMA §3.4) and the norm runs over the trainable
parameters. Aggregation is FedAvg's.
"""
from __future__ import annotations

import dataclasses

from torch import Tensor

from landscape.infra.options import Options, option

from .base import Algorithm, LocalContext, State
from .proximal import proximal_term


@dataclasses.dataclass(frozen=True)
class FedProxOptions(Options):
    """Options of FedProx (Li et al. 2020)."""

    mu: float = option(0.01, ge=0, le=1e4, help="proximal coefficient mu",
                       source="FedProx Eq. 2; default: middle of IMA Table 5's grid {0.1, 0.01, 0.001}")


class FedProx(Algorithm):
    """FedProx with proximal coefficient ``mu``.

    Its extra loss depends only on the parameters and the received model, so the
    vectorised back end runs it.
    """

    name = "fedprox"
    Options = FedProxOptions
    vectorizable = True

    def extra_loss(self, ctx: LocalContext, params: State, x: Tensor, y: Tensor,
                   logits: Tensor) -> Tensor:
        """The proximal term ``mu / 2 * sum_j ||w_j - w_g,j||^2`` (FedProx Eq. 2).

        Parameters
        ----------
        ctx : LocalContext
            The client's context (``global_state`` is the received model ``w_g``).
        params : State
            The trainable leaves ``w``.
        x, y, logits : Tensor
            The batch (unused: the term does not depend on it).

        Returns
        -------
        Tensor
            The scalar term.
        """
        return proximal_term(params, ctx.global_state, float(self.opts.mu))
