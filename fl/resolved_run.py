"""A run resolved from the arguments of ``fl.run``, before its folder is touched: :func:`resolve_run`.

``fl.api.open_run`` sets up the folder of the resolved run and trains it; the dry run
(:mod:`fl.estimate`) only looks at the folder.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from .algorithms.base import Algorithm
from .config import config_digest
from .datasets import load_dataset
from .initial import apply_init
from .resolve import build_config, make_algorithm, merge_settings
from .template import build_template, check_model_fits, state_digest


@dataclass(frozen=True)
class ResolvedRun:
    """A run's configuration, algorithm, initial model, dataset and folder, before anything is written.

    Attributes
    ----------
    config : dict[str, Any]
        The resolved configuration (as config.json will hold it).
    algorithm : Algorithm
        The configured algorithm.
    template : nn.Module
        The plain architecture with the initial weights.
    bundle : Any
        The dataset (``fl.datasets.load_dataset``).
    path : Path
        The run folder.
    """

    config: dict[str, Any]
    algorithm: Algorithm
    template: nn.Module
    bundle: Any
    path: Path


def resolve_run(algorithm: str | None = None, *, recipe: str | None = None, model: Any = None,
                out: str | os.PathLike | None = None, **settings: Any) -> ResolvedRun:
    """Resolve the arguments of ``fl.run`` into a configuration, load the data and build the initial model.

    Reads (the dataset, the weights of ``init``) and writes nothing; ``fl.api.open_run`` then sets
    up the folder, and a dry run (:mod:`fl.estimate`) only looks at it.

    Parameters
    ----------
    algorithm, recipe, model, out, **settings
        As for ``fl.run``.

    Returns
    -------
    ResolvedRun

    Raises
    ------
    ConfigError, DataError, InitMismatchError
        As for ``fl.run``.
    """
    explicit = dict(settings)
    if algorithm is not None:
        explicit["algorithm"] = algorithm
    merged = merge_settings(recipe, explicit)
    name = merged.pop("algorithm", "fedavg")
    recipe_model = merged.pop("model", None)
    config, alg = build_config(name, model=model if model is not None else recipe_model, recipe=recipe, **merged)
    bundle = load_dataset(config["dataset"], root=config["data_root"], download=config["download"])
    config["num_classes"] = int(bundle.num_classes)
    config["input_shape"] = [int(d) for d in bundle.input_shape]
    template = build_template(config, model if isinstance(model, nn.Module) or callable(model) else None)
    check_model_fits(template, bundle)
    if config["model"].startswith("custom:"):  # tell two custom models of one class apart
        config["model_digest"] = state_digest(template.state_dict())
    frozen = [n for n, p in template.named_parameters() if not p.requires_grad]
    if frozen:  # e.g. a LoRA model's base: not trained, not averaged, not stored per client
        config["frozen"] = frozen
        alg = make_algorithm(config)  # the algorithm reads the frozen names from the configuration
    apply_init(template, config)  # the weights of init=, their digest recorded in the configuration
    path = Path(out) if out is not None else Path("runs") / (
        f"{config['algorithm']}-{config['dataset']}-seed{config['seed']}-{config_digest(config)}")
    return ResolvedRun(config, alg, template, bundle, path)
