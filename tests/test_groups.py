"""Group barriers (FedGuCci Definition 3.6, Eq. 9/10) against hand computations."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from landscape import ConfigError, Evaluator, group_barrier, group_barrier_by_size, interpolate

from conftest import BN_CNN_FAN_INS, MLP_FAN_INS, N_DIGITS, float32_tolerance, make_bn_cnn, make_mlp


def _average(states: list[dict], mu: np.ndarray) -> dict:
    return {k: sum(float(m) * s[k] for m, s in zip(mu, states)) if torch.is_floating_point(states[0][k])
            else states[0][k] for k in states[0]}


def test_group_barrier_matches_hand_computation(digits, trained_mlps):
    x, y = digits
    ev = Evaluator(make_mlp(0), (x, y))
    states = [m.state_dict() for m in trained_mlps]
    res = group_barrier(trained_mlps, ev)
    members = ev.evaluate(trained_mlps)
    fused = ev.evaluate([_average(states, np.full(3, 1 / 3))])
    np.testing.assert_array_equal(res.member_loss, members.loss)  # the same models by the same path
    np.testing.assert_array_equal(res.member_accuracy, members.accuracy)
    # a float32 average of 3 state dicts against a float64 one: the averaging, the MLP's dot products, the loss sum
    tol = float32_tolerance(3 + MLP_FAN_INS + N_DIGITS)
    assert res.fused_loss == pytest.approx(fused.loss[0], rel=tol, abs=0)
    assert res.loss_barrier == pytest.approx(fused.loss[0] - members.loss.mean(), rel=0, abs=tol * fused.loss[0])
    assert res.accuracy_barrier == pytest.approx(1 - fused.accuracy[0] / members.accuracy.mean(), abs=1e-12)
    assert res.accuracy_barrier > 0.05  # independently trained MLPs: averaging them costs accuracy


def test_weights_are_normalised(digits, trained_mlps):
    x, y = digits
    ev = Evaluator(make_mlp(0), (x, y))
    res = group_barrier(trained_mlps, ev, weights=[2, 4, 6])
    np.testing.assert_allclose(res.weights, [1 / 6, 2 / 6, 3 / 6])
    fused = ev.evaluate([_average([m.state_dict() for m in trained_mlps], res.weights)])
    tol = float32_tolerance(3 + MLP_FAN_INS + N_DIGITS)  # float32 against float64 averaging, then as above
    assert res.fused_loss == pytest.approx(fused.loss[0], rel=tol, abs=0)
    assert res.loss_barrier == pytest.approx(fused.loss[0] - res.weights @ res.member_loss, rel=0,
                                             abs=tol * fused.loss[0])
    same = group_barrier(trained_mlps, ev, weights=np.array([1.0, 2.0, 3.0]))
    assert same.fused_loss == res.fused_loss
    for bad in ([1, -1, 1], [0, 0, 0], [1, 2], [1, np.nan, 1]):
        with pytest.raises(ValueError, match="weights"):
            group_barrier(trained_mlps, ev, weights=bad)


def test_identical_models_have_zero_group_barrier(digits, trained_mlps):
    x, y = digits
    res = group_barrier([trained_mlps[0]] * 3, Evaluator(make_mlp(0), (x, y)))
    # the float64 average of 3 equal float32 vectors rounds back to the vector: the same point, the same path
    assert res.loss_barrier == 0.0 and res.accuracy_barrier == 0.0


def test_two_models_equal_the_path_midpoint(digits, trained_mlps):
    x, y = digits
    ev = Evaluator(make_mlp(0), (x, y))
    res = group_barrier(trained_mlps[:2], ev)
    path = interpolate(*trained_mlps[:2], ev, alphas=3)
    # the path's midpoint may take the input-layer shortcut (a sum of 2 outputs): then the MLP's dot products and
    # the loss sum round otherwise
    tol = float32_tolerance(2 + MLP_FAN_INS + N_DIGITS)
    assert res.loss_barrier == pytest.approx(path.loss_barrier_midpoint, rel=0, abs=tol * res.fused_loss)
    assert res.accuracy_barrier == pytest.approx(path.accuracy_barrier_midpoint, abs=1e-12)


def test_group_barrier_with_batchnorm_averages_buffers(digits_images):
    x, y = digits_images
    models = [make_bn_cnn(s) for s in (1, 2, 3)]
    ev = Evaluator(make_bn_cnn(0), (x, y), bn="interpolate")
    res = group_barrier(models, ev)
    fused = _average([m.state_dict() for m in models], np.full(3, 1 / 3))
    reference = make_bn_cnn(0)
    reference.load_state_dict(fused)
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(reference.eval()(x).double(), y).item()
    # float32 against float64 averaging of 3 models, the CNN's dot products, the float32 loss sum over the samples
    assert res.fused_loss == pytest.approx(loss, rel=float32_tolerance(3 + BN_CNN_FAN_INS + N_DIGITS), abs=0)


def test_group_barrier_by_size_is_consistent_with_group_barrier(digits, trained_mlps):
    x, y = digits
    ev = Evaluator(make_mlp(0), (x, y))
    models = trained_mlps + [make_mlp(9)]
    res = group_barrier_by_size(models, ev, sizes=[2, 4], draws=4, seed=1)
    assert res.loss_barrier.shape == (2, 4) and res.sizes.tolist() == [2, 4]
    full = group_barrier(models, ev)  # K = n: every draw is the whole set
    np.testing.assert_array_equal(res.loss_barrier[1], full.loss_barrier)  # the whole set, by the same path
    np.testing.assert_array_equal(res.accuracy_barrier[1], full.accuracy_barrier)
    pairs = [group_barrier([models[i], models[j]], ev) for i in range(4) for j in range(i + 1, 4)]
    pair_values = np.array([p.loss_barrier for p in pairs])
    for value in res.loss_barrier[0]:  # every K = 2 draw is one of the six pairs
        assert np.abs(pair_values - value).min() < 1e-6
    again = group_barrier_by_size(models, ev, sizes=[2, 4], draws=4, seed=1)
    np.testing.assert_array_equal(again.loss_barrier, res.loss_barrier)
    with pytest.raises(ConfigError, match=r"\[2, 4\]"):
        group_barrier_by_size(models, ev, sizes=[5])


def test_zero_accuracy_members_give_zero_accuracy_barrier_everywhere(digits):
    x, y = digits
    keep = y != 9
    ev = Evaluator(make_mlp(0), (x[keep], y[keep]))
    models = []
    for seed in (1, 2, 3):
        model = make_mlp(seed)
        with torch.no_grad():
            model[3].bias[9] = 1e3  # always predicts the absent class 9
        models.append(model)
    single = group_barrier(models, ev)
    assert single.member_accuracy.tolist() == [0.0, 0.0, 0.0] and single.accuracy_barrier == 0.0
    by_size = group_barrier_by_size(models, ev, sizes=[3], draws=2)
    np.testing.assert_array_equal(by_size.accuracy_barrier, [[0.0, 0.0]])


def test_group_errors(digits):
    x, y = digits
    ev = Evaluator(make_mlp(0), (x, y))
    with pytest.raises(ConfigError, match="at least two"):
        group_barrier([make_mlp(1)], ev)
