"""Recipes: the settings of a paper's experiment, each value with its source.

``fl.run(recipe=NAME, ...)`` applies ``RECIPES[NAME].settings`` first; arguments passed
explicitly override them. The run's ``config.json`` records the recipe name and the resolved
values.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Recipe:
    """The settings of one experiment of a paper.

    Parameters
    ----------
    name : str
        Key of the recipe in :data:`RECIPES`.
    paper : str
        The paper whose experiment this is.
    settings : Mapping[str, Any]
        ``fl.run`` keyword arguments (``algorithm`` and algorithm options included).
    sources : Mapping[str, str]
        Setting -> where its value comes from (a section of the paper, the official code, or
        "ours: ..." for values chosen here).
    notes : str
        Free text: deviations from the paper and why.
    """

    name: str
    paper: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    notes: str = ""


#: name -> recipe
RECIPES: Mapping[str, Recipe] = {}
