"""Typed options: validation, the config digest, the stored config schema, recipes, the command line.

Validation is generated from RunConfig and the algorithms' Options (NaN, infinity, ranges,
types, unknown keys with did-you-mean); the schema is that of a stored config.json; recipes
apply first, explicit arguments override them; the generated command line has flags for
every setting and one-line errors.
"""
from __future__ import annotations

import hashlib
import json

import pytest
import torch

import fl
from fl import resolve
from fl.algorithms import registry
from fl.cli import build_parser, main, run_from_args
from fl.config import DIGEST_WHEN_SET, RunConfig, check_stored_config, config_digest, volatile_keys
from fl.recipes import Recipe
from fl.resolve import build_config
from landscape import CheckpointError, ConfigError

TINY = dict(dataset="digits", clients=3, rounds=1, batch_size=64, lr=0.1, progress=False, device="cpu")


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A real stored run (its config.json is the reference of the schema tests)."""
    path = tmp_path_factory.mktemp("run")
    fl.run("fedprox", out=path, mu=0.2, **TINY)
    return path


@pytest.mark.parametrize("bad,name", [
    (dict(momentum=float("nan")), "momentum"), (dict(weight_decay=float("inf")), "weight_decay"),
    (dict(lr=1e30), "lr"), (dict(lr=0.0), "lr"), (dict(momentum=1.0), "momentum"),
    (dict(seed=2**70), "seed"), (dict(seed=-1), "seed"), (dict(clients=2.0), "clients"),
    (dict(clients=True), "clients"), (dict(participation=0.0), "participation"),
    (dict(save_clients=[-5]), "save_clients"), (dict(save_clients=[7]), "save_clients"),
    (dict(save_clients="some"), "save_clients"), (dict(partition_options={"bogus": 1}), "bogus"),
    (dict(partition_options={"min_size": float("nan")}), "partition_options.min_size"),
    (dict(partition="zipf"), "partition"), (dict(backend="gpu"), "backend"), (dict(batch_size=-1), "batch_size"),
    (dict(mu=float("nan")), "fedprox option mu"), (dict(mu=-1.0), "fedprox option mu"),
    (dict(ima={"window": 0}), "ima option window"), (dict(ima={"decay": float("inf")}), "ima.decay"),
])
def test_bad_values_give_one_line_errors_naming_the_option(tmp_path, bad, name):
    with pytest.raises(ConfigError) as exc:
        fl.run("fedprox", out=tmp_path, **{**TINY, **bad})
    assert name in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "config.json").exists()


def test_unknown_settings_suggest_the_closest_name(tmp_path):
    with pytest.raises(ConfigError, match=r"lrr \(did you mean 'lr'\?\)"):
        fl.run("fedavg", lrr=0.1, out=tmp_path, **TINY)
    with pytest.raises(ConfigError, match="mu is an option of fedprox"):
        fl.run("fedavg", mu=0.1, out=tmp_path, **TINY)
    with pytest.raises(ConfigError, match=r"unknown algorithm 'fedprx' \(did you mean 'fedprox'\?\)"):
        fl.run("fedprx", out=tmp_path, **TINY)


def test_numbers_are_normalised_and_bounds_are_inclusive_where_declared():
    config, _ = build_config("ima", clients=2, rounds=4, lr=100, momentum=0, weight_decay=1, window=2)
    assert config["lr"] == 100.0 and isinstance(config["lr"], float) and config["weight_decay"] == 1.0
    assert config["options"]["start_round"] == 4  # floor(0.75 * 4) + 1 (IMA Sec. 6)
    assert config["options"]["window"] == 2 and config["ima"] is None


def test_every_option_declares_help_and_every_algorithm_option_a_source():
    for name, field in RunConfig.fields().items():
        assert field.metadata["help"], name
    for alg, cls in registry().items():
        for name, field in cls.Options.fields().items():
            assert field.metadata["help"] and field.metadata["source"], (alg, name)


def test_digest_is_the_hash_of_the_non_volatile_settings():
    config, _ = build_config("fedavg", clients=2, rounds=1)
    later = {"aggregator": "mean", "aggregator_options": {}, "clip_norm": None, "track": None}  # digested when set
    assert set(DIGEST_WHEN_SET) == set(later) and all(config[k] == v for k, v in later.items())
    volatile = {"device", "data_root", "download", "backend", "n_jobs", "init", "recipe", "recipe_dropped",
                "bad_clients"}  # init's weights enter the digest as init_digest; bad_clients acts only on a fault,
    stable = {k: v for k, v in config.items() if k not in (*volatile, *later)}  # and a dropped client is recorded
    assert set(volatile_keys()) == volatile
    assert config_digest(config) == hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()[:10]
    assert config_digest({**config, "device": "cuda", "backend": "vectorized", "recipe": "x"}) == config_digest(config)
    assert config_digest({**config, "lr": 0.2}) != config_digest(config)
    assert config_digest({**config, "aggregator": "median"}) != config_digest(config)
    assert config_digest({**config, "clip_norm": 1.0}) != config_digest(config)
    assert config_digest({**config, "track": {"every": 5}}) != config_digest(config)


def test_stored_config_schema(stored):
    text = (stored / "config.json").read_text()
    config = json.loads(text)
    assert check_stored_config(config, "c") == config  # a config of this version reads back unchanged
    assert fl.load_run(stored).config == config
    cases = [({**config, "version": 2}, "another version"), ({**config, "model": 5}, "model must be a string"),
             ({**config, "num_classes": 1e10}, "num_classes"), ({**config, "lr": "fast"}, "lr must be a number"),
             ({k: v for k, v in config.items() if k != "num_classes"}, "lacks num_classes"),
             ({**config, "colour": 1}, "unexpected key 'colour'"), ([config], "JSON object"),
             ({**config, "input_shape": [1, 8, -8]}, "input_shape")]
    for bad, message in cases:
        with pytest.raises(ConfigError, match=message):
            check_stored_config(bad, "config.json")
    (stored / "config.json").write_text(json.dumps({**config, "momentum": "NaN"}))
    try:
        with pytest.raises(ConfigError, match="momentum"):
            fl.load_run(stored)
    finally:
        (stored / "config.json").write_text(text)


def test_recipe_applied_first_and_explicit_arguments_override(tmp_path, monkeypatch):
    recipe = Recipe(name="tiny-prox", paper="FedProx (Li et al. 2020)",
                    settings={"algorithm": "fedprox", "mu": 0.3, "clients": 3, "lr": 0.2, "rounds": 1},
                    sources={"mu": "ours: test", "lr": "ours: test"}, notes="")
    monkeypatch.setattr(resolve, "RECIPES", {"tiny-prox": recipe})
    run = fl.run(recipe="tiny-prox", lr=0.1, out=tmp_path / "a", progress=False, device="cpu", batch_size=64)
    assert run.config["recipe"] == "tiny-prox" and run.config["algorithm"] == "fedprox"
    assert run.config["lr"] == 0.1 and run.config["options"] == {"mu": 0.3} and run.config["clients"] == 3
    plain = fl.run("fedprox", mu=0.3, clients=3, lr=0.1, rounds=1, out=tmp_path / "b", progress=False,
                   device="cpu", batch_size=64)
    assert config_digest(plain.config) == config_digest(run.config)  # same resolved values, same run
    baseline = fl.run("fedavg", recipe="tiny-prox", out=tmp_path / "c", progress=False, device="cpu",
                      batch_size=64)  # the explicit algorithm wins and runs in the recipe's setting
    assert baseline.config["algorithm"] == "fedavg" and baseline.config["recipe_dropped"] == {"mu": 0.3}
    assert baseline.config["options"] == {} and baseline.config["lr"] == 0.2 and baseline.config["clients"] == 3
    with pytest.raises(ConfigError, match="for algorithm 'fedavg'.*mu is an option of fedprox"):
        fl.run("fedavg", recipe="tiny-prox", mu=0.5, out=tmp_path / "e")  # given explicitly: refused
    with pytest.raises(ConfigError, match=r"unknown recipe 'tiny-prx' \(did you mean 'tiny-prox'\?\)"):
        fl.run(recipe="tiny-prx", out=tmp_path / "d")


def test_every_shipped_recipe_resolves():
    assert fl.RECIPES is fl.recipes.RECIPES
    for name, recipe in fl.RECIPES.items():
        settings = dict(recipe.settings)
        config, _ = build_config(settings.pop("algorithm", "fedavg"), recipe=name,
                                 **{k: v for k, v in settings.items() if k != "progress"})
        assert config["recipe"] == name
        assert set(recipe.sources) <= set(recipe.settings), name


def test_every_setting_has_a_generated_flag():
    parser = build_parser()
    flags = {s for a in parser._actions for s in a.option_strings}
    names = set(RunConfig.fields())
    for cls in registry().values():
        names |= set(cls.Options.fields())
    assert {"--" + n.replace("_", "-") for n in names} <= flags
    algorithm = next(a for a in parser._actions if a.dest == "algorithm")
    assert algorithm.choices == list(registry())
    schedule = next(a for a in parser._actions if a.dest == "schedule")
    assert schedule.choices == ["exp", "const", "cyclic", "epoch", "none"]


def test_cli_recipe_and_explicit_flags(tmp_path, monkeypatch):
    recipe = Recipe(name="tiny-ima", paper="IMA (Zhou et al. 2024)",
                    settings={"algorithm": "ima", "window": 2, "clients": 3, "rounds": 2, "lr": 0.2},
                    sources={}, notes="")
    monkeypatch.setattr(resolve, "RECIPES", {"tiny-ima": recipe})
    args = build_parser().parse_args(["--recipe", "tiny-ima", "--lr", "0.1", "--start-round", "1",
                                      "--batch-size", "64", "--device", "cpu", "--no-progress",
                                      "--out", str(tmp_path)])
    assert "clients" not in vars(args)  # only the flags given reach the namespace
    run = run_from_args(args)
    assert run.config["lr"] == 0.1 and run.config["clients"] == 3
    assert run.config["options"]["window"] == 2 and run.config["options"]["start_round"] == 1


@pytest.mark.parametrize("argv", [
    ["--momentum", "nan"], ["--weight-decay", "inf"], ["--lr", "1e30"], ["--seed", str(2**70)],
    ["-o", 'partition_options={"bogus":1}'], ["--save-clients", "[-5]"], ["--batch-size", "-1"],
    ["--algorithm", "nope"], ["--clients", "2.5"], ["--device", "banana"], ["--algorithm", "fedprox", "--mu", "-1"],
    ["--algorithm", "ima", "--window", "0"], ["--ima", '{"windw": 2}'], ["-o", "momentum=NaN"],
    ["-o", "weight_decay=Infinity"], ["--mu", "0.1"], ["--option", "novalue"], ["--recipe", "none-such"],
])
def test_bad_invocations_print_one_line_and_exit_2(tmp_path, capsys, argv):
    try:
        code = main([*argv, "--rounds", "1", "--clients", "2", "--no-progress", "--out", str(tmp_path / "r")])
    except SystemExit as exc:  # argparse usage errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("fl-run: error:"), err
    assert "Traceback" not in err


def test_help_shows_every_setting_with_its_default():
    import inspect

    params = inspect.signature(fl.run).parameters
    for name, default in RunConfig.defaults().items():
        if name != "model":
            assert params[name].default == default, name
    config, _ = build_config("fedavg")  # nothing passed: the documented defaults
    assert all(config[k] == v for k, v in RunConfig.defaults().items() if k not in ("model", "ima"))
    assert config["model"] == "mlp" and config["ima"] is None  # resolved: the dataset's model, IMA off


def test_a_folder_written_before_recipes_existed_is_reopened(tmp_path):
    """config.json of the previous writer (no ``recipe`` key, no run manifest).

    It is refused with the way out, sealed once, and then the same call reopens the run instead
    of retraining it; its digest is the previous formula's.
    """
    first = fl.run("fedprox", out=tmp_path, mu=0.2, **TINY)
    old = {k: v for k, v in first.config.items()
           if k not in ("recipe", "recipe_dropped", "init", "bad_clients", *DIGEST_WHEN_SET)}
    (tmp_path / "config.json").write_text(json.dumps(old, indent=2, sort_keys=True))
    (tmp_path / "manifest.json").unlink()
    previous_volatile = ("device", "data_root", "download", "backend", "n_jobs")
    stable = {k: v for k, v in old.items() if k not in previous_volatile}
    assert config_digest(old) == hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()[:10]
    assert config_digest(old) == config_digest(first.config)
    with pytest.raises(CheckpointError, match=r"manifest\.json: missing.*older version.*fl\.seal_run"):
        fl.load_run(tmp_path)
    fl.seal_run(tmp_path)
    with pytest.raises(CheckpointError, match="sealed already"):
        fl.seal_run(tmp_path)
    calls = []
    again = fl.run("fedprox", out=tmp_path, mu=0.2, on_round=lambda r, m: calls.append(r), **TINY)
    assert calls == [] and again.complete and "recipe" not in again.config
    for r in again.rounds:
        torch.testing.assert_close(again.global_state(r), first.global_state(r), rtol=0, atol=0)
