"""fl.recipes: every recipe is a valid fl.run configuration whose every value has a source."""
from __future__ import annotations

import pytest
import torch

import fl
from fl.recipes import RECIPES, Recipe, scaled_decay

PAPERS = ("FedGuCci", "FLOCO", "IMA", "LSS")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


def test_one_scaled_recipe_per_paper_and_sources_cover_settings():
    for paper in PAPERS:
        mine = [r for r in RECIPES.values() if r.paper.startswith(paper)]
        assert any(r.settings["dataset"] == "mnist1d" for r in mine), paper
        assert any(r.settings["dataset"] != "mnist1d" for r in mine), paper
    for name, recipe in RECIPES.items():
        assert isinstance(recipe, Recipe) and recipe.name == name and recipe.notes
        assert set(recipe.sources) == set(recipe.settings) - {"algorithm"}, name
        with pytest.raises(AttributeError):
            recipe.name = "other"  # frozen


def test_scaled_decay_keeps_the_total_decay():
    g = scaled_decay(0.01, 400, 40)
    assert abs((1 - g) ** 40 - 0.99 ** 400) < 1e-3 * 0.99 ** 400 * 40
    assert scaled_decay(0.01, 150, 150) == 0.01


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_is_a_valid_run_configuration(name, data_root, tmp_path, monkeypatch):
    """fl.run accepts every setting (option names and values are checked); round 0 only.

    Recipes on data sets that are not embedded are checked on MNIST-1D with its MLP.
    """
    monkeypatch.setenv("LANDSCAPE_DATA", str(data_root))
    if RECIPES[name].settings["dataset"] == "mnist1d":  # through fl.run's recipe argument
        run = fl.run(recipe=name, rounds=0, out=tmp_path / "run", device="cpu")
        assert run.config["recipe"] == name and run.config["model"] == RECIPES[name].settings["model"]
    else:
        settings = dict(RECIPES[name].settings)
        settings.update(dataset="mnist1d", model="mnist1d_mlp", rounds=0)
        run = fl.run(**settings, out=tmp_path / "run", device="cpu")
    for key in ("clients", "local_epochs", "batch_size", "lr", "partition", "participation"):
        assert run.config[key] == RECIPES[name].settings[key], key


@pytest.mark.parametrize("name, algorithm", [("fedgucci-mnist1d", "fedavg"), ("ima-mnist1d", "fedprox"),
                                             ("floco-mnist1d", "fedavg"), ("lss-mnist1d", "fedgucci")])
def test_a_recipe_is_a_setting_any_algorithm_runs_in(name, algorithm, data_root, tmp_path, monkeypatch):
    """The baseline keeps the recipe's data, model, optimiser and partition.

    The recipe algorithm's own options are dropped and recorded, and the run's partition is
    the one the recipe's own algorithm draws (same seed): the two arms are paired.
    """
    from fl.resolve import foreign_recipe_options

    monkeypatch.setenv("LANDSCAPE_DATA", str(data_root))
    recipe = RECIPES[name].settings
    baseline = fl.run(algorithm, recipe=name, rounds=0, out=tmp_path / "baseline", device="cpu")
    own = fl.run(recipe=name, rounds=0, out=tmp_path / "own", device="cpu")
    assert baseline.config["algorithm"] == algorithm and own.config["algorithm"] == recipe["algorithm"]
    dropped = baseline.config["recipe_dropped"]
    assert dropped == foreign_recipe_options(name, algorithm) and dropped  # each pair drops something
    assert all(recipe[k] == v and k not in baseline.config["options"] for k, v in dropped.items())
    assert own.config["recipe_dropped"] == {}
    for key in ("dataset", "model", "clients", "lr", "batch_size", "local_epochs", "partition", "seed"):
        assert baseline.config[key] == own.config[key], key
    for c, data in own.client_datasets().items():  # the same clients hold the same signals
        torch.testing.assert_close(baseline.client_datasets()[c].tensors[1], data.tensors[1], rtol=0, atol=0)
    if "floco" not in (algorithm, recipe["algorithm"]):  # FLOCO's round-0 model is its simplex's centre
        torch.testing.assert_close(baseline.global_state(0), own.global_state(0), rtol=0, atol=0)  # same init
    assert fl.load_run(tmp_path / "baseline").config["recipe_dropped"] == dropped  # stored in config.json
