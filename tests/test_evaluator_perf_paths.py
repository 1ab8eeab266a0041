"""Fast paths of the Evaluator.

The flat-view loop equals an independent functional_call computation (BatchNorm buffers,
tied weights, integer buffers), out-of-memory retry with a smaller chunk, bf16 autocast
and torch.compile options.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call

from landscape import Evaluator
from landscape.evaluation import point_strategies as strategies_module
from landscape.space.params import ParameterSpace
from landscape.space.points import PointSet

from conftest import BN_CNN_FAN_INS, MLP_FAN_INS, N_DIGITS, float32_tolerance, make_bn_cnn, make_mlp, seeded_init_


class Tied(nn.Module):
    """Two linear maps sharing one weight; a float and an integer buffer."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(64, 10)
        self.tied = nn.Linear(64, 10, bias=False)
        self.tied.weight = self.head.weight  # one Parameter under two names
        self.register_buffer("shift", torch.zeros(10))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        return self.head(x) + self.shift + 0.5 * self.tied(x)


def _reference(model: nn.Module, vecs: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """Loss of each flat vector by functional_call on a fresh state dict (independent path)."""
    space = ParameterSpace(model)
    out = []
    for vec in vecs:
        state = space.state_dict(vec.float())
        with torch.no_grad():
            logits = functional_call(model.eval(), state, (x,))
        out.append(nn.functional.cross_entropy(logits.double(), y).item())
    return np.array(out)


def _points(model: nn.Module, n: int, seed: int = 0) -> torch.Tensor:
    space = ParameterSpace(model)
    gen = torch.Generator().manual_seed(seed)
    base = space.to_vector(model, dtype=torch.float64)
    return base + 0.3 * torch.randn(n, space.size, generator=gen, dtype=torch.float64) * base.abs().mean()


@pytest.mark.parametrize("factory,images,fan_ins", [(lambda: make_mlp(0), False, MLP_FAN_INS),
                                                    (lambda: make_bn_cnn(0), True, BN_CNN_FAN_INS),
                                                    (lambda: seeded_init_(Tied(), 0), False, 2 * 64 + 2)])
def test_flat_loop_equals_independent_functional_call(digits, factory, images, fan_ins, monkeypatch):
    x, y = digits
    x = x.reshape(-1, 1, 8, 8) if images else x
    model = factory()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    vecs = _points(model, 5)
    ev = Evaluator(model, (x, y), strategy="loop", batch_size=128, progress=False)
    loss, acc = ev.evaluate_points(PointSet.explicit(vecs))
    tol = float32_tolerance(fan_ins + N_DIGITS)  # the forward's dot products and the float32 loss sum over samples
    np.testing.assert_allclose(loss, _reference(model, vecs, x, y), rtol=tol, atol=0)
    assert len(set(np.round(loss, 6))) == 5  # the points really differ
    vm = Evaluator(model, (x, y), strategy="vmap", batch_size=128, progress=False)
    vloss, vacc = vm.evaluate_points(PointSet.explicit(vecs))
    np.testing.assert_allclose(loss, vloss, rtol=tol, atol=0)
    np.testing.assert_array_equal(acc, vacc)
    monkeypatch.setattr(strategies_module, "CONCAT_OUTPUT_BYTES", 0)  # score batch by batch
    per_batch = Evaluator(model, (x, y), strategy="loop", batch_size=128, progress=False)
    assert ev.concatenates_outputs and not per_batch.concatenates_outputs
    bloss, bacc = per_batch.evaluate_points(PointSet.explicit(vecs))
    # the same forward passes; float32 loss sums over the batches instead of over all samples at once
    np.testing.assert_allclose(bloss, loss, rtol=float32_tolerance(N_DIGITS), atol=0)
    np.testing.assert_array_equal(bacc, acc)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the user's module is untouched


def test_tied_weight_stays_tied_in_the_flat_module(digits):
    x, y = digits
    model = seeded_init_(Tied(), 1)
    ev = Evaluator(model, (x, y), strategy="loop", progress=False)
    flat_module = ev.loop.module
    assert flat_module.head.weight is flat_module.tied.weight
    assert flat_module.head.weight.data_ptr() != model.head.weight.data_ptr()


def test_out_of_memory_is_retried_with_smaller_chunks(digits, monkeypatch):
    x, y = digits
    model = make_mlp(2)
    vecs = _points(model, 11, seed=3)
    plain = Evaluator(model, (x, y), strategy="loop", chunk_size=11, progress=False)
    expected = plain.evaluate_points(PointSet.explicit(vecs))
    ev = Evaluator(model, (x, y), strategy="loop", chunk_size=8, progress=False)
    original = ev.loop.sums
    sizes = []

    def fragile(chunk, coeffs, index=None):
        sizes.append(len(chunk))
        if len(chunk) > 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return original(chunk, coeffs, index)

    monkeypatch.setattr(ev.loop, "sums", fragile)
    loss, acc = ev.evaluate_points(PointSet.explicit(vecs))
    np.testing.assert_array_equal(loss, expected[0])
    np.testing.assert_array_equal(acc, expected[1])
    assert sizes[:3] == [8, 4, 2] and max(sizes[3:]) <= 2 and ev.chunk_size == 2
    assert ev.points_evaluated == 11

    def hopeless(chunk, coeffs, index=None):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")

    monkeypatch.setattr(ev.loop, "sums", hopeless)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        ev.evaluate_points(PointSet.explicit(vecs[:2]))


def test_bf16_autocast_close_to_fp32_and_keyed_apart(digits):
    x, y = digits
    model = make_mlp(4)
    vecs = _points(model, 3, seed=5)
    fp32 = Evaluator(model, (x, y), strategy="loop", progress=False)
    bf16 = Evaluator(model, (x, y), strategy="loop", autocast=torch.bfloat16, progress=False)
    a = fp32.evaluate_points(PointSet.explicit(vecs))[0]
    b = bf16.evaluate_points(PointSet.explicit(vecs))[0]
    # far looser than float32 rounding: bf16 keeps 8 significant bits (u = 2**-8) and rounds both operands and the
    # output of each of the MLP's 2 matmuls, 2 x 3 x 2**-8 = 2.3e-2 relative to |W||x|
    np.testing.assert_allclose(b, a, rtol=3e-2)
    assert not np.array_equal(a, b)  # bf16 matmuls really ran
    assert fp32.fingerprint() != bf16.fingerprint()
    assert "autocast" not in fp32.fingerprint()  # default keys stay as before (existing caches)
    vm = Evaluator(model, (x, y), strategy="vmap", autocast=torch.bfloat16, progress=False)
    # the same bf16 operands; a float32 accumulation rounded otherwise can move each of the 2 matmuls' bf16 outputs
    # by one bf16 ulp (2**-7 relative)
    np.testing.assert_allclose(vm.evaluate_points(PointSet.explicit(vecs))[0], b, rtol=2 * 2.0 ** -7)


@pytest.mark.parametrize("strategy", ["loop", "vmap"])
def test_compiled_evaluation_equals_eager(digits, strategy):
    x, y = digits
    model = make_mlp(6)
    vecs = _points(model, 4, seed=7)
    eager = Evaluator(model, (x, y), strategy=strategy, progress=False)
    compiled = Evaluator(model, (x, y), strategy=strategy, compile="aot_eager", progress=False)
    a = eager.evaluate_points(PointSet.explicit(vecs))
    b = compiled.evaluate_points(PointSet.explicit(vecs))
    # the traced graph may run decomposed ops (addmm, log_softmax + nll): the MLP's dot products and the loss sum
    np.testing.assert_allclose(b[0], a[0], rtol=float32_tolerance(MLP_FAN_INS + N_DIGITS), atol=0)
    np.testing.assert_array_equal(b[1], a[1])
    assert len(set(np.round(b[0], 6))) == 4  # in-place parameter updates seen by the compiled code


def test_strategy_measurement_respects_vmap_memory_and_matches_loop(digits):
    x, y = digits
    model = make_mlp(8)
    vecs = _points(model, 7, seed=9).float()
    plain = Evaluator(model, (x, y), strategy="loop", progress=False)
    expected = plain.evaluate_points(PointSet.explicit(vecs.double()))
    # a budget that fits the flat vectors of all points but the activations of only a few
    ev = Evaluator(model, (x, y), progress=False)
    ev.memory_budget = 3 * ev.activation_bytes()
    n = ev.chunk_limit("vmap")
    assert 1 <= n < len(vecs) <= ev.chunk_limit("loop")
    loss, acc = ev.measure_strategies(vecs, [[0.0]] * len(vecs))  # no input-layer shortcut here
    assert ev.strategy in ("loop", "vmap") and f"measured on {n} points" in ev.strategy_reason
    # the measured strategy may be vmap (batched matmuls): the MLP's dot products and the float32 loss sum
    np.testing.assert_allclose(loss, expected[0], rtol=float32_tolerance(MLP_FAN_INS + N_DIGITS), atol=0)
    np.testing.assert_array_equal(acc, expected[1])
