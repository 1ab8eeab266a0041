"""Group barriers of K models around their fused model (FedGuCci Definition 3.6, Eq. 9/10)."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..evaluation.dry_run import estimate_points
from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError
from ..infra.estimate import JobEstimate
from ..results import GroupResult
from ..results.barriers import group_accuracy_barrier, group_loss_barrier, normalise_weights, warn_nonfinite
from ..results.group_size import GroupSizeResult
from ..space.params import ModelLike
from ..space.points import PointSet
from ..space.subsets import ParamsLike, restrict_models
from .options import GroupOptions


def group_barrier(models: Sequence[ModelLike], evaluator: PointEvaluator, *,
                  weights: Sequence[float] | np.ndarray | None = None, align: str | None = None,
                  params: ParamsLike = None, dry_run: bool = False) -> GroupResult | JobEstimate:
    """Barrier of the fused model ``sum_i mu_i w_i`` against the members' weighted metrics.

    ``mu`` is uniform (the paper) unless ``weights`` are given (normalised to sum to one, e.g.
    client data sizes as in FedAvg). The group barriers of FedGuCci Eq. 9/10 are properties of
    the result (``docs/barriers.md``).

    Parameters
    ----------
    models
        At least two model-likes (``nn.Module``, state_dict, checkpoint path or flat vector).
    evaluator
        Evaluates the loss and accuracy of the members and of the fused model.
    weights
        Non-negative mixing weights mu_i, one per model (default uniform).
    align
        ``None``, ``"weight"`` or ``"activation"``: first permute every member's hidden units to
        match the first member (:func:`landscape.alignment.align`), then fuse: the group
        barrier "modulo permutation". The unaligned barriers are kept in ``spec["unaligned"]``.
    params
        Parameter subset that is fused (``None``: every entry; ``"trainable"``; or ``fnmatch``
        patterns, :mod:`landscape.space.subsets`). The rest stays at the first member, and every
        member must equal it there; ``spec["params"]`` records the subset.
    dry_run
        Compute nothing: return what the barrier will cost (:mod:`landscape.evaluation.dry_run`).

    Returns
    -------
    GroupResult or JobEstimate
        The normalised weights, each member's loss and accuracy, and the fused model's, with
        ``loss_barrier`` (Eq. 9) and ``accuracy_barrier`` (Eq. 10); with ``dry_run=True`` the
        :class:`~landscape.infra.estimate.JobEstimate`.

    Raises
    ------
    ConfigError
        If there are fewer than two models, ``params`` matches nothing or is combined with
        ``align``, a member differs from the first outside ``params``, or ``dry_run`` is combined
        with ``align`` (an alignment is computed, not estimated).
    ValueError
        If the weights are not one finite, non-negative number per model, not all zero.
    """
    if dry_run:
        if align is not None:
            raise ConfigError(f"dry_run cannot estimate align={align!r} (the alignment itself would be computed); "
                              "estimate without align")
        return estimate_points("group_barrier", evaluator,
                               lambda ev: group_barrier(models, ev, weights=weights, params=params))
    vecs = torch.stack([evaluator.vector(m) for m in models])
    if len(vecs) < 2:
        raise ConfigError("a group barrier needs at least two models")
    evaluator.warn_interpolated_batchnorm()
    mu = normalise_weights(weights, len(vecs))
    spec: dict = {"kind": "group", "evaluator": evaluator.fingerprint()}
    if params is not None and align is not None:
        raise ConfigError("align permutes the whole model and params= fuses a subset: pass one of them")
    if align is not None:
        from ..alignment.align import aligned_vector

        before = group_barrier(vecs, evaluator, weights=mu)
        spec.update(align=align, unaligned={"loss_barrier": before.loss_barrier,
                                            "accuracy_barrier": before.accuracy_barrier})
        vecs = torch.stack([vecs[0]] + [aligned_vector(v, to=vecs[0], evaluator=evaluator, method=align)
                                        for v in vecs[1:]])
    sub, local = restrict_models(evaluator.space, params, list(vecs), [f"member {i}" for i in range(len(vecs))])
    local = torch.stack(local)
    points = PointSet.explicit(torch.cat([local, (torch.from_numpy(mu) @ local)[None]]))
    if sub is not None:  # the members' subset entries written into the first member's other entries
        base = vecs[0].clone()
        base[sub.index] = 0.0
        points = PointSet(base, points.directions, points.coeffs, sub.index)
        spec["params"] = sub.spec()
    loss, acc = evaluator.evaluate_points(points, reference=vecs[0], label="group")
    warn_nonfinite("group barrier", loss, [f"member {i}" for i in range(len(vecs))] + ["the fused model"])
    return GroupResult(weights=mu, member_loss=loss[:-1], member_accuracy=acc[:-1],
                       fused_loss=float(loss[-1]), fused_accuracy=float(acc[-1]), spec=spec)


def group_barrier_by_size(models: Sequence[ModelLike], evaluator: PointEvaluator, *,
                          sizes: Sequence[int] | None = None, draws: int = 5,
                          seed: int = 0) -> GroupSizeResult:
    """Uniform group barriers of ``draws`` random subsets for each group size K (seeded).

    Each subset is drawn without replacement; its fused model is the plain mean of its members
    (FedGuCci Eq. 9/10 with uniform mu, as in its Figure 4). All members and fused models are
    evaluated in one batch of points.

    Parameters
    ----------
    models
        The n model-likes to draw from (``nn.Module``, state_dict, checkpoint path or flat
        vector).
    evaluator
        Evaluates the loss and accuracy of each point.
    sizes
        Group sizes K, each in [2, n] (default ``2, ..., n``).
    draws
        Number of random subsets per size.
    seed
        Seed of the subset draws.

    Returns
    -------
    GroupSizeResult
        The sizes and the ``(len(sizes), draws)`` loss and accuracy barriers.

    Raises
    ------
    ConfigError
        If a size lies outside [2, n], ``draws`` is not a positive integer or ``seed`` not a seed.
    """
    GroupOptions.from_mapping({"draws": draws, "seed": seed})
    vecs = torch.stack([evaluator.vector(m) for m in models])
    n = len(vecs)
    sizes = np.asarray(sizes if sizes is not None else range(2, n + 1), dtype=np.int64)
    if (sizes < 2).any() or (sizes > n).any():
        raise ConfigError(f"group sizes must lie in [2, {n}]")
    evaluator.warn_interpolated_batchnorm()
    rng = np.random.default_rng(seed)
    subsets = [[np.sort(rng.choice(n, size=k, replace=False)) for _ in range(draws)] for k in sizes]
    fused = torch.stack([vecs[s].mean(0) for row in subsets for s in row])
    loss, acc = evaluator.evaluate_points(PointSet.explicit(torch.cat([vecs, fused])),
                                          reference=vecs[0], label="groups")
    m_loss, m_acc = loss[:n], acc[:n]
    f_loss = loss[n:].reshape(len(sizes), draws)
    f_acc = acc[n:].reshape(len(sizes), draws)
    lb = np.array([[group_loss_barrier(f_loss[i, d], m_loss[s], np.full(len(s), 1 / len(s)))
                    for d, s in enumerate(row)] for i, row in enumerate(subsets)])
    ab = np.array([[group_accuracy_barrier(f_acc[i, d], m_acc[s], np.full(len(s), 1 / len(s)))
                    for d, s in enumerate(row)] for i, row in enumerate(subsets)])
    return GroupSizeResult(sizes=sizes, loss_barrier=lb, accuracy_barrier=ab,
                           spec={"kind": "group_by_size", "draws": draws, "seed": seed,
                                 "evaluator": evaluator.fingerprint()})
