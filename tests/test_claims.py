"""Claim checks (landscape.claims) on constructed cases whose truth is known analytically.

* identical models: every barrier is exactly zero, so connectivity claims hold;
* a linear model under cross-entropy: the loss is convex in the weights, so no loss barrier
  exists between any models, however far apart, and every sublevel set is convex;
* a two-unit ReLU network and its hidden-unit permutation: the same function, but their
  midpoint has all hidden units off and outputs a constant (a barrier of half the accuracy).
  Their midpoint, used as the anchor, is connected to both (loss and accuracy rise
  monotonically and below the chord), so transitivity fails;
* flatness: compared with an exact Hessian from torch.autograd.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from figures.verdicts import verdict_figure
from landscape import ConfigError, Evaluator, interpolate
from landscape.claims import Outcome, Verdict, flatter, group_connectivity, replicate, shared_basin, transitivity

S = 6.0  # weight scale of the ReLU construction (large: confident, near-zero loss endpoints)


@pytest.fixture(scope="module")
def xor_free_data():
    """2-D Gaussian inputs, label 1 iff x0 > 0 (balanced), float64."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(400, 2, generator=gen, dtype=torch.float64)
    x[:, 0] = x[:, 0].sign() * (x[:, 0].abs() + 0.2)  # keep a margin around the decision boundary
    return x, (x[:, 0] > 0).long()


def relu_net(hidden: list[list[float]], out: list[list[float]]) -> nn.Module:
    net = nn.Sequential(nn.Linear(2, 2, bias=False), nn.ReLU(), nn.Linear(2, 2)).double()
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor(hidden))
        net[2].weight.copy_(torch.tensor(out))
        net[2].bias.copy_(torch.tensor([1e-3, 0.0]))  # break ties of a constant output towards class 0
    return net


@pytest.fixture(scope="module")
def permuted_pair():
    """w1 and its hidden-unit permutation w2: identical functions, perfect classifiers."""
    w1 = relu_net([[S, 0], [-S, 0]], [[0, S], [S, 0]])
    w2 = relu_net([[-S, 0], [S, 0]], [[S, 0], [0, S]])
    return w1, w2


def linear_models(n: int, scale: float = 3.0) -> list[nn.Module]:
    models = []
    for seed in range(n):
        gen = torch.Generator().manual_seed(100 + seed)
        m = nn.Linear(2, 2).double()
        with torch.no_grad():
            m.weight.copy_(scale * torch.randn(2, 2, generator=gen, dtype=torch.float64))
            m.bias.copy_(scale * torch.randn(2, generator=gen, dtype=torch.float64))
        models.append(m)
    return models


def evaluator(module, data):
    return Evaluator(module, data, dtype=torch.float64, device="cpu")


def midpoint(a: nn.Module, b: nn.Module) -> dict:
    return {k: 0.5 * (a.state_dict()[k] + b.state_dict()[k]) for k in a.state_dict()}


def test_identical_models_are_connected(permuted_pair, xor_free_data):
    w1, _ = permuted_pair
    ev = evaluator(w1, xor_free_data)
    v = transitivity(w1, w1, w1, ev)
    assert v.holds and v.status == Outcome.REPRODUCED
    assert v.numbers["barrier_w1_w2"] == 0.0 and v.numbers["barrier_w1_anchor"] == 0.0
    assert v.numbers["fused_acc"] == v.numbers["ind_acc"] == 1.0
    g = group_connectivity([w1, w1, w1], ev, threshold=0.0)
    assert g.holds and g.numbers["group_barrier"] == 0.0


def test_convex_loss_has_no_barrier_between_far_models(xor_free_data):
    a, b, anchor = linear_models(3, scale=20.0)
    ev = evaluator(a, xor_free_data)
    assert float(torch.linalg.norm(a.weight.detach() - b.weight.detach())) > 10  # far apart
    v = transitivity(a, b, anchor, ev, metric="loss", threshold=1e-9)
    assert v.holds, str(v)
    for key in ("barrier_w1_anchor", "barrier_w2_anchor", "barrier_w1_w2"):
        assert v.numbers[key] <= 1e-9  # Jensen: L(convex combination) <= combination of L
    g = group_connectivity(linear_models(5, scale=20.0), ev, metric="loss", threshold=1e-9)
    assert g.holds and g.numbers["loss_barrier"] < 0


