"""Robust aggregation: median, trimmed mean, Krum, multi-Krum and norm clipping (``fl.algorithms.robust``).

Each rule against its closed form on hand-made tensors and against an independent numpy
computation; invariants (client order, identical clients); a malicious update scaled by 10^4
with an inflated sample count, which moves FedAvg's mean far and the robust rules by at most
the honest spread; end-to-end runs of every rule (deterministic; ``"mean"`` equal to a run
without the option, bit for bit, in the same folder name); ``fl.plain_aggregate`` on a real run;
one-line ``ConfigError`` for every bad option.
"""
from __future__ import annotations

import hashlib
import itertools
import json

import numpy as np
import pytest
import torch

import fl
import landscape
from fl.algorithms.averaging import sample_weighted_average
from fl.algorithms.contexts import ClientUpdate
from fl.algorithms.robust import (
    Aggregator,
    clip_update,
    coordinate_median,
    krum,
    krum_scores,
    multi_krum,
    trimmed_mean,
)
from fl.config import DIGEST_WHEN_SET, check_stored_config, config_digest, volatile_keys
from fl.resolve import build_config
from landscape import ConfigError

from fault_counts import tally

TINY = dict(dataset="digits", clients=5, rounds=2, local_epochs=1, batch_size=64, progress=False, device="cpu")
RULES = {"median": {}, "trimmed_mean": {"trim": 0.2}, "krum": {"f": 1}, "multi_krum": {"f": 1, "m": 3}}


def states_of(values) -> list[dict[str, torch.Tensor]]:
    """One state ``{"w": tensor}`` per row of ``values`` (float64)."""
    return [{"w": torch.tensor(v, dtype=torch.float64)} for v in values]


