"""Evaluator: strategies agree, BatchNorm modes match a serial computation, the module is untouched.

Every BatchNorm mode matches an independent serial computation, losses are sample-weighted, the
user's module is never modified, bad data fail early.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from landscape import ConfigError, DataError, Evaluator, NonFiniteWeightsError, interpolate

from conftest import (
    BN_CNN_FAN_INS,
    BN_CNN_MAP,
    FLOAT64_UNIT_ROUNDOFF,
    MLP_FAN_INS,
    N_DIGITS,
    float32_tolerance,
    make_bn_cnn,
    make_mlp,
)

ALPHAS = np.array([0.0, 0.3, 0.5, 1.0, 1.4])
BATCH = 128  # 300 samples -> batches of 128, 128, 44 (unequal last batch)


def _mix(sa: dict, sb: dict, alpha: float) -> dict:
    return {k: (1 - alpha) * sa[k] + alpha * sb[k] if torch.is_floating_point(sa[k]) else sa[k].clone()
            for k in sa}


def _serial_metrics(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Loss and accuracy of a module in eval mode, one sample-weighted pass in float64."""
    model = model.eval()
    with torch.no_grad():
        out = model(x)
    loss = nn.functional.cross_entropy(out.double(), y, reduction="sum").item() / len(y)
    return loss, (out.argmax(1) == y).double().mean().item()


def _reference_path(template: nn.Module, a: nn.Module, b: nn.Module, x, y, bn: str) -> np.ndarray:
    """Serial reference of a path's losses for each BatchNorm mode."""
    sa, sb = a.state_dict(), b.state_dict()
    losses = []
    for alpha in ALPHAS:
        model = copy.deepcopy(template)
        state = _mix(sa, sb, alpha)
        state.update({k: v for k, v in template.state_dict().items() if k.endswith("num_batches_tracked")})
        if bn == "keep":
            state.update({k: v for k, v in sa.items() if "running" in k})
        model.load_state_dict(state)
        if bn == "recompute":
            model.train()
            for m in model.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.reset_running_stats()
                    m.momentum = None
            with torch.no_grad():
                for start in range(0, len(x), BATCH):
                    model(x[start:start + BATCH])
        losses.append(_serial_metrics(model, x, y)[0])
    return np.array(losses)


@pytest.mark.parametrize("bn", ["interpolate", "keep", "recompute"])
def test_bn_modes_match_serial_reference_and_strategies_agree(digits_images, bn):
    x, y = digits_images
    template, a, b = make_bn_cnn(0), make_bn_cnn(1), make_bn_cnn(2)
    expected = _reference_path(template, a, b, x, y, bn)
    # float32 forward passes (and, recomputed, a BatchNorm2d mean over a batch's 6x6 maps) and a
    # float32 loss sum over a batch, against the reference's own float32 forward pass
    tol = float32_tolerance(BN_CNN_FAN_INS + BATCH + (BATCH * BN_CNN_MAP if bn == "recompute" else 0))
    for strategy in ("loop", "vmap"):
        ev = Evaluator(template, (x, y), bn=bn, strategy=strategy, batch_size=BATCH, device="cpu")
        path = interpolate(a, b, ev, alphas=ALPHAS)
        np.testing.assert_allclose(path.loss, expected, rtol=tol, atol=0)
    # the modes really differ on this model (the test would not notice a mode being ignored)
    others = {m: _reference_path(template, a, b, x, y, m) for m in ("interpolate", "keep", "recompute")}
    for m, curve in others.items():
        if m != bn:
            assert np.abs(curve - expected)[1:].max() > 1e-4


def test_loop_and_vmap_agree_on_mlp(digits, trained_mlps):
    x, y = digits
    a, b = trained_mlps[:2]
    results = [interpolate(a, b, Evaluator(make_mlp(0), (x, y), strategy=s, batch_size=BATCH, device="cpu",
                                           chunk_size=4), alphas=ALPHAS) for s in ("loop", "vmap")]
    # loop and vmap (batched matmul) kernels: the MLP's dot products and a batch's float32 loss sum
    np.testing.assert_allclose(results[0].loss, results[1].loss, rtol=float32_tolerance(MLP_FAN_INS + BATCH), atol=0)
    np.testing.assert_allclose(results[0].accuracy, results[1].accuracy, atol=1e-12)