def test_permutation_counterexample_makes_transitivity_fail(permuted_pair, xor_free_data):
    w1, w2 = permuted_pair
    ev = evaluator(w1, xor_free_data)
    anchor = midpoint(w1, w2)  # all hidden weights zero: a constant, class-0 output
    v = transitivity(w1, w2, anchor, ev, alphas=11)
    assert v.status == Outcome.NOT_REPRODUCED and not v.holds
    assert v.numbers["barrier_w1_anchor"] <= 0.05 and v.numbers["barrier_w2_anchor"] <= 0.05
    # the midpoint of w1-w2 is the anchor: accuracy 1/2 against 1 at the ends -> barrier 1/2
    labels = xor_free_data[1]
    half = float((labels == 0).double().mean())
    assert v.numbers["fused_acc"] == pytest.approx(half)
    assert v.numbers["barrier_w1_w2"] == pytest.approx(1 - half)
    # the group of both has the same barrier at its centroid
    g = group_connectivity([w1, w2], ev)
    assert not g.holds and g.numbers["accuracy_barrier"] == pytest.approx(1 - half)


def test_premise_failure_is_not_applicable_and_baseline_reduction(permuted_pair, xor_free_data):
    w1, w2 = permuted_pair
    ev = evaluator(w1, xor_free_data)
    v = transitivity(w1, w1, w2, ev, alphas=11)  # w1-anchor(=w2) has the barrier
    assert v.status == Outcome.NOT_TESTABLE and not v.holds
    # baseline pair with a barrier, tested pair identical: 100% reduction, as in Table 1's format
    v = transitivity(w1, w1, w1, ev, baseline=(w1, w2), alphas=11)
    assert v.holds and v.numbers["relative_reduction"] == pytest.approx(1.0)
    assert v.numbers["baseline_barrier"] == pytest.approx(
        v.numbers["baseline_ind_acc"] - v.numbers["baseline_fused_acc"])
    # the tested pair no better than the baseline: fails
    v = transitivity(w1, w2, midpoint(w1, w2), ev, baseline=(w1, w2), alphas=11)
    assert v.status == Outcome.NOT_REPRODUCED and v.numbers["relative_reduction"] == pytest.approx(0.0)


def test_group_by_size_reports_mean_per_k(xor_free_data):
    models = linear_models(4)
    ev = evaluator(models[0], xor_free_data)
    v = group_connectivity(models, ev, by_size=True, draws=3, seed=1, metric="loss", threshold=1e-9)
    assert set(v.numbers["mean_barrier_by_size"]) == {2, 3, 4}
    assert all(b <= 1e-9 for b in v.numbers["mean_barrier_by_size"].values())
    fig = verdict_figure(v)
    assert fig.axes


def test_shared_basin_holds_for_convex_loss(xor_free_data):
    clients = linear_models(4, scale=2.0)
    ev = evaluator(clients[0], xor_free_data)
    states = [c.state_dict() for c in clients]
    global_state = {k: sum(s[k] for s in states) / len(states) for k in states[0]}
    v = shared_basin(clients, global_state, ev, resolution=15)
    assert v.holds, str(v)
    assert v.numbers["common_basin"] and v.numbers["components"] >= 1
    assert v.numbers["max_client_global_barrier"] <= 1e-9
    # the barriers are those of the public interpolate
    p = interpolate(clients[2], global_state, ev, alphas=11)
    assert v.numbers["barrier[client 2]"] == pytest.approx(p.loss_barrier)
    # global loss <= max client loss (convexity), distance to the plane reported
    assert v.numbers["global_loss"] <= max(float(ev.evaluate([c]).loss[0]) for c in clients)
    assert v.numbers["global_distance_to_plane"] > 0  # four clients: the average is off the 3-client plane
    walls = sum(bool(np.all(np.diff(interpolate(c, global_state, ev, alphas=11).loss) <= 1e-12)) for c in clients)
    assert v.numbers["clients_on_wall"] == walls
    assert "basin bottom" in [t.get_text() for t in verdict_figure(v).axes[0].texts]
    pca = shared_basin(clients, global_state, ev, plane_kind="pca", resolution=11)
    assert pca.holds and pca.numbers["global_distance_to_plane"] < 1e-6 * np.linalg.norm(
        ev.vector(global_state).numpy())


