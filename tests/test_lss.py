"""Local Superior Soups (fl/algorithms/lss.py)."""
from __future__ import annotations

import itertools

import pytest
import torch

import fl
from fl.algorithms.lss import client_pools, distance, simplex_volume_sq
from landscape.infra.errors import ConfigError

RUN = dict(dataset="digits", clients=4, rounds=3, local_epochs=2, lr=0.1, seed=0, progress=False)
ONE = {**RUN, "rounds": 1, "save_clients": "none"}
# unsquared L2, mean distance (Sec. 3.3), absolute coefficients
PAPER_FORM = {"distance": "l2", "diversity_measure": "mean", "regulariser_calibration": None}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lss")
    return {
        "lss": fl.api.run("lss", out=root / "lss", affinity=0.03, diversity=0.03, **PAPER_FORM, **RUN),
        "default": fl.api.run("lss", out=root / "default", **RUN),
        "fedavg": fl.api.run("fedavg", out=root / "fedavg", save_clients="none", **RUN),
        "single": fl.api.run("lss", out=root / "single", members=1, affinity=0.0, diversity=0.0,
                             save_clients="none", **{k: v for k, v in RUN.items()}),
        "frozen": fl.api.run("lss", out=root / "frozen", pool_seed="anchor_frozen", members=2,
                             store_pools=[1], **ONE),
        "plain": fl.api.run("lss", out=root / "plain", affinity=0.0, diversity=0.0, **ONE),
        "div": fl.api.run("lss", out=root / "div", affinity=0.0, diversity=0.3, **PAPER_FORM, **ONE),
        "aff": fl.api.run("lss", out=root / "aff", affinity=0.3, diversity=0.0, **PAPER_FORM, **ONE),
    }


def test_client_output_is_its_pool_average_exactly(runs) -> None:
    run = runs["lss"]
    for r in (1, RUN["rounds"]):
        pools = client_pools(run.algorithm_state(r))
        uploads = run.client_states(r)
        assert sorted(pools) == sorted(uploads) == [0, 1, 2, 3]
        for k, pool in pools.items():
            assert len(pool) == 4
            for name in uploads[k]:
                mean = torch.stack([m[name].double() for m in pool]).mean(0).to(uploads[k][name].dtype)
                assert torch.equal(mean, uploads[k][name])
            # the members differ from each other (each was trained)
            assert all(not torch.equal(a[name], b[name]) for a, b in itertools.combinations(pool, 2))


def test_single_member_without_regularisers_is_fedavg(runs) -> None:
    for r in range(RUN["rounds"] + 1):
        a, b = runs["fedavg"].global_state(r), runs["single"].global_state(r)
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_literal_algorithm_keeps_frozen_anchor_in_pool_and_store_limit(runs) -> None:
    run = runs["frozen"]
    pools = client_pools(run.algorithm_state(1))
    assert sorted(pools) == [1]  # store_pools=[1]
    pool = pools[1]
    received = run.global_state(0)
    assert len(pool) == 3  # f_p plus two trained members
    assert all(torch.equal(pool[0][n], received[n]) for n in pool[0])
    assert not torch.equal(pool[1]["classifier.weight"], received["classifier.weight"])


def _pool_stats(run) -> tuple[float, float]:
    """Mean pairwise member distance and mean distance of the pool average to f_p (client 0)."""
    pool = client_pools(run.algorithm_state(1))[0]
    anchor = run.global_state(0)
    pair = sum(float(distance(a, b)) for a, b in itertools.combinations(pool, 2)) / 6
    mean = {n: torch.stack([m[n] for m in pool]).mean(0) for n in pool[0]}
    return pair, float(distance(mean, anchor))


def test_diversity_spreads_the_pool_and_affinity_pulls_it_to_the_start(runs) -> None:
    plain_pair, plain_anchor = _pool_stats(runs["plain"])
    div_pair, _ = _pool_stats(runs["div"])
    _, aff_anchor = _pool_stats(runs["aff"])
    assert div_pair > 1.2 * plain_pair
    assert aff_anchor < 0.8 * plain_anchor


def test_lss_trains_above_chance(runs) -> None:
    for name in ("lss", "default"):
        acc = [m["test_accuracy"] for m in runs[name].metrics]
        assert acc[-1] > 0.3 > acc[0], (name, acc)  # chance is 0.1


def test_default_uses_the_official_codes_squared_distances(runs) -> None:
    opts = runs["default"].config["options"]
    assert (opts["distance"], opts["diversity_measure"], opts["affinity"], opts["diversity"]) == \
        ("sq_l2", "mean", 1e-3, 1e-3)
    ratios = [m["regulariser_gradient_ratio"] for m in runs["default"].metrics[1:]]
    assert all(0 <= r < 1 for r in ratios), ratios  # the task gradient dominates


def test_paper_literal_lambda_warns_that_regularisers_dominate(tmp_path) -> None:
    with pytest.warns(RuntimeWarning, match="regularisers dominate"):
        run = fl.api.run("lss", out=tmp_path / "paper", affinity=3.0, diversity=3.0, members=2,
                         **PAPER_FORM, **ONE)
    assert run.metrics[1]["regulariser_gradient_ratio"] > 1


def test_regulariser_gradient_ratio_is_affinity_gradient_over_task_gradient(tmp_path) -> None:
    """One member, one full-batch step.

    The affinity gradient is lambda * unit vector (norm lambda) at any point but f_p
    itself, where it is 0, so the reported ratio is 0 there; with the squared distance it
    is 0 at f_p too (an analytic value for both forms).
    """
    for form in ({"distance": "l2"}, {"distance": "sq_l2"}):
        run = fl.api.run("lss", out=tmp_path / form["distance"], members=1, affinity=5.0, diversity=0.0,
                         regulariser_calibration=None, **{**ONE, "local_epochs": 1, "batch_size": 10_000}, **form)
        # the one step starts at f_p: the difference to it is exactly 0, and so is the regularisers' gradient
        assert run.metrics[1]["regulariser_gradient_ratio"] == 0.0