def test_loss_is_sample_weighted_with_unequal_last_batch(digits, trained_mlps):
    x, y = digits
    model = trained_mlps[0]
    with torch.no_grad():
        per_sample = nn.functional.cross_entropy(model(x).double(), y, reduction="none")
    # a mean of batch means would weight the 44-sample last batch like the full ones
    batch_means = [per_sample[s:s + BATCH].mean().item() for s in range(0, len(x), BATCH)]
    assert abs(np.mean(batch_means) - per_sample.mean().item()) > 1e-4
    for data in ((x, y), DataLoader(TensorDataset(x, y), batch_size=BATCH), TensorDataset(x, y)):
        m = Evaluator(make_mlp(0), data, batch_size=BATCH, device="cpu").evaluate([model])
        # the MLP's dot products and a batch's float32 loss sum, against a forward pass on all samples at once
        assert m.loss[0] == pytest.approx(per_sample.mean().item(), rel=float32_tolerance(MLP_FAN_INS + BATCH), abs=0)
        assert m.accuracy[0] == pytest.approx(_serial_metrics(model, x, y)[1], abs=1e-12)


def test_evaluate_accepts_every_model_form(digits, trained_mlps, tmp_path):
    x, y = digits
    model = trained_mlps[1]
    path = tmp_path / "m.pt"
    torch.save(model.state_dict(), path)
    ev = Evaluator(make_mlp(0), (x, y), device="cpu")
    vec = ev.vector(model)
    m = ev.evaluate([model, model.state_dict(), path, str(path)])
    assert np.all(m.loss == m.loss[0]) and np.all(m.accuracy == m.accuracy[0])
    np.testing.assert_array_equal(ev.evaluate(vec[None]).loss, m.loss[:1])  # the same model by the same path
    # the MLP's dot products and the float32 loss sum over the single batch of all samples
    assert m.loss[0] == pytest.approx(_serial_metrics(model, x, y)[0], rel=float32_tolerance(MLP_FAN_INS + N_DIGITS),
                                      abs=0)
    assert ev.points_evaluated == 5
    for single in (model, model.state_dict(), path, str(path)):  # one model-like, not a list
        np.testing.assert_array_equal(ev.evaluate(single).loss, m.loss[:1])


def test_float64_evaluation_matches_a_double_precision_reference(digits_images):
    x, y = digits_images
    model = make_bn_cnn(1)
    ref = copy.deepcopy(model).double().train()
    for m in ref.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
    with torch.no_grad():
        ref(x.double())
        expected = nn.functional.cross_entropy(ref.eval()(x.double()), y).item()
    for strategy in ("loop", "vmap"):
        ev = Evaluator(make_bn_cnn(0), (x, y), dtype=torch.float64, bn="recompute", strategy=strategy)
        # float64 throughout: the CNN's dot products, the BatchNorm2d mean over all samples' 6x6 maps, the loss sum
        tol = float32_tolerance(BN_CNN_FAN_INS + N_DIGITS * BN_CNN_MAP + N_DIGITS, unit=FLOAT64_UNIT_ROUNDOFF)
        assert ev.evaluate(model).loss[0] == pytest.approx(expected, rel=tol, abs=0)


@pytest.mark.parametrize("bn", ["interpolate", "keep", "recompute"])
def test_user_module_is_never_modified(digits_images, bn):
    x, y = digits_images
    template = make_bn_cnn(0).train()  # a module left in train mode by its user
    before = copy.deepcopy(template.state_dict())
    ev = Evaluator(template, (x, y), bn=bn, device="cpu")
    interpolate(make_bn_cnn(1), make_bn_cnn(2), ev, alphas=3)
    ev.evaluate([template])
    assert template.training and all(m.training for m in template.modules())
    after = template.state_dict()
    assert after.keys() == before.keys()
    for k in before:
        assert torch.equal(before[k], after[k]), k


