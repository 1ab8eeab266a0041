"""FedAvg (McMahan et al. 2017).

Local SGD, then the data-size-weighted average ``w = sum_k n_k / sum_j n_j * w_k`` of
the participants' whole state_dicts (BatchNorm buffers included). Everything is
inherited from :class:`~fl.algorithms.base.Algorithm`.
"""
from __future__ import annotations

from .base import Algorithm


class FedAvg(Algorithm):
    """FedAvg, the default behaviour of :class:`Algorithm` (IMA §3.1.1, FedGuCci Eq. 2)."""

    name = "fedavg"
    vectorizable = True
