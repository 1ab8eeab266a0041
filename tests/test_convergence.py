"""fl.convergence: the slope criterion against an independent fit, on a real run."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import fl
from fl.convergence import MAX_SLOPE, assess
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