def test_models_without_batchnorm_are_identical_in_every_mode(digits, trained_mlps):
    x, y = digits
    curves = [interpolate(*trained_mlps[:2], Evaluator(make_mlp(0), (x, y), bn=bn, device="cpu"), alphas=ALPHAS).loss
              for bn in ("interpolate", "keep", "recompute")]
    np.testing.assert_array_equal(curves[0], curves[1])
    np.testing.assert_array_equal(curves[0], curves[2])


def test_recompute_uses_given_bn_data_and_batches(digits_images):
    x, y = digits_images
    template, model = make_bn_cnn(0), make_bn_cnn(4)
    ev = Evaluator(template, (x, y), bn="recompute", bn_data=(x[:100], y[:100]), bn_batches=1,
                   batch_size=64, device="cpu")
    ref = copy.deepcopy(model).train()
    for m in ref.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
    with torch.no_grad():
        ref(x[:64])  # one batch of 64 from bn_data
    # the CNN's dot products, the BatchNorm2d mean over one batch's 6x6 maps, the float32 loss sum over the batch
    tol = float32_tolerance(BN_CNN_FAN_INS + 64 * BN_CNN_MAP + 64)
    assert ev.evaluate([model]).loss[0] == pytest.approx(_serial_metrics(ref, x, y)[0], rel=tol, abs=0)
    assert ev.fingerprint()["bn_batches"] == 1


def test_mse_and_callable_losses(digits, trained_mlps):
    x, y = digits
    model = trained_mlps[0]
    with torch.no_grad():
        out = model(x).double()
    onehot = nn.functional.one_hot(y, 10).double()
    mse = Evaluator(make_mlp(0), (x, y), loss="mse", device="cpu").evaluate([model]).loss[0]
    tol = float32_tolerance(MLP_FAN_INS + 10 + N_DIGITS)  # dot products, a sum over 10 classes and over the samples
    assert mse == pytest.approx(((out - onehot) ** 2).sum(1).mean().item(), rel=tol, abs=0)

    def l1(o: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return (o - nn.functional.one_hot(t, 10)).abs().sum(1)

    ev = Evaluator(make_mlp(0), (x, y), loss=l1, device="cpu")
    assert ev.evaluate([model]).loss[0] == pytest.approx((out - onehot).abs().sum(1).mean().item(), rel=tol, abs=0)


def test_callable_loss_without_qualname_and_distinct_lambdas_have_distinct_keys(digits):
    x, y = digits
    ev_module = Evaluator(make_mlp(0), (x, y), loss=nn.CrossEntropyLoss(reduction="none"), device="cpu")
    ev_ce = Evaluator(make_mlp(0), (x, y), device="cpu")
    # the built-in loss takes the class-major output layer and a float32 sum over the one batch of all samples
    np.testing.assert_allclose(ev_module.evaluate([make_mlp(3)]).loss, ev_ce.evaluate([make_mlp(3)]).loss,
                               rtol=float32_tolerance(MLP_FAN_INS + N_DIGITS), atol=0)
    first = Evaluator(make_mlp(0), (x, y), loss=lambda o, t: nn.functional.cross_entropy(o, t, reduction="none"))
    second = Evaluator(make_mlp(0), (x, y), loss=lambda o, t: 2 * nn.functional.cross_entropy(o, t, reduction="none"))
    assert first.fingerprint()["loss"] != second.fingerprint()["loss"]

    def scaled(factor: float):
        return lambda o, t: factor * nn.functional.cross_entropy(o, t, reduction="none")

    keys = {Evaluator(make_mlp(0), (x, y), loss=scaled(f)).fingerprint()["loss"] for f in (1.0, 2.0, 1.0)}
    assert len(keys) == 2


def test_points_evaluated_counts_points(digits):
    x, y = digits
    ev = Evaluator(make_mlp(0), (x, y), device="cpu", chunk_size=3)
    interpolate(make_mlp(1), make_mlp(2), ev, alphas=7)
    assert ev.points_evaluated == 7
    ev.evaluate([make_mlp(1)])
    assert ev.points_evaluated == 8


def test_data_errors_before_any_work(digits, digits_images):
    x, y = digits
    with pytest.raises(DataError, match=r"labels must lie in \[0, 9\].*\[0, 12\]"):
        Evaluator(make_mlp(0), (x, torch.where(y == 3, 12, y)))
    with pytest.raises(DataError, match=r"\[-1, 9\]"):
        Evaluator(make_mlp(0), (x, torch.where(y == 3, -1, y)))
    with pytest.raises(DataError, match=r"labels must lie"):
        Evaluator(make_mlp(0), (x, torch.where(y == 3, 12, y)), loss="mse")
    with pytest.raises(DataError, match=r"inputs of shape \(1, 8, 8\)"):
        Evaluator(make_mlp(0, in_features=32), digits_images)
    with pytest.raises(DataError, match="empty"):
        Evaluator(make_mlp(0), (x[:0], y[:0]))
    with pytest.raises(DataError, match="empty"):
        Evaluator(make_mlp(0), TensorDataset(x[:0], y[:0]))
    with pytest.raises(DataError, match="300 samples but targets have 299"):
        Evaluator(make_mlp(0), (x, y[:-1]))
    with pytest.raises(DataError):
        Evaluator(make_mlp(0), "not data")


def test_config_errors():
    x, y = torch.zeros(4, 64), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ConfigError, match="bn must be one of"):
        Evaluator(make_mlp(0), (x, y), bn="freeze")
    with pytest.raises(ConfigError, match="strategy"):
        Evaluator(make_mlp(0), (x, y), strategy="fast")
    with pytest.raises(ConfigError, match="loss must be one of .cross_entropy"):
        Evaluator(make_mlp(0), (x, y), loss="hinge")
    with pytest.raises(ConfigError, match="nn.Module"):
        Evaluator(make_mlp(0).state_dict(), (x, y))


