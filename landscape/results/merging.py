"""Result of a model merge: the merged weights and, on request, the merge checked on the landscape.

Computed by :func:`landscape.merge` (:mod:`landscape.merging`). Registered, so the measurements
round-trip through the HDF5 cache; the merged weights do not (a cache holds numbers): save them
with :func:`landscape.save_state_dict` (``result.state_dict()``).
"""
from __future__ import annotations

import copy
import math
from dataclasses import InitVar, dataclass, field
from typing import Any, ClassVar, Mapping

import numpy as np
import torch
from torch import nn

from ..infra.errors import ConfigError
from .base import Result, register
from .geometry import PathResult


def _worst(values: np.ndarray | None) -> float:
    """The largest value of an array (NaN when it is empty or missing, or holds a NaN)."""
    return float(np.max(values)) if values is not None and np.size(values) else float("nan")


@register
@dataclass(frozen=True, eq=False)
class MergeResult(Result):
    """A merged model and, when an evaluator was given, how it sits on the loss landscape.

    Loss and accuracy are the evaluator's (means over all of its data). Barriers follow FedGuCci
    Eq. 3/4 on the straight path from the merge (alpha = 0) to each endpoint (alpha = 1). With
    ``align=``, every number is that of the merge of the aligned models, and those of the plain
    merge are in :attr:`unaligned`.

    Attributes
    ----------
    method : str
        The merge method (``"mean"``, ``"greedy_soup"``, ``"task_arithmetic"``, ``"ties"``,
        ``"dare"``, ``"slerp"``).
    labels : list
        The merged models' names (the endpoints), in the order given.
    members : list
        The names of the models the merge combines (all of them, or the greedy soup's).
    options : dict
        The method's options as validated (defaults filled in).
    loss, accuracy : float
        The merged model's (NaN without an evaluator).
    base_loss, base_accuracy : float
        The base model's, for the task-vector methods (NaN otherwise).
    endpoint_loss, endpoint_accuracy : np.ndarray or None
        ``(n,)``: each endpoint's.
    loss_barrier, accuracy_barrier : np.ndarray or None
        ``(n,)``: barrier of the path from the merge to each endpoint (FedGuCci Eq. 3/4).
    sharpness : float
        L2 worst-case sharpness ``max_{||e|| <= rho} L(w + e) - L(w)`` of the merge
        (``curvature=True``; NaN otherwise); ``spec["rho"]`` is the radius.
    lambda_max : float
        Top Hessian eigenvalue of the merge (``curvature=True``; NaN otherwise).
    endpoint_sharpness, endpoint_lambda_max : np.ndarray or None
        ``(n,)``: the same of each endpoint.
    paths : list
        Per endpoint, the path from the merge: ``{"alphas", "loss", "accuracy", "search"}``
        (:meth:`path` gives it as a :class:`~landscape.results.PathResult`).
    selection : dict
        The greedy soup's record (held-out scores, order tried, accepted); empty otherwise.
    """

    summary_fields: ClassVar[tuple[str, ...]] = ("method", "loss", "accuracy", "worst_loss_barrier",
                                                 "worst_accuracy_barrier", "sharpness")
    array_fields: ClassVar[tuple[str, ...]] = ("endpoint_loss", "endpoint_accuracy", "loss_barrier",
                                               "accuracy_barrier", "endpoint_sharpness", "endpoint_lambda_max")

    method: str
    labels: list
    members: list = field(default_factory=list)
    options: dict = field(default_factory=dict)
    loss: float = math.nan
    accuracy: float = math.nan
    base_loss: float = math.nan
    base_accuracy: float = math.nan
    endpoint_loss: np.ndarray | None = None
    endpoint_accuracy: np.ndarray | None = None
    loss_barrier: np.ndarray | None = None
    accuracy_barrier: np.ndarray | None = None
    sharpness: float = math.nan
    lambda_max: float = math.nan
    endpoint_sharpness: np.ndarray | None = None
    endpoint_lambda_max: np.ndarray | None = None
    paths: list = field(default_factory=list)
    selection: dict = field(default_factory=dict)
    state: InitVar[Mapping[str, torch.Tensor] | None] = None
    module: InitVar[nn.Module | None] = None

    def __post_init__(self, state: Mapping[str, torch.Tensor] | None, module: nn.Module | None) -> None:
        object.__setattr__(self, "_state", None if state is None else dict(state))
        object.__setattr__(self, "_module", module)

    @property
    def worst_loss_barrier(self) -> float:
        """The largest loss barrier between the merge and an endpoint (NaN without an evaluator)."""
        return _worst(self.loss_barrier)

    @property
    def worst_accuracy_barrier(self) -> float:
        """The largest accuracy barrier between the merge and an endpoint (NaN without an evaluator)."""
        return _worst(self.accuracy_barrier)

    @property
    def unaligned(self) -> Mapping[str, Any]:
        """With ``align=``: the numbers of the merge of the models as given (``spec["unaligned"]``); else empty."""
        return self.spec.get("unaligned", {})

    def path(self, i: int) -> PathResult:
        """The path from the merge (alpha = 0) to endpoint ``i`` (alpha = 1).

        Parameters
        ----------
        i
            The endpoint's position in :attr:`labels`.

        Returns
        -------
        PathResult

        Raises
        ------
        ConfigError
            No path was measured (no evaluator), or ``i`` is out of range.
        """
        if not 0 <= i < len(self.paths):
            raise ConfigError(f"no path {i}: this merge has {len(self.paths)} measured paths (an evaluator= "
                              "measures one per endpoint)")
        p = self.paths[i]
        return PathResult(alphas=np.asarray(p["alphas"], float), loss=np.asarray(p["loss"], float),
                          accuracy=np.asarray(p["accuracy"], float), search=p.get("search", {}),
                          spec={"kind": "path", "from": "merge", "to": self.labels[i]})

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The merged weights, by name (a new dict of the merge's tensors).

        Returns
        -------
        dict[str, torch.Tensor]

        Raises
        ------
        ConfigError
            The result was read back from a cache, which stores the measurements only.
        """
        state = getattr(self, "_state", None)
        if state is None:
            raise ConfigError("this MergeResult holds no weights (a cache stores its numbers only); merge again, "
                              "or save the weights with landscape.save_state_dict(result.state_dict(), path)")
        return dict(state)

    @property
    def model(self) -> nn.Module:
        """A copy of the architecture holding the merged weights.

        Raises
        ------
        ConfigError
            No architecture is known (every model was a state_dict or a file and neither
            ``template=`` nor ``evaluator=`` was given), or no weights are held.
        """
        module = getattr(self, "_module", None)
        if module is None:
            raise ConfigError("the merge knows no architecture: pass template= (an nn.Module) or evaluator= to "
                              "landscape.merge, or load result.state_dict() into your module")
        out = copy.deepcopy(module)
        out.load_state_dict(self.state_dict())
        return out
