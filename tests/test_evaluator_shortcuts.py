"""The loop's CPU shortcuts against independent computations.

The input-layer expansion (``landscape.input_layer``) and class-major logits and metrics
(``landscape.class_major``). Each test also checks that the shortcut was actually taken (or
refused), so it can fail.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from landscape import Evaluator, interpolate, plane
from landscape.evaluation.class_major_scoring import ClassMetrics
from landscape.space.params import ParameterSpace

from conftest import N_DIGITS, float32_tolerance, make_mlp, seeded_init_


def reference_metrics(template: nn.Module, vecs: torch.Tensor, x: torch.Tensor, y: torch.Tensor
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Mean cross-entropy and argmax accuracy of each flat vector, via load_state_dict."""
    space = ParameterSpace(template)
    model = copy.deepcopy(template).eval()
    loss, acc = [], []
    with torch.no_grad():
        for v in vecs:
            model.load_state_dict(space.state_dict(v.float()))
            out = model(x)
            loss.append(F.cross_entropy(out, y).item())
            acc.append((out.argmax(-1) == y).double().mean().item())
    return np.array(loss), np.array(acc)


def plane_vectors(result) -> torch.Tensor:
    origin, u, v = (torch.from_numpy(t) for t in (result.origin, result.u, result.v))
    gx, gy = np.meshgrid(result.x, result.y)
    return torch.stack([origin + a * u + b * v for a, b in zip(gx.ravel(), gy.ravel())])


class ConvFirst(nn.Module):
    """A 5x5 convolution on 3-channel inputs (fan-in 75) first, then a linear head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 5, padding=2)
        self.head = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).flatten(1))


class Rescaled(nn.Module):
    """The first linear layer reads ``2 x``, not the data: no shortcut may be taken."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(64, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(torch.relu(self.first(2 * x)))


class Reused(nn.Module):
    """One linear layer applied twice: its second input is not the data."""

    def __init__(self):
        super().__init__()
        self.square = nn.Linear(64, 64)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(torch.relu(self.square(torch.relu(self.square(x)))))


def _three(make) -> list[nn.Module]:
    return [seeded_init_(make(), seed) for seed in (1, 2, 3)]


@pytest.mark.parametrize("batch_size", [None, 64])
def test_plane_with_input_expansion_equals_load_state_dict(digits, batch_size):
    x, y = digits
    models = [make_mlp(s, hidden=32) for s in (1, 2, 3)]
    ev = Evaluator(models[0], (x, y), batch_size=batch_size, progress=False)
    result = plane(*models, ev, resolution=5)
    assert ev.shortcut_layers == ["1"] and ev.class_major_head == "3"
    loss, acc = reference_metrics(models[0], plane_vectors(result), x, y)
    # fan-ins 64 and 32, the first layer as a sum of 3 precomputed outputs, the float32 loss sum over the samples
    np.testing.assert_allclose(result.loss.ravel(), loss, rtol=float32_tolerance(64 + 32 + 3 + N_DIGITS), atol=0)
    np.testing.assert_array_equal(result.accuracy.ravel(), acc)


def test_convolution_first_is_expanded_and_matches(digits):
    x, y = digits
    images = x.reshape(-1, 1, 8, 8).repeat(1, 3, 1, 1) * torch.tensor([1.0, 0.5, -0.5])[:, None, None]
    models = _three(ConvFirst)
    ev = Evaluator(models[0], (images, y), batch_size=100, progress=False)
    result = plane(*models, ev, resolution=4)
    assert ev.shortcut_layers == ["conv"]
    loss, acc = reference_metrics(models[0], plane_vectors(result), images, y)
    # fan-ins 3*5*5 and 256, the convolution as a sum of 3 precomputed outputs, the float32 loss sum over the samples
    np.testing.assert_allclose(result.loss.ravel(), loss, rtol=float32_tolerance(75 + 256 + 3 + N_DIGITS), atol=0)
    np.testing.assert_array_equal(result.accuracy.ravel(), acc)


@pytest.mark.parametrize("make,reused", [(lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), False),
                                         (lambda: make_mlp(1, hidden=32), True)])