def test_nonfinite_model_is_refused(digits):
    x, y = digits
    bad = make_mlp(1)
    with torch.no_grad():
        bad[3].bias[2] = float("nan")
    with pytest.raises(NonFiniteWeightsError, match=r"3\.bias"):
        Evaluator(make_mlp(0), (x, y)).evaluate([bad])


def test_auto_strategy_on_cpu_is_recorded(digits):
    x, y = digits
    ev = Evaluator(make_mlp(0), (x, y), device="cpu")
    ev.evaluate([make_mlp(1)])
    assert ev.strategy == "loop" and "cpu" in ev.strategy_reason


def test_interpolating_batchnorm_statistics_warns_once_with_the_docs_page(digits, digits_images):
    import warnings

    from landscape import BatchNormWarning, interpolate, plane

    x, y = digits_images
    a, b, c = make_bn_cnn(0), make_bn_cnn(1), make_bn_cnn(2)
    ev = Evaluator(a, (x[:64], y[:64]), device="cpu")
    with pytest.warns(BatchNormWarning, match="docs/batchnorm.md"):
        path = interpolate(a, b, ev, alphas=3)
    assert path.spec["evaluator"]["batchnorm_layers"] > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", BatchNormWarning)
        plane(a, b, c, ev, resolution=2)  # once per evaluator
        quiet = Evaluator(a, (x[:64], y[:64]), device="cpu", bn="recompute", bn_data=(x[64:192], y[64:192]))
        interpolate(a, b, quiet, alphas=3)  # other modes do not warn
        mlp = Evaluator(make_mlp(0), (digits[0][:64], digits[1][:64]), device="cpu")
        interpolate(make_mlp(0), make_mlp(1), mlp, alphas=3)  # no BatchNorm: nothing to warn about
