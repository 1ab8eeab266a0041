"""From ``fl.run`` arguments to a stored configuration and the algorithm object.

Precedence, lowest first: :class:`~fl.config.RunConfig` defaults, the algorithm's
``engine_defaults``, the recipe's settings (``fl.RECIPES``), the arguments passed
explicitly. Each setting is validated by the type and range declared for it (RunConfig, the
algorithm's ``Options``, IMA's options for ``ima=``).
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

from torch import nn

from landscape.infra.errors import ConfigError
from landscape.infra.options import did_you_mean

from . import algorithms
from .algorithms.base import Algorithm
from .config import CONFIG_VERSION, RunConfig
from .recipes import RECIPES
from .tracking import resolve_track

#: Wrapper composed around the algorithm by the RunConfig field ``ima``.
IMA_WRAPPER = "ima"


def recipe_settings(recipe: str | None) -> dict[str, Any]:
    """The settings of a recipe (empty for None).

    Parameters
    ----------
    recipe : str or None
        A key of ``fl.RECIPES``.

    Returns
    -------
    dict[str, Any]
        ``fl.run`` keyword arguments.

    Raises
    ------
    ConfigError
        For an unknown recipe.
    """
    if recipe is None:
        return {}
    if not isinstance(recipe, str) or recipe not in RECIPES:
        known = ", ".join(RECIPES) or "none defined"
        raise ConfigError(f"unknown recipe {recipe!r}{did_you_mean(str(recipe), RECIPES)}; available: {known}")
    return dict(RECIPES[recipe].settings)


def foreign_recipe_options(recipe: str | None, algorithm: str) -> dict[str, Any]:
    """The recipe's algorithm options that ``algorithm`` does not have.

    A recipe is a setting any algorithm can run in: ``fl.run("fedavg",
    recipe="fedgucci-mnist1d")`` is the natural baseline of FedGuCci. The data, model,
    optimiser and partition stay; options of the recipe's own algorithm (FedGuCci's ``beta``
    and ``anchors``) are dropped and recorded in ``config.json`` as ``recipe_dropped``.

    Parameters
    ----------
    recipe : str or None
        A key of ``fl.RECIPES``.
    algorithm : str
        The algorithm that runs.

    Returns
    -------
    dict[str, Any]
        Option -> the recipe's value, for every recipe setting that is neither a RunConfig
        field nor an option of ``algorithm`` (empty without a recipe).
    """
    settings = recipe_settings(recipe)
    own = algorithms.get(algorithm).Options.fields()
    run_fields = RunConfig.fields()
    return {k: v for k, v in settings.items()
            if k not in ("algorithm", "model") and k not in run_fields and k not in own}


def merge_settings(recipe: str | None, explicit: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe's settings overridden by the explicitly passed ones.

    Options that belong to the recipe's algorithm but not to the one that runs are left out
    (see :func:`foreign_recipe_options`).

    Parameters
    ----------
    recipe : str or None
        A key of ``fl.RECIPES``.
    explicit : Mapping[str, Any]
        The arguments the caller passed (only those).

    Returns
    -------
    dict[str, Any]
        Merged settings (``algorithm`` included when either gives it).
    """
    settings = recipe_settings(recipe)
    chosen = explicit.get("algorithm", settings.get("algorithm", "fedavg"))
    foreign = foreign_recipe_options(recipe, chosen) if recipe is not None else {}
    return {**{k: v for k, v in settings.items() if k not in foreign}, **explicit}