def test_split_budget_member_trains_on_fedavgs_batches(tmp_path) -> None:
    """budget="split", 2 members, 2 local epochs, no regularisers.

    Member 0 (alone in the pool, so plain SGD) takes the first half of FedAvg's batches, i.e.
    equals FedAvg with 1 epoch.
    """
    lss = fl.api.run("lss", out=tmp_path / "lss", members=2, affinity=0.0, diversity=0.0, budget="split",
                     **{**ONE, "save_clients": "all"})
    fedavg = fl.api.run("fedavg", out=tmp_path / "fedavg", **{**ONE, "local_epochs": 1, "save_clients": "all"})
    pools = client_pools(lss.algorithm_state(1))
    uploads = fedavg.client_states(1)
    for k, pool in pools.items():
        assert len(pool) == 2
        for name, t in pool[0].items():
            # the same batches through the same forward, loss and torch.optim.SGD update ops (mixing one member
            # with weight 1.0 and dividing by one interpolation sample are exact)
            assert torch.equal(t, uploads[k][name]), (k, name)


def test_distance_is_l2_over_all_tensors() -> None:
    a = {"w": torch.tensor([3.0, 0.0]), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([0.0, 0.0]), "b": torch.tensor([4.0])}
    # squares and sums of small integers are exact in float32, 25 + 1e-12 rounds to 25, and sqrt(25) is exact
    assert float(distance(a, b)) == 5.0
    assert float(distance(a, b, "sq_l2")) == 25.0


def test_simplex_volume_is_cayley_menger() -> None:
    """Right triangle with legs 3 and 4: area 6; a segment: its length; gradient reaches members."""
    p = [{"w": torch.tensor([0.0, 0.0])}, {"w": torch.tensor([3.0, 0.0])},
         {"w": torch.tensor([0.0, 4.0], requires_grad=True)}]
    vol = simplex_volume_sq(p)
    # exact float32 squared distances of small integers into a float64 LU determinant, whose rounding error
    # scales with float64's 1e-16 times the matrix's conditioning rather than with a sum: pytest's default
    # relative 1e-6 (and assert_close's float32 defaults for the gradient, cast to float32) is loose on purpose
    assert float(vol.detach()) == pytest.approx(36.0)
    assert float(simplex_volume_sq(p[:2])) == pytest.approx(9.0)
    vol.backward()  # d(area^2)/d(apex) = 2 * 6 * (0, 1.5)
    torch.testing.assert_close(p[2]["w"].grad, torch.tensor([0.0, 18.0]))
    tetra = [{"w": torch.tensor(v)} for v in ([0.0, 0, 0], [1.0, 0, 0], [0.0, 1, 0], [0.0, 0, 1])]
    assert float(simplex_volume_sq(tetra)) == pytest.approx((1 / 6) ** 2)


def test_invalid_options_raise() -> None:
    for bad in ({"members": 0}, {"affinity": -1.0}, {"pool_seed": "x"}, {"distance": "l1"},
                {"store_pools": "all"}, {"concentration": 0.0}, {"diversity_measure": "max"}, {"budget": "x"}):
        with pytest.raises(ConfigError):
            fl.api.build_config("lss", dataset="digits", model=None, clients=2, rounds=1,
                                participation=1.0, local_epochs=1, batch_size=8, lr=0.1,
                                partition="dirichlet", alpha=0.5, seed=0, device="cpu", options=bad)


OFFICIAL = dict(budget="official", members=3, epochs_per_member=8, optimizer="adam", lr=5e-4, weight_decay=0.0,
                interp_samples=2, diversity_measure="volume", regulariser_calibration=None)


def _count_adam_steps(monkeypatch) -> list[int]:
    """Patch torch.optim.Adam so that every step is counted."""
    calls = [0]

    class Counting(torch.optim.Adam):
        def step(self, closure=None):
            calls[0] += 1
            return super().step(closure)

    monkeypatch.setattr(torch.optim, "Adam", Counting)
    return calls


@pytest.mark.parametrize("accumulation", [15, 4])
def test_official_budget_steps_as_the_released_code(tmp_path, monkeypatch, accumulation) -> None:
    """Member 0: 8 epochs, a step per batch; added members: 8 // 8 = 1 epoch, a step per `accumulation` batches.

    Counted independently of the algorithm: the optimiser's steps against the clients' batch counts.
    With 15, the digits clients (fewer than 15 batches of 32 each) give the added members no step,
    so they stay at member 0's weights and the upload is member 0.
    """
    calls = _count_adam_steps(monkeypatch)
    run = fl.api.run("lss", out=tmp_path / "lss", accumulation=accumulation,
                     **{**ONE, **OFFICIAL, "save_clients": "last"})
    batches = {k: -(-len(d) // 32) for k, d in run.client_datasets().items()}
    expected = sum(8 * b + 2 * (b // accumulation) for b in batches.values())
    assert calls[0] == expected
    pools = client_pools(run.algorithm_state(1))
    for k, pool in pools.items():
        same = all(torch.equal(pool[0][n], m[n]) for m in pool[1:] for n in pool[0])
        assert same == (batches[k] < accumulation)
    assert run.metrics[-1]["added_member_steps"] == pytest.approx(
        sum(2 * (b // accumulation) * len(run.client_datasets()[k]) for k, b in batches.items())
        / sum(len(d) for d in run.client_datasets().values()))