def test_expanded_outputs_of_two_points_stay_distinct_unless_internal(digits, make, reused):
    """Two points' outputs of the expanded layer, both kept: each equals its own weights' layer.

    The linear model's expanded layer gives the model's output, so each point gets a new
    tensor; the MLP's first layer is internal, so its points share one buffer, overwritten.
    """
    from landscape.evaluation.input_layer_shortcut import InputLayerShortcut

    x, y = digits
    module = seeded_init_(make(), 0)
    space = ParameterSpace(module)
    origin = space.to_vector(module)
    directions = torch.randn(2, space.size, generator=torch.Generator().manual_seed(0))
    first = next(m for m in module.modules() if isinstance(m, nn.Linear))
    shortcut = InputLayerShortcut(module, space, [(x, y)], origin, directions, budget_bytes=2**30)
    assert shortcut.active
    kept = []
    for coeffs in ([0.5, 0.0], [0.0, -0.25]):
        shortcut.set(coeffs)
        with torch.no_grad():
            kept.append(first(x.flatten(1)))
    assert (kept[0].data_ptr() == kept[1].data_ptr()) is reused
    shortcut.set(None)
    prefix = next(n for n, m in module.named_modules() if m is first)

    inputs = x.flatten(1).double()

    def layer(vec: torch.Tensor, magnitude: bool = False) -> torch.Tensor:
        w = space.state_dict(vec.double())
        weight, bias = w[f"{prefix}.weight"], w[f"{prefix}.bias"]
        return inputs.abs() @ weight.abs().T + bias.abs() if magnitude else F.linear(inputs, weight, bias)

    def check(out: torch.Tensor, coeffs: list[float]) -> None:
        """Against the float64 layer at the point: float32 sums of fan-in 64, then of 3 outputs.

        The bound scales with the sum of the three precomputed outputs' magnitudes.
        """
        scale = layer(origin, True) + sum(abs(c) * layer(d, True) for c, d in zip(coeffs, directions))
        error = (out.double() - layer(origin + torch.tensor(coeffs) @ directions)).abs()
        assert (error <= float32_tolerance(64 + 3, sides=1) * scale).all()

    check(kept[1], [0.0, -0.25])
    if not reused:
        check(kept[0], [0.5, 0.0])
    shortcut.remove()


@pytest.mark.parametrize("make,fan_ins", [(Rescaled, 64 + 16), (Reused, 3 * 64)])
def test_layers_not_reading_the_data_are_not_expanded(digits, make, fan_ins):
    x, y = digits
    models = _three(make)
    ev = Evaluator(models[0], (x, y), progress=False)
    result = plane(*models, ev, resolution=4)
    assert ev.shortcut_layers == []
    loss, acc = reference_metrics(models[0], plane_vectors(result), x, y)
    # the forward's dot products (other kernels) and the float32 loss sum over the samples
    np.testing.assert_allclose(result.loss.ravel(), loss, rtol=float32_tolerance(fan_ins + N_DIGITS), atol=0)
    np.testing.assert_array_equal(result.accuracy.ravel(), acc)


def test_expansion_respects_the_memory_budget_and_can_be_disabled(digits):
    x, y = digits
    a, b = make_mlp(1, hidden=32), make_mlp(2, hidden=32)
    on = Evaluator(a, (x, y), progress=False)
    first = interpolate(a, b, on, alphas=21)
    assert on.shortcut_layers == ["1"]
    again = interpolate(b, a, on, alphas=21)  # the same evaluator expands its layer again
    assert on.shortcut_layers == ["1"]
    # other origin and direction: fan-ins 64 and 32, the first layer as a sum of 2 outputs, the loss sum
    tol = float32_tolerance(64 + 32 + 2 + N_DIGITS)
    np.testing.assert_allclose(again.loss[::-1], first.loss, rtol=tol, atol=0)
    tight = Evaluator(a, (x, y), progress=False, memory_budget=4 * 3 * len(x) * 32 * 4 - 4)  # a quarter: < 3 outputs
    off = Evaluator(a, (x, y), progress=False, input_shortcut=False)
    for ev in (tight, off):
        curve = interpolate(a, b, ev, alphas=21)
        assert ev.shortcut_layers == []
        np.testing.assert_allclose(curve.loss, first.loss, rtol=tol, atol=0)  # the textbook forward
    # the user's module is never modified: its layers keep their own forward
    assert all("forward" not in vars(m) for m in a.modules())