def build_config(algorithm: str = "fedavg", *, options: Mapping[str, Any] | None = None,
                 model: Any = None, recipe: str | None = None, **settings: Any
                 ) -> tuple[dict[str, Any], Algorithm]:
    """The validated configuration of a run and the algorithm object it describes.

    Parameters
    ----------
    algorithm : str
        Registered algorithm name.
    options : Mapping[str, Any], optional
        The algorithm's options (may also be passed among ``settings``).
    model : str, nn.Module, callable or None
        Zoo name, or a custom module (recorded as ``"custom:<class name>"``).
    recipe : str, optional
        Recipe name, recorded in the configuration (its settings must already be merged).
    **settings : Any
        RunConfig fields and algorithm options.

    Returns
    -------
    tuple[dict[str, Any], Algorithm]
        The JSON-ready configuration (without ``num_classes``/``input_shape``, added once
        the data is loaded) and the algorithm.

    Raises
    ------
    ConfigError
        For an unknown setting (with the closest valid name), a wrong type, a non-finite or
        out-of-range value, or ``ima`` given to an algorithm that already is a wrapper.
    """
    from .models import default_model

    cls = algorithms.get(algorithm)
    run_fields = RunConfig.fields()
    given = {**(options or {}), **settings}
    own = {k: v for k, v in given.items() if k in cls.Options.fields()}
    run_values = {k: v for k, v in given.items() if k in run_fields}
    if isinstance(run_values.get("init"), os.PathLike):  # stored as the text of the path
        run_values["init"] = os.fspath(run_values["init"])
    if "track" in run_values:  # an fl.Track or a dict of its fields, stored with every field
        run_values["track"] = resolve_track(run_values["track"])
    unknown = sorted(set(given) - set(own) - set(run_values))
    if unknown:
        raise ConfigError(_unknown_message(unknown, cls))
    custom = isinstance(model, nn.Module) or (callable(model) and not isinstance(model, str))
    if custom:
        model_name = f"custom:{type(model).__name__ if isinstance(model, nn.Module) else model.__name__}"
    elif model is not None:
        model_name = model
    else:
        model_name = None
    values = {**cls.engine_defaults, **run_values, "algorithm": algorithm, "model": model_name}
    run = RunConfig.from_mapping(values)
    config: dict[str, Any] = {"version": CONFIG_VERSION, **run.to_dict()}
    if config["model"] is None:
        config["model"] = default_model(run.dataset)
    config["recipe"] = recipe
    if recipe is not None:
        config["recipe_dropped"] = foreign_recipe_options(recipe, algorithm)
    config["options"] = cls.resolve_options(own, config)
    config["ima"] = _wrapper_options(cls, run.ima, config)
    config = json.loads(json.dumps(config))  # exactly what config.json will hold
    return config, make_algorithm(config)


def make_algorithm(config: Mapping[str, Any]) -> Algorithm:
    """The algorithm object of a stored configuration (IMA composed around it when ``ima``).

    Parameters
    ----------
    config : Mapping[str, Any]
        A configuration from :func:`build_config` or a run folder.

    Returns
    -------
    Algorithm
        The algorithm, built from the stored resolved options.
    """
    alg = algorithms.get(config["algorithm"])(config["options"], config)
    if config.get("ima"):
        alg = algorithms.get(IMA_WRAPPER)(config["ima"], config, base=alg)
    return alg


def _wrapper_options(cls: type[Algorithm], value: Any, config: Mapping[str, Any]) -> dict[str, Any] | None:
    """Resolved IMA options of the ``ima`` setting (None when off)."""
    if value in (False, None):
        return None
    wrapper = algorithms.get(IMA_WRAPPER)
    if cls.wraps:
        raise ConfigError(f"algorithm {cls.name!r} is already a wrapper; drop the ima= option")
    return wrapper.resolve_options({} if value is True else value, config)


def _unknown_message(unknown: list[str], cls: type[Algorithm]) -> str:
    """One line: the unknown settings, who owns them, the closest names, the valid ones."""
    valid = sorted({*RunConfig.fields(), *cls.Options.fields(), "progress", "on_round", "out", "recipe"})
    owners = {k: [n for n, c in algorithms.registry().items() if k in c.Options.fields()] for k in unknown}
    hints = [f"{k} is an option of {', '.join(owners[k])}" if owners[k] else f"{k}{did_you_mean(k, valid)}"
             for k in unknown]
    return (f"unknown option(s) {', '.join(unknown)} for algorithm {cls.name!r} ({'; '.join(hints)}); "
            f"valid options: {', '.join(valid)}")