def honest(n: int = 5, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` client states near each other: a float32 matrix, a float32 vector and an int64 counter."""
    g = torch.Generator().manual_seed(seed)
    return [{"a.weight": torch.randn(3, 4, generator=g) * 0.1 + 1.0, "a.bias": torch.randn(4, generator=g) * 0.1,
             "bn.num_batches_tracked": torch.tensor(10 + k)} for k in range(n)]


# -- closed forms --------------------------------------------------------------------------------
def test_median_closed_form_and_numpy_for_odd_and_even_counts():
    assert coordinate_median(states_of([[1.0], [2.0], [100.0]]))["w"].tolist() == [2.0]
    assert coordinate_median(states_of([[1.0], [2.0], [100.0], [4.0]]))["w"].tolist() == [3.0]  # (2 + 4) / 2
    rng = np.random.default_rng(0)
    for n in (1, 2, 4, 5, 6):
        x = rng.normal(size=(n, 3, 2))
        got = coordinate_median(states_of(x))["w"].numpy()
        np.testing.assert_array_equal(got, np.median(x, axis=0))


def test_trimmed_mean_trims_floor_beta_n_at_each_end():
    values = [[1.0], [2.0], [3.0], [4.0], [100.0]]
    assert trimmed_mean(states_of(values), 0.2)["w"].tolist() == [3.0]  # b = 1: mean of 2, 3, 4
    assert trimmed_mean(states_of(values), 0.19)["w"].tolist() == [22.0]  # b = floor(0.95) = 0: the mean
    assert trimmed_mean(states_of(values), 0.4)["w"].tolist() == [3.0]  # b = 2: the median
    rng = np.random.default_rng(1)
    for n, beta in ((5, 0.2), (6, 0.25), (10, 0.1), (7, 0.49)):
        x = rng.normal(size=(n, 4))
        b = int(np.floor(beta * n))
        expected = np.sort(x, axis=0)[b:n - b].mean(axis=0)
        np.testing.assert_allclose(trimmed_mean(states_of(x), beta)["w"].numpy(), expected, rtol=0, atol=1e-15)


def brute_krum_scores(x: np.ndarray, f: int) -> np.ndarray:
    """Blanchard et al.'s score of every row, by the definition (an independent computation)."""
    n = len(x)
    d = np.array([[np.sum((x[i] - x[j]) ** 2) for j in range(n)] for i in range(n)])
    return np.array([np.sort(np.delete(d[i], i))[:n - f - 2].sum() for i in range(n)])


def test_krum_picks_the_hand_computed_minimiser():
    states = states_of([[0.0], [1.0], [3.0], [10.0]])
    # f = 0: the 2 nearest others. 0: {1, 3} -> 1 + 9; 1: {0, 3} -> 1 + 4; 3: {1, 0} -> 4 + 9; 10: {3, 1} -> 49 + 81
    assert krum_scores(states, 0).tolist() == [10.0, 5.0, 13.0, 130.0]
    assert krum(states, 0)["w"].tolist() == [1.0]
    rng = np.random.default_rng(2)
    x = rng.normal(size=(7, 5))
    x[6] += 50.0
    scores = brute_krum_scores(x, 2)
    np.testing.assert_allclose(krum_scores(states_of(x), 2).numpy(), scores, rtol=1e-12)
    assert torch.equal(krum(states_of(x), 2)["w"], torch.tensor(x[int(np.argmin(scores))]))


def test_multi_krum_averages_the_m_lowest_scores():
    states = states_of([[0.0], [1.0], [3.0], [10.0]])
    assert multi_krum(states, 0, m=2)["w"].tolist() == [0.5]  # scores 10, 5, 13, 130: clients 1 and 0
    assert multi_krum(states, 0, m=3)["w"].tolist() == [4.0 / 3.0]
    assert multi_krum(states, 0, m=1)["w"].tolist() == krum(states, 0)["w"].tolist()
    rng = np.random.default_rng(3)
    x = rng.normal(size=(8, 3))
    keep = np.argsort(brute_krum_scores(x, 1), kind="stable")[:8 - 1]  # default m = n - f
    np.testing.assert_allclose(multi_krum(states_of(x), 1)["w"].numpy(), x[keep].mean(axis=0), rtol=0, atol=1e-15)


def test_clipping_scales_a_large_update_to_norm_c_and_leaves_a_small_one():
    sent = {"w": torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64), "n": torch.tensor(3)}
    direction = torch.tensor([2.0, -1.0, 2.0], dtype=torch.float64) / 3.0
    big = {"w": sent["w"] + 10.0 * direction, "n": torch.tensor(7)}  # ||delta|| = 10
    for c in (0.5, 2.0, 9.99):
        out = clip_update(big, sent, c)
        delta = out["w"] - sent["w"]
        assert abs(float(delta.norm()) - c) < 1e-12
        torch.testing.assert_close(delta / delta.norm(), direction, rtol=0, atol=1e-15)
        assert out["n"] is big["n"]  # integer entries are not part of the update
    small = {"w": sent["w"] + 0.3 * direction, "n": torch.tensor(7)}
    out = clip_update(small, sent, 2.0)
    assert out["w"] is small["w"] and clip_update(big, sent, 10.0)["w"] is big["w"]  # norm <= C: untouched


# -- invariants -------------------------------------------------------------------------------------
@pytest.mark.parametrize("rule, options", [("median", {}), ("trimmed_mean", {"trim": 0.2}), ("krum", {"f": 1}),
                                           ("multi_krum", {"f": 1}), ("multi_krum", {"f": 1, "m": 2})])
def test_client_order_changes_nothing_and_identical_clients_give_their_state(rule, options):
    agg = Aggregator.from_config({"aggregator": rule, "aggregator_options": options})
    states = [{k: v for k, v in s.items() if k != "bn.num_batches_tracked"} for s in honest(5)]
    sent = {k: torch.zeros_like(v) for k, v in states[0].items()}
    reference = agg(sent, {k: ClientUpdate(s, 10 + k) for k, s in enumerate(states)})
    for perm in itertools.islice(itertools.permutations(range(5)), 1, 120, 17):  # client k sends states[perm[k]]
        again = agg(sent, {k: ClientUpdate(states[i], 10 + i) for k, i in enumerate(perm)})
        assert all(torch.equal(again[k], reference[k]) for k in reference), perm
    out = agg(sent, {k: ClientUpdate(dict(states[0]), 10 + k) for k in range(5)})
    assert all(torch.equal(out[k], states[0][k]) for k in states[0])


def test_mean_is_fedavg_bit_for_bit_and_robust_rules_keep_fedavg_for_integer_and_frozen_entries():
    sent = {"a.weight": torch.zeros(3, 4), "a.bias": torch.zeros(4), "bn.num_batches_tracked": torch.tensor(0)}
    updates = {k: ClientUpdate(s, 10 * (k + 1)) for k, s in enumerate(honest(5))}
    plain = sample_weighted_average(sent, updates, keep={"a.bias"})
    mean = Aggregator.from_config({})(sent, updates, keep={"a.bias"})
    assert all(torch.equal(mean[k], plain[k]) for k in plain)
    for rule, options in RULES.items():
        agg = Aggregator.from_config({"aggregator": rule, "aggregator_options": options})
        out = agg(sent, updates, keep={"a.bias"})
        assert list(out) == list(sent)
        assert torch.equal(out["bn.num_batches_tracked"], plain["bn.num_batches_tracked"])  # rounded weighted mean
        assert torch.equal(out["a.bias"], sent["a.bias"])  # frozen: the sent values
        assert out["a.weight"].dtype == torch.float32
    empty = {k: ClientUpdate(u.state, 0) for k, u in updates.items()}  # no samples: the round carries nothing
    for rule in ("mean", *RULES):
        out = Aggregator.from_config({"aggregator": rule, "aggregator_options": RULES.get(rule, {})})(sent, empty)
        assert all(torch.equal(out[k], sent[k]) for k in sent)


# -- a malicious client ----------------------------------------------------------------------------
def test_a_scaled_update_with_an_inflated_count_moves_the_mean_but_not_the_robust_rules():
    good = honest(5)
    sent = {k: torch.zeros_like(v) for k, v in good[0].items()}
    evil = {k: (v * 1e4 if v.is_floating_point() else v) for k, v in good[0].items()}
    updates = {k: ClientUpdate(s, 100) for k, s in enumerate(good)}
    updates[5] = ClientUpdate(evil, 10**9)
    stack = torch.stack([s["a.weight"] for s in good])
    low, high = stack.min(dim=0).values, stack.max(dim=0).values
    mean = Aggregator.from_config({})(sent, updates)["a.weight"]
    assert float((mean - stack.mean(dim=0)).abs().min()) > 1e3  # every coordinate dragged away
    for rule, options in {**RULES, "multi_krum": {"f": 1}}.items():
        out = Aggregator.from_config({"aggregator": rule, "aggregator_options": options})(sent, updates)["a.weight"]
        assert bool(((out >= low - 1e-6) & (out <= high + 1e-6)).all()), rule  # within the honest spread
    chosen = Aggregator.from_config({"aggregator": "krum", "aggregator_options": {"f": 1}})(sent, updates)
    assert any(torch.equal(chosen["a.weight"], s["a.weight"]) for s in good)  # an honest client's model
    clipped = Aggregator.from_config({"clip_norm": 1.0})(sent, updates)["a.weight"]
    assert float(clipped.abs().max()) < 2.0  # clipping bounds the mean's pull too


# -- configuration --------------------------------------------------------------------------------
def test_a_stored_config_without_the_new_keys_keeps_its_digest(tmp_path):
    run = fl.run("fedavg", out=tmp_path, **{**TINY, "clients": 3, "rounds": 1})
    stored = json.loads((tmp_path / "config.json").read_text())
    earlier = {k: v for k, v in stored.items() if k not in DIGEST_WHEN_SET}  # what an earlier version wrote
    filled = check_stored_config(earlier, "config.json")
    defaults = {"aggregator": "mean", "aggregator_options": {}, "clip_norm": None, "track": None}
    assert {k: filled[k] for k in DIGEST_WHEN_SET} == defaults
    formula = {k: v for k, v in earlier.items() if k not in volatile_keys()}  # the formula of that version
    digest = hashlib.sha256(json.dumps(formula, sort_keys=True).encode()).hexdigest()[:10]
    assert config_digest(earlier) == config_digest(filled) == config_digest(stored) == digest
    assert config_digest(run.config) == digest
    assert config_digest({**stored, "aggregator": "median"}) != digest


BAD = [
    (dict(aggregator="medain"), "aggregator"),
    (dict(aggregator="median", aggregator_options={"trim": 0.1}),
     "'trim' for aggregator='median' (an option of trimmed_mean)"),
    (dict(aggregator="trimmed_mean", aggregator_options={"tirm": 0.1}), "did you mean 'trim'"),
    (dict(aggregator="trimmed_mean", aggregator_options={"trim": 0.5}), "trim"),
    (dict(aggregator="trimmed_mean", aggregator_options={"trim": float("nan")}), "trim"),
    (dict(aggregator="krum", aggregator_options={"f": 2}), "n = 5 and f = 2"),
    (dict(aggregator="krum", aggregator_options={"f": 1}, participation=0.6), "n = 3 and f = 1"),
    (dict(aggregator="krum", aggregator_options={"f": 1.5}), "aggregator option f"),
    (dict(aggregator="krum", aggregator_options={"m": 2}), "an option of multi_krum"),
    (dict(aggregator="multi_krum", aggregator_options={"f": 1, "m": 6}), "m = 6 and n = 5"),
    (dict(aggregator="multi_krum", aggregator_options={"m": 0}), "aggregator option m"),
    (dict(aggregator_options={"f": 1}), "aggregator='mean'"),
    (dict(clip_norm=0.0), "clip_norm"), (dict(clip_norm=-1.0), "clip_norm"),
    (dict(clip_norm=float("inf")), "clip_norm"),
    (dict(aggregator="median", algorithm="floco", aggregation="literal"), "aggregation='participants'"),
]


@pytest.mark.parametrize("bad, fragment", BAD, ids=[str(b) for b, _ in BAD])
def test_bad_options_give_one_line_config_errors(tmp_path, bad, fragment):
    bad = dict(bad)
    algorithm = bad.pop("algorithm", "fedavg")
    with pytest.raises(ConfigError) as exc:
        fl.run(algorithm, out=tmp_path, **{**TINY, **bad})
    assert fragment in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "config.json").exists()
    tally("bad inputs rejected")


def test_the_pure_rules_refuse_what_cannot_work():
    four = states_of([[0.0], [1.0], [2.0], [3.0]])
    cases = [(lambda: krum(four, 1), "n = 4 and f = 1"), (lambda: krum_scores(four, 1), "n = 4 and f = 1"),
             (lambda: multi_krum(four, 0, m=5), "m = 5 and n = 4"), (lambda: multi_krum(four, 0, m=0), "m = 0"),
             (lambda: trimmed_mean(four, 0.5), "[0, 0.5)"), (lambda: coordinate_median([]), "empty"),
             (lambda: clip_update(four[0], four[1], 0.0), "clip_norm"),
             (lambda: clip_update(four[0], four[1], float("nan")), "clip_norm")]
    for call, fragment in cases:
        with pytest.raises(ConfigError) as exc:
            call()
        assert fragment in str(exc.value) and "\n" not in str(exc.value)
    tally("bad inputs rejected", len(cases))


def test_the_command_line_takes_the_options_and_refuses_bad_ones(tmp_path, capsys):
    from fl.cli import main

    args = ["--dataset", "digits", "--clients", "5", "--rounds", "1", "--local-epochs", "1", "--device", "cpu",
            "--no-progress", "--out", str(tmp_path / "a"), "--aggregator", "multi_krum"]
    assert main([*args, "--aggregator-options", '{"f": 1}', "--clip-norm", "5"]) == 0
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert (config["aggregator"], config["aggregator_options"], config["clip_norm"]) == ("multi_krum", {"f": 1}, 5.0)
    capsys.readouterr()
    assert main([*args[:-4], "--out", str(tmp_path / "b"), "--aggregator", "krum",
                 "--aggregator-options", '{"f": 3}']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "n = 5 and f = 3" in err[0]
    tally("bad inputs rejected")


# -- end to end ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs of every rule (and of clipping), and a run without any aggregation option."""
    root = tmp_path_factory.mktemp("robust")
    out = {"plain": fl.run("fedavg", out=root / "plain", **TINY)}
    settings = {"mean": dict(aggregator="mean", aggregator_options={}, clip_norm=None),
                **{r: dict(aggregator=r, aggregator_options=o) for r, o in RULES.items()},
                "clip": dict(aggregator="median", clip_norm=0.5)}
    for name, extra in settings.items():
        for copy in ("1", "2"):
            out[name + copy] = fl.run("fedavg", out=root / (name + copy), **TINY, **extra)
    return out


def equal_runs(a, b) -> bool:
    """Global and client models of every round equal bit for bit."""
    for r in a.rounds:
        ga, gb = a.global_state(r), b.global_state(r)
        if not all(torch.equal(ga[k], gb[k]) for k in ga):
            return False
        ca, cb = a.client_states(r) if r else {}, b.client_states(r) if r else {}
        if sorted(ca) != sorted(cb) or not all(torch.equal(ca[c][k], cb[c][k]) for c in ca for k in ca[c]):
            return False
    return True


def test_mean_equals_a_run_without_the_option_bit_for_bit(runs):
    assert equal_runs(runs["plain"], runs["mean1"])
    assert runs["plain"].metrics[-1]["test_loss"] == runs["mean1"].metrics[-1]["test_loss"]
    assert config_digest(runs["plain"].config) == config_digest(runs["mean1"].config)
    assert build_config("fedavg", **{k: v for k, v in TINY.items() if k != "progress"})[0]["aggregator"] == "mean"


@pytest.mark.parametrize("name", [*RULES, "clip"])
def test_every_rule_runs_deterministically(runs, name):
    a, b = runs[name + "1"], runs[name + "2"]
    assert a.complete and len(a.metrics) == 3 and equal_runs(a, b)
    assert not equal_runs(a, runs["plain"])
    assert config_digest(a.config) != config_digest(runs["plain"].config)


@pytest.mark.parametrize("rule", ["median", "trimmed_mean"])
def test_the_stored_global_model_is_the_rule_of_the_stored_client_models(runs, rule):
    run = runs[rule + "1"]
    beta = RULES[rule].get("trim", 0.0)
    for r in (1, 2):
        clients = run.client_states(r)
        g = run.global_state(r)
        for key, value in g.items():
            x = np.stack([clients[k][key].double().numpy() for k in sorted(clients)])
            if rule == "median":
                expected = np.median(x, axis=0)
            else:
                b = int(np.floor(beta * len(x)))
                expected = np.sort(x, axis=0)[b:len(x) - b].mean(axis=0)
            np.testing.assert_allclose(value.double().numpy(), expected.astype(np.float32), rtol=0, atol=1e-7)


@pytest.mark.parametrize("algorithm, extra", [("floco", {}), ("ima", {"rounds": 3, "window": 2}),
                                               ("lss", {"members": 2}), ("fedprox", {"ima": True, "rounds": 3})])
def test_other_algorithms_use_the_rule(tmp_path, algorithm, extra):
    settings = {**TINY, **extra}
    robust = fl.run(algorithm, out=tmp_path / "m", aggregator="median", **settings)
    plain = fl.run(algorithm, out=tmp_path / "p", **settings)
    assert robust.complete and not equal_runs(robust, plain)


def test_plain_aggregate_is_fedavgs_mean_of_the_stored_client_models(tmp_path):
    run = fl.run("fedavg", out=tmp_path / "median", aggregator="median", **{**TINY, "clients": 3})
    sizes = {k: len(d) for k, d in run.client_datasets().items()}
    for r in (1, 2):
        clients = run.client_states(r)
        ids = sorted(clients)
        w = np.array([sizes[k] for k in ids], dtype=np.float64)
        plain = fl.plain_aggregate(run, r)
        for key, value in plain.items():
            x = np.stack([clients[k][key].double().numpy() for k in ids])
            expected = np.tensordot(w / w.sum(), x, axes=1)
            np.testing.assert_allclose(value.double().numpy(), expected, rtol=0, atol=1e-6)
        assert not all(torch.equal(plain[k], run.global_state(r)[k]) for k in plain)  # the median differs
    assert all(torch.equal(a, b) for a, b in zip(fl.plain_aggregate(tmp_path / "median").values(),
                                                 fl.plain_aggregate(run, 2).values()))
    ev = landscape.Evaluator(run.module(), run.test_dataset(), progress=False)
    path = landscape.interpolate(fl.plain_aggregate(run, 2), run.global_state(2), ev, alphas=3)
    assert np.isfinite(path.loss).all() and len(path.loss) == 3
    fedavg = fl.run("fedavg", out=tmp_path / "fedavg", **{**TINY, "clients": 3})
    assert all(torch.equal(v, fedavg.global_state(2)[k]) for k, v in fl.plain_aggregate(fedavg, 2).items())
    unsaved = fl.run("fedavg", out=tmp_path / "none", save_clients="last", **{**TINY, "clients": 3})
    for call, fragment in [(lambda: fl.plain_aggregate(unsaved, 1), "save_clients='all'"),
                           (lambda: fl.plain_aggregate(run, 0), "round 0"),
                           (lambda: fl.plain_aggregate(run, 7), "round 7 is not stored")]:
        with pytest.raises(ConfigError) as exc:
            call()
        assert fragment in str(exc.value) and "\n" not in str(exc.value)
    tally("bad inputs rejected", 3)
