"""Greedy soup (Wortsman et al. 2022, Recipe 1): add a model to the soup only if it does not hurt.

The models are sorted by held-out accuracy, best first; the soup starts with the best, and each
next model is added when the held-out accuracy of the mean of the soup and that model is at least
the soup's accuracy so far (``criterion="loss"``: when the held-out loss is at most the soup's,
for evaluators whose metric is not an accuracy). The merge is the uniform mean of the soup.

The held-out data are those of ``held_out=`` (an :class:`~landscape.Evaluator`), or of the
merge's ``evaluator=`` when none is given; the merge's own numbers are then measured on the data
the soup was chosen on, which flatters it. Choosing needs every model as a whole vector.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence

import numpy as np
import torch

from ...evaluation.protocol import PointEvaluator
from ...infra.errors import ConfigError
from ...infra.options import Options, option
from ..registry import METHODS, MergeMethod
from .mean import mean_rule


@dataclass(frozen=True)
class GreedySoupOptions(Options):
    """Options of the greedy soup.

    Attributes
    ----------
    held_out
        The evaluator of the held-out data the soup is chosen on.
    criterion
        What must not get worse when a model is added.
    """

    held_out: Any = option(None, cli=False, help="Evaluator on held-out data (default: the merge's evaluator)")
    criterion: Literal["accuracy", "loss"] = option(
        "accuracy", source="Wortsman et al. 2022, Recipe 1 (held-out accuracy)",
        help="held-out accuracy must not drop (or held-out loss must not rise) when a model is added")


def greedy_select(models: Sequence[Any], labels: Sequence[str], evaluator: PointEvaluator, options: Any
                  ) -> tuple[list[int], dict[str, Any]]:
    """The models of the greedy soup (Wortsman et al. 2022, Recipe 1).

    Parameters
    ----------
    models
        The model-likes, in the order given.
    labels
        Their names.
    evaluator
        The merge's evaluator (used when ``options.held_out`` is None).
    options
        :class:`GreedySoupOptions`.

    Returns
    -------
    tuple
        Indices of the soup's models (in the order they were added) and the record: the held-out
        evaluator's ``criterion``, each model's held-out ``score``, the ``order`` tried, whether each
        was ``accepted`` and the soup's ``soup_score`` after each try.

    Raises
    ------
    ConfigError
        Neither ``held_out`` nor ``evaluator`` is given.
    """
    ev = options.held_out if options.held_out is not None else evaluator
    if ev is None:
        raise ConfigError("greedy_soup chooses models on held-out data: pass held_out=Evaluator(model, data) "
                          "(or evaluator=)")
    vecs = torch.stack([ev.vector(m) for m in models])
    sign = 1.0 if options.criterion == "accuracy" else -1.0

    def score(points: torch.Tensor) -> np.ndarray:
        metrics = ev.evaluate(points)
        return sign * (metrics.accuracy if options.criterion == "accuracy" else metrics.loss)

    scores = score(vecs)
    order = [int(i) for i in np.argsort(-scores, kind="stable")]
    chosen, total, best = [order[0]], vecs[order[0]].clone(), float(scores[order[0]])
    accepted, soup_scores = [True], [best]
    for i in order[1:]:
        trial = float(score(((total + vecs[i]) / (len(chosen) + 1)).unsqueeze(0))[0])
        accepted.append(trial >= best)
        if trial >= best:
            chosen.append(i)
            total += vecs[i]
            best = trial
        soup_scores.append(best)
    record = {"criterion": options.criterion, "score": [sign * float(s) for s in scores],
              "order": [labels[i] for i in order], "accepted": accepted,
              "soup_score": [sign * s for s in soup_scores],
              "held_out": "held_out" if options.held_out is not None else "evaluator"}
    return chosen, record


METHODS.add("greedy_soup", MergeMethod(GreedySoupOptions, mean_rule, select=greedy_select,
                                       source="Wortsman et al. 2022, greedy soup (Recipe 1)"))