def test_shared_basin_fails_when_the_average_leaves_the_basin(permuted_pair, xor_free_data):
    w1, w2 = permuted_pair
    w3 = relu_net([[S * 1.5, 0], [-S * 1.5, 0]], [[0, S * 1.5], [S * 1.5, 0]])  # w1 scaled: same basin as w1
    ev = evaluator(w1, xor_free_data)
    states = [m.state_dict() for m in (w1, w2, w3)]
    global_state = {k: sum(s[k] for s in states) / 3 for k in states[0]}
    v = shared_basin([w1, w2, w3], global_state, ev, resolution=21)
    assert not v.holds and not v.numbers["common_basin"]
    assert v.numbers["global_loss"] > 10 * v.numbers["min_client_loss"]


def exact_top_eigenvalue(model: nn.Module, x, y) -> float:
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def loss(vec):
        params, i = {}, 0
        for n, s in zip(names, shapes):
            params[n] = vec[i:i + s.numel()].reshape(s)
            i += s.numel()
        out = torch.func.functional_call(model, params, (x,))
        return nn.functional.cross_entropy(out, y)

    hess = torch.autograd.functional.hessian(loss, flat)
    return float(torch.linalg.eigvalsh(hess).max())


def test_flatter_matches_exact_hessian(xor_free_data):
    x, y = xor_free_data
    confident = nn.Linear(2, 2).double()
    uncertain = nn.Linear(2, 2).double()
    with torch.no_grad():
        confident.weight.copy_(torch.tensor([[-4.0, 0.0], [4.0, 0.0]]))
        confident.bias.zero_()
        uncertain.weight.copy_(0.05 * confident.weight)
        uncertain.bias.zero_()
    ev = evaluator(confident, xor_free_data)
    v = flatter(confident, uncertain, ev, k=2, tol=1e-8)
    assert v.holds  # confident softmax -> p(1 - p) small -> smaller curvature
    assert v.numbers["top_eigenvalue_a"] == pytest.approx(exact_top_eigenvalue(confident, x, y), rel=1e-6)
    assert v.numbers["top_eigenvalue_b"] == pytest.approx(exact_top_eigenvalue(uncertain, x, y), rel=1e-6)
    assert not flatter(uncertain, confident, ev, tol=1e-8).holds


def test_verdict_renders_numbers_everywhere(permuted_pair, xor_free_data):
    w1, w2 = permuted_pair
    ev = evaluator(w1, xor_free_data)
    v = transitivity(w1, w2, midpoint(w1, w2), ev, alphas=11, threshold=0.07)
    text, md, page = str(v), v._repr_markdown_(), v._repr_html_()
    value = f"{v.numbers['barrier_w1_w2']:.4g}"
    for rendering in (text, md, page):
        assert value in rendering and "0.07" in rendering
    assert "NOT REPRODUCED" in text and "not reproduced" in md and "not reproduced" in page
    d = v.to_dict()
    assert d["holds"] is False and d["numbers"]["barrier_w1_w2"] == v.numbers["barrier_w1_w2"]
    assert set(v.results["paths"]) == {"w1-anchor", "w2-anchor", "w1-w2"}
    fig = verdict_figure(v)
    assert len(fig.axes) == 2
    with pytest.raises(Exception, match="status"):
        Verdict(kind="x", claim="c", status="maybe", reason="", numbers={}, thresholds={})