def test_class_metrics_match_cross_entropy_and_argmax_with_ties_and_minus_infinity():
    gen = torch.Generator().manual_seed(0)
    n, c = 500, 7
    y = torch.randint(0, c, (n,), generator=gen)
    logits = torch.randint(-2, 3, (n, c), generator=gen).float()  # many ties
    logits[:50] = 0.0  # all classes tied: argmax is class 0
    logits[50:100, 0] = float("-inf")
    logits[50:100] = torch.where(torch.arange(c) == y[50:100, None], 1.0, logits[50:100])  # label finite
    metrics = ClassMetrics(c)
    metrics.prepare([y])
    finite = logits.clone()
    finite[50:100, 0] = -5.0
    cases = [(finite, finite), (finite.t().contiguous().t(), finite), (logits.t().contiguous().t(), logits)]
    for layout, values in cases:  # row-major, class-major, class-major with -inf logits
        loss, correct = metrics(layout, y)
        # a log-sum-exp over the 7 classes and a float32 sum over the 500 samples, in other orders
        assert loss.item() == pytest.approx(F.cross_entropy(values, y, reduction="sum").item(),
                                            rel=float32_tolerance(c + n), abs=0)
        assert correct.item() == (values.argmax(-1) == y).sum().item()
    assert metrics(logits, y) is None  # row-major -inf: the transposing product gives NaN, caller decides
    assert metrics(logits, y.clone()) is None  # targets it was not prepared for
    for bad in (float("nan"), float("inf")):
        broken = logits.clone()
        broken[3, 1] = bad
        assert metrics(broken, y) is None  # the caller's row-major path decides


def test_evaluator_accuracy_of_a_tied_model_follows_argmax(digits):
    x, y = digits
    zero = make_mlp(0)
    with torch.no_grad():
        for p in zero.parameters():
            p.zero_()
    ev = Evaluator(zero, (x, y), progress=False)
    metrics = ev.evaluate([zero, make_mlp(1)])
    assert metrics.accuracy[0] == pytest.approx((y == 0).double().mean().item())
    # float32 log(10), summed over the samples in float32, against the float64 value
    assert metrics.loss[0] == pytest.approx(np.log(10), rel=float32_tolerance(1 + N_DIGITS, sides=1), abs=0)
    nan_model = make_mlp(1)
    with torch.no_grad():
        nan_model[3].bias[2] = float("nan")
    nan_ev = Evaluator(make_mlp(1), (x, y), progress=False)
    nan_metrics = nan_ev.evaluate(torch.stack([nan_ev.space.flatten(nan_model.state_dict(), check_finite=False)]))
    out = nan_model(x)
    assert np.isnan(nan_metrics.loss[0])
    assert nan_metrics.accuracy[0] == pytest.approx((out.argmax(-1) == y).double().mean().item())


class _Interrupt(Exception):
    """Raised by a forward hook to stop an evaluation part-way."""


def test_a_resumed_plane_takes_the_uninterrupted_code_path_bit_for_bit(digits, tmp_path):
    """The shortcut is decided for the whole point set.

    The few points left after an interruption are computed exactly as in an
    uninterrupted run (no float tolerance).
    """
    from landscape import Cache

    x, y = digits
    models = [make_mlp(s, hidden=32) for s in (1, 2, 3)]
    whole = plane(*models, Evaluator(models[0], (x, y), progress=False), resolution=5)
    calls = {"n": 0}

    def stop_late(*_):
        calls["n"] += 1
        if calls["n"] > 22:  # 22 of 25 points done: 3 are left, fewer than 4 (k + 1) = 12
            raise _Interrupt

    template = make_mlp(0, hidden=32)
    handle = template.register_forward_pre_hook(stop_late)
    first = Evaluator(template, (x, y), progress=False, chunk_size=1, cache=Cache(tmp_path / "c", flush_interval=0.0))
    with pytest.raises(_Interrupt):
        plane(*models, first, resolution=5)
    handle.remove()
    resumed = Evaluator(template, (x, y), progress=False, cache=Cache(tmp_path / "c"))
    result = plane(*models, resumed, resolution=5)
    assert 0 < resumed.points_evaluated < 12 and resumed.shortcut_layers == ["1"]
    np.testing.assert_array_equal(result.loss, whole.loss)
    np.testing.assert_array_equal(result.accuracy, whole.accuracy)
