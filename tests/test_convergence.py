"""fl.convergence: the slope criterion against an independent fit; the finishing rule on real runs and schedules."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

import fl
from fl.central import Trainer
from fl.convergence import (
    ANNEALED_FRACTION,
    MAX_SLOPE,
    Progress,
    assess,
    doubled_progress,
    judge,
    run_progress,
    schedule,
)
from fl.datasets import load_dataset
from fl.resolve import build_config, merge_settings
from landscape import ConfigError


def test_slope_and_plateau_of_a_real_run_match_an_independent_fit(tmp_path):
    run = fl.run("fedavg", dataset="digits", clients=4, rounds=12, out=tmp_path / "run", progress=False,
                 device="cpu", seed=1)
    c = assess(run.metrics)
    acc = np.array([m["test_accuracy"] for m in run.metrics])
    assert c.window == 5 and c.last_round == 12  # max(5, ceil(0.1 * 12)) rounds
    fit = stats.linregress(np.arange(8, 13), acc[-5:])
    assert c.slope == pytest.approx(fit.slope, abs=1e-12) and c.plateau == pytest.approx(acc[-5:].mean())
    assert c.converged == (fit.slope < MAX_SLOPE)
    assert run.convergence() == c == fl.load_run(tmp_path / "run").convergence()


def test_a_climbing_run_is_not_converged_and_a_flat_one_is():
    climbing = [{"round": r, "test_accuracy": 0.3 + 0.002 * r} for r in range(1, 101)]  # 0.2 points/round
    flat = [{"round": r, "test_accuracy": 0.8 + 0.0005 * (r % 2)} for r in range(1, 101)]
    assert not assess(climbing).converged and assess(climbing).window == 10
    assert assess(flat).converged
    assert "NOT converged" in str(assess(climbing)) and "0.200 points/round" in str(assess(climbing))
    with pytest.raises(ConfigError, match="at least two rounds"):
        assess([{"round": 1, "test_accuracy": float("nan")}, {"round": 2, "test_accuracy": 0.5}])


# ------------------------------------------------------------------ the finishing rule of claims (judge)

def flat_or_rising(rounds: int, rise: float) -> list[dict]:
    """Per-round metrics as a run stores them (round 0 is the initial model): 0.8 + rise * r / rounds."""
    return [{"round": r, "test_accuracy": 0.8 + rise * r / rounds} for r in range(rounds + 1)]


def digits_config(**settings) -> dict:
    """The stored configuration of a FedAvg run on digits (what ``Run.config`` holds), without training."""
    return build_config("fedavg", dataset="digits", clients=4, rounds=40, **settings)[0]


def test_a_constant_lr_run_still_climbing_is_not_finished_with_its_numbers(tmp_path):
    run = fl.run("fedavg", dataset="digits", clients=4, rounds=8, lr=0.01, out=tmp_path / "run", progress=False,
                 device="cpu", seed=1)
    p = run_progress(run)
    acc = [m["test_accuracy"] for m in run.metrics]  # rounds 0..8; each plateau is a mean over 5 stored rounds
    assert p.rounds == (4, 8) and p.values == pytest.approx((np.mean(acc[:5]), np.mean(acc[4:])), abs=1e-12)
    assert p.lr_end == p.lr_peak == 0.01  # lr_decay 0: the schedule never anneals
    f = judge(p, tol=0.01)
    assert not f.finished and f.reason == "still changing" and f.limit == pytest.approx(0.005)
    assert p.change > 0.1  # the fixture climbs: 10 points and more from round 4 to 8
    assert str(f) == f"still changing (test-accuracy plateau: {f.numbers()}; limit 0.0050)"
    assert f.numbers().startswith(f"{p.values[0]:.4f} at round 4 -> {p.values[1]:.4f} at round 8, change +")


def test_the_schedule_is_the_one_the_run_trained_with(tmp_path):
    run = fl.run("fedavg", dataset="digits", clients=4, rounds=5, lr=0.05, lr_decay=0.5, out=tmp_path / "run",
                 progress=False, device="cpu", seed=2)
    logged = [m["lr"] for m in run.metrics if m["round"] >= 1]  # what each round's clients trained with
    assert schedule(run.config, 5) == pytest.approx(logged, rel=1e-15)
    assert logged == pytest.approx([0.05 * 0.5 ** (r - 1) for r in range(1, 6)], rel=1e-15)
    assert run_progress(run).lr_fraction == pytest.approx(1 / 16)  # 6.25% of the peak: not annealed
    with pytest.raises(ConfigError, match="at least one round"):
        schedule(run.config, 0)


def test_ima_recipe_ends_annealed_and_its_fedavg_baseline_does_not():
    """IMA's exploration decay (x 0.97 per round after t_s = 300) anneals below 1 %; FedAvg's x 0.99 ends at 1.8 %."""
    fractions = {}
    for algorithm in ("ima", "fedavg"):
        settings = merge_settings("ima-mnist1d", {"algorithm": algorithm})
        config = build_config(settings.pop("algorithm"), recipe="ima-mnist1d", **settings)[0]
        rates = schedule(config, config["rounds"])
        fractions[algorithm] = rates[-1] / max(rates)
    assert fractions["fedavg"] == pytest.approx(0.99 ** 399, rel=1e-12)
    assert fractions["ima"] == pytest.approx(0.99 ** 299 * 0.97 ** 100, rel=1e-12)
    assert fractions["ima"] < ANNEALED_FRACTION < fractions["fedavg"]


def test_a_branching_algorithm_is_judged_on_the_rounds_it_trains_itself():
    """IMA trains as FedAvg through t_s - 1 = 29 of R = 40 rounds: R/2 becomes the midpoint of 29..40 (round 34)."""
    config = build_config("ima", dataset="digits", clients=4, rounds=40, start_round=30)[0]
    metrics = [{"round": r, "test_accuracy": 0.5 + 0.01 * min(r, 30)} for r in range(41)]  # climbs until 30, flat
    p = run_progress(SimpleNamespace(metrics=metrics, config=config), statistic=lambda m: m[-1]["test_accuracy"])
    assert p.rounds == (34, 40) and p.change == pytest.approx(0.0)
    fedavg = run_progress(SimpleNamespace(metrics=metrics, config=digits_config()),
                          statistic=lambda m: m[-1]["test_accuracy"])
    assert fedavg.rounds == (20, 40) and fedavg.change == pytest.approx(0.10)  # the FedAvg climb before t_s


def test_a_run_with_its_continuation_is_judged_on_r_to_2r():
    config = digits_config(lr=0.05)
    short = SimpleNamespace(metrics=flat_or_rising(40, 0.04)[:21], config={**config, "rounds": 20})
    longer = SimpleNamespace(metrics=flat_or_rising(40, 0.04), config=config)
    last = lambda m: m[-1]["test_accuracy"]  # noqa: E731
    p = doubled_progress(short, longer, last, "accuracy")
    assert p.rounds == (20, 40) and p.values == pytest.approx((0.82, 0.84)) and p.lr_fraction == 1.0
    assert not judge(p, tol=0.02).finished and judge(p, tol=0.05).finished  # change 0.02 against 0.01 and 0.025
    with pytest.raises(ConfigError, match="twice its 20 rounds"):
        doubled_progress(short, short, last)
    with pytest.raises(ConfigError, match="same seed"):
        doubled_progress(short, SimpleNamespace(metrics=longer.metrics, config={**config, "seed": 9}), last)


def test_a_plateaued_constant_lr_run_is_finished_and_the_limit_is_strict():
    config = digits_config(lr=0.05)
    tol = 0.01
    for rise, reason in ((0.004, "settled"), (-0.004, "settled"), (0.012, "still changing")):
        p = run_progress(SimpleNamespace(metrics=flat_or_rising(40, rise), config=config))
        assert p.lr_fraction == 1.0 and p.change == pytest.approx(rise / 2)  # the plateau moves by half the rise
        assert judge(p, tol).reason == reason and judge(p, tol).finished == (reason == "settled")
    at_limit = Progress("accuracy", lr_end=0.05, lr_peak=0.05, rounds=(20, 40), values=(0.8, 0.8 + 0.5 * tol))
    assert not judge(at_limit, tol).finished  # "below half the tolerance": strictly
    missing = Progress("accuracy", lr_end=0.05, lr_peak=0.05, rounds=(20, 40))
    assert judge(missing, tol).reason == "not measured" and not judge(missing, tol).finished
    for bad in (0.0, -0.01, float("nan")):
        with pytest.raises(ConfigError, match="tolerance > 0"):
            judge(at_limit, bad)


def test_an_annealed_cosine_run_with_a_rising_curve_is_finished():
    """Central SGD on digits, lr cosine-annealed to 0 over 4 epochs: still rising at its end, yet finished."""
    data = load_dataset("digits")
    tr = Trainer(data.train_x, data.train_y, data.input_shape, epochs=4, lr=0.02, batch_size=64, seed=0,
                 schedule="cosine")
    curve: list[float] = []
    tr.train("model 0", on_epoch=lambda epoch, module: curve.append(float(
        (module(data.test_x).argmax(1) == data.test_y).double().mean())))
    rates = tr.rates(4, len(data.train_y))  # the schedule train() followed, one rate per SGD step
    assert rates[0] == 0.02 and rates[-1] == pytest.approx(0.01 * (1 + math.cos(math.pi * (len(rates) - 1)
                                                                            / len(rates))), rel=1e-9)
    p = Progress("test accuracy", lr_end=rates[-1], lr_peak=max(rates), rounds=(2, 4), values=(curve[1], curve[3]))
    f = judge(p, tol=0.01)
    assert f.finished and f.reason == "annealed" and p.lr_fraction < 1e-3
    assert p.change > f.limit  # the curve still rose: the metric alone would have blocked it
    assert judge(Progress("test accuracy", lr_end=rates[0], lr_peak=rates[0], rounds=(2, 4), values=p.values),
                 tol=0.01).reason == "still changing"
    assert str(f).startswith("annealed (lr at the end")