def test_replicate_reports_mean_spread_and_disagreement(xor_free_data):
    models = linear_models(4)
    ev = evaluator(models[0], xor_free_data)
    cases = [(models[0], models[1]), (models[2], models[3]), (models[0], models[3])]
    singles = [group_connectivity(list(c), ev, metric="loss", threshold=0.5) for c in cases]
    rep = replicate(group_connectivity, [(list(c),) for c in cases], evaluator=ev, metric="loss", threshold=0.5)
    values = np.array([v.numbers["group_barrier"] for v in singles])
    assert rep.replicates == 3 and len(rep.results["verdicts"]) == 3
    assert rep.numbers["group_barrier"] == pytest.approx(values.mean())
    assert rep.numbers["group_barrier_std"] == pytest.approx(values.std(ddof=1))
    held = sum(v.holds for v in singles)
    assert rep.numbers["holds_in"] == f"{held}/3"
    margins = 0.5 - values  # threshold - barrier: > 0 on the claimed side
    half = stats.t.ppf(0.975, 2) * margins.std(ddof=1) / np.sqrt(3)
    low, high = margins.mean() - half, margins.mean() + half
    assert (rep.numbers["margin_low"], rep.numbers["margin_high"]) == pytest.approx((low, high))
    expected = "reproduced" if low > 0 else "not reproduced" if high < 0 else "inconclusive"
    assert rep.status == expected
    assert "Over 3 replicates" in str(rep) and "no spread" in str(singles[0])
    with pytest.raises(ConfigError, match="at least two cases"):
        replicate(group_connectivity, [(models[:2],)], evaluator=ev)


def test_replicate_decides_on_the_margin_interval_not_on_agreement(xor_free_data):
    """Replicates that all hold by a hair, with a wide spread, are inconclusive.

    A tight interval above 0 holds; one below 0 fails.
    """
    models = linear_models(4)
    ev = evaluator(models[0], xor_free_data)
    cases = [(list(c),) for c in [(models[0], models[1]), (models[2], models[3]), (models[0], models[3])]]
    values = np.array([group_connectivity(*c, ev, metric="loss").numbers["group_barrier"] for c in cases])
    assert np.ptp(values) > 0  # the replicates differ, so the interval has width
    just_above = float(values.max()) + 1e-9  # every replicate holds, by as little as 1e-9
    rep = replicate(group_connectivity, cases, evaluator=ev, metric="loss", threshold=just_above)
    assert rep.numbers["holds_in"] == "3/3" and rep.status == "inconclusive"
    assert replicate(group_connectivity, cases, evaluator=ev, metric="loss",
                     threshold=float(values.max() + 10 * np.ptp(values))).status == "reproduced"
    assert replicate(group_connectivity, cases, evaluator=ev, metric="loss",
                     threshold=float(values.min() - 10 * np.ptp(values))).status == "not reproduced"


def test_verdicts_explain_their_numbers_and_mark_informational_ones(permuted_pair, xor_free_data):
    w1, w2 = permuted_pair
    ev = evaluator(w1, xor_free_data)
    v = transitivity(w1, w2, w1, ev)
    text = str(v)
    assert "ind_acc (info)" in text and "mean accuracy of w1 and w2" in text
    assert "docs/methods/fedgucci.md" in v.reference and "reference/" not in v.reference
    assert set(v.informational) <= set(v.legend)


def test_the_margin_is_printed_with_the_rule_that_makes_it(permuted_pair, xor_free_data):
    """A margin larger than ``threshold - barrier`` (the baseline's allowance) says where it comes from."""
    w1, w2 = permuted_pair
    ev = evaluator(w1, xor_free_data)
    v = transitivity(w1, w1, w1, ev, baseline=(w1, w2), alphas=11, min_reduction=0.5)
    allowance = max(0.05, 0.5 * v.numbers["baseline_barrier"])
    assert v.margin == pytest.approx(allowance - v.numbers["barrier_w1_w2"]) and v.margin > 0.05
    text = str(v)
    assert "Margin: " in text and "max(threshold, (1 - min_reduction) x baseline_barrier) - barrier_w1_w2" in text
    assert repr(v).startswith("Verdict(transitivity: reproduced -- ")
    assert "margin" in repr(v) and "numbers" not in repr(v)
    rep = replicate(group_connectivity, [([w1, w1],), ([w2, w2],)], evaluator=ev)
    assert rep.legend["margin"].startswith("mean over the replicates of threshold - group barrier")
    assert "margin: mean over the replicates" in str(rep)
