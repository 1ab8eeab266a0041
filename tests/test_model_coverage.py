"""Models and data the evaluator must either handle or refuse with a clear message (issue: hardening).

* a forward returning a dict or a tuple works through ``output=`` and is refused without it;
* the deprecated ``torch.nn.utils.weight_norm`` gets a clear error, not torch's raw one;
* float, boolean and (N, 1) labels of a classification loss get a ``DataError``;
* the error for NaN weights gives advice that exists.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from landscape import ConfigError, DataError, Evaluator, NonFiniteWeightsError, interpolate

from conftest import float32_tolerance


class Net(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))

    def forward(self, x):
        logits = self.body(x)
        if self.kind == "dict":
            return {"aux": logits.sum(-1), "logits": logits}
        if self.kind == "tuple":
            return logits.detach() * 0, logits
        return logits


def _data(n: int = 30):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


@pytest.mark.parametrize("kind, output", [("dict", "logits"), ("tuple", 1), ("dict", lambda out: out["logits"])])
def test_container_outputs_work_through_the_output_selector(kind, output):
    torch.manual_seed(0)
    a, b = Net(kind), Net(kind)
    plain_a, plain_b = Net("tensor"), Net("tensor")
    plain_a.load_state_dict(a.state_dict())
    plain_b.load_state_dict(b.state_dict())
    x, y = _data()
    selected = interpolate(a, b, Evaluator(a, (x, y), device="cpu", output=output), alphas=5)
    reference = interpolate(plain_a, plain_b, Evaluator(plain_a, (x, y), device="cpu"), alphas=5)
    # a plain tensor output takes the class-major output layer: fan-ins 4 and 8, the float32 sum over 30 samples
    np.testing.assert_allclose(selected.loss, reference.loss, rtol=float32_tolerance(4 + 8 + 30), atol=0)
    np.testing.assert_array_equal(selected.accuracy, reference.accuracy)


def test_container_outputs_without_a_selector_are_refused_naming_the_option():
    x, y = _data()
    with pytest.raises(DataError, match=r"returns a tuple.*output="):
        Evaluator(Net("tuple"), (x, y), device="cpu")
    torch.manual_seed(0)
    net = Net("dict")  # a dict (a Hugging Face ModelOutput) with "logits" is scored on them by default
    default = interpolate(net, net, Evaluator(net, (x, y), device="cpu"), alphas=3)
    chosen = interpolate(net, net, Evaluator(net, (x, y), device="cpu", output="logits"), alphas=3)
    np.testing.assert_array_equal(default.loss, chosen.loss)
    with pytest.raises(DataError, match="output='nope' does not select"):
        Evaluator(Net("dict"), (x, y), device="cpu", output="nope")


def test_the_deprecated_weight_norm_gets_a_clear_error():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = nn.Sequential(torch.nn.utils.weight_norm(nn.Linear(4, 3)))
    x, y = _data()
    with pytest.raises(ConfigError, match="deprecated torch.nn.utils.weight_norm.*parametrizations.weight_norm"):
        Evaluator(model, (x, y), device="cpu")


@pytest.mark.parametrize("labels, message", [
    (lambda y: y.float(), r"floating point with shape \(30,\)"),
    (lambda y: y.reshape(-1, 1), r"shape \(30, 1\)"),
    (lambda y: y.float().reshape(-1, 1), r"floating point with shape \(30, 1\)"),
    (lambda y: y > 0, "booleans"),
])
def test_classification_labels_of_the_wrong_kind_get_a_data_error(labels, message):
    x, y = _data()
    with pytest.raises(DataError, match=message):
        Evaluator(Net("tensor"), (x, labels(y)), device="cpu")


def test_class_probability_targets_are_accepted_for_cross_entropy():
    x, y = _data()
    probs = torch.nn.functional.one_hot(y, 3).float()
    model = Net("tensor")
    ev = Evaluator(model, (x, probs), device="cpu")
    expected = torch.nn.functional.cross_entropy(model(x), y).item()
    # fan-ins 4 and 8, the soft-target sum over 3 classes, the float32 sum over 30 samples
    assert ev.evaluate(model).loss[0] == pytest.approx(expected, rel=float32_tolerance(4 + 8 + 3 + 30), abs=0)


def test_nan_weights_error_gives_advice_that_exists():
    model = Net("tensor")
    with torch.no_grad():
        model.body[0].weight[0, 0] = float("nan")
    x, y = _data()
    ev = Evaluator(Net("tensor"), (x, y), device="cpu")
    with pytest.raises(NonFiniteWeightsError) as info:
        ev.evaluate(model)
    assert "check_finite" not in str(info.value) and "body.0.weight" in str(info.value)
