"""The worked examples in module and function docstrings run and print what they show."""
from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ("landscape.claims.statistics", "fl.convergence", "fl.algorithms.proximal", "landscape.infra.registry",
           "landscape.curvature.at_point", "landscape.curvature.functions", "landscape.geometry.paths",
           "landscape.geometry.planes", "landscape.results.barriers", "landscape.alignment.align",
           "landscape.space.tensor_spec", "fl.algorithms.fedgucci", "fl.algorithms.robust", "fl.update_checks",
           "landscape.curvature.trace", "landscape.evaluation.evaluator",
           "landscape.curvature.gauss_newton", "landscape.curvature.operators",
           "landscape.curvature.inverse", "landscape.curvature.diagonal")


@pytest.mark.parametrize("name", MODULES)
def test_module_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no example"
    assert result.failed == 0
