"""The CUDA paths against the CPU: evaluation, curvature and FL training on a GPU.

Skipped where no CUDA device is present (the CI machine); run on a GPU machine with
``pytest tests/test_cuda.py``. Each GPU result is compared with an independent CPU
computation, in float64 where the float32 rounding bound applies (``conftest.float32_tolerance``).
PyTorch's defaults stay as they are: float32 matrix products in full float32 (TF32 off), so
the MLP comparisons use float32's bound; the convolutional model runs through cuDNN, whose
convolutions may use TF32 (10-bit mantissa, unit roundoff 2**-11), and is compared with
that unit's probabilistic bound.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fl
from landscape import Evaluator, hessian_eigenvalues, interpolate, plane

from conftest import float32_tolerance, forward_terms, make_bn_cnn, make_mlp

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

#: Unit roundoff of TF32 (10 explicit mantissa bits) and of bfloat16 (7).
TF32_UNIT_ROUNDOFF = 2.0 ** -11
BF16_UNIT_ROUNDOFF = 2.0 ** -8


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


def _mlp_plane(digits, resolution: int, **options) -> tuple[object, int]:
    """A plane through three seeded MLPs on the digits, and the float32 chain length of one loss."""
    x, y = digits
    models = [make_mlp(s, hidden=32) for s in (1, 2, 3)]
    result = plane(*models, Evaluator(models[0], (x, y), progress=False, **options), resolution=resolution)
    # the forward chain plus the sum over the samples
    return result, forward_terms(models[0]) + len(y)


def test_mlp_plane_on_cuda_matches_float64_cpu(digits):
    gpu, terms = _mlp_plane(digits, 7, device="cuda")
    ref, _ = _mlp_plane(digits, 7, device="cpu", dtype=torch.float64)
    assert _relative(gpu.loss, ref.loss) <= float32_tolerance(terms, sides=1)  # one float32 side
    np.testing.assert_array_equal(gpu.x, ref.x)
    # accuracies can only move where a logit margin is below the rounding: allow one sample per point
    assert np.abs(gpu.accuracy - ref.accuracy).max() <= 1.0 / len(digits[1]) + 1e-12


def test_bn_cnn_path_on_cuda_matches_float64_cpu_within_tf32(digits_images):
    x, y = digits_images
    a, b = make_bn_cnn(1), make_bn_cnn(2)
    gpu = interpolate(a, b, Evaluator(a, (x, y), device="cuda", progress=False), alphas=11)
    ref = interpolate(a, b, Evaluator(a, (x, y), device="cpu", dtype=torch.float64, progress=False), alphas=11)
    tol = float32_tolerance(forward_terms(a, spatial=64) + len(y), sides=1, unit=TF32_UNIT_ROUNDOFF,
                            probabilistic=True)
    assert _relative(gpu.loss, ref.loss) <= tol


def test_bf16_autocast_plane_stays_within_the_bf16_bound(digits):
    fp32, terms = _mlp_plane(digits, 5, device="cuda")
    bf16, _ = _mlp_plane(digits, 5, device="cuda", autocast=torch.bfloat16)
    tol = float32_tolerance(terms, sides=1, unit=BF16_UNIT_ROUNDOFF, probabilistic=True)
    assert 0 < _relative(bf16.loss, fp32.loss) <= tol  # bf16 really ran, and stayed within its bound


def test_hessian_top_eigenvalue_on_cuda_matches_float64_cpu(digits):
    x, y = digits
    model = make_mlp(4, hidden=16)
    gpu = hessian_eigenvalues(model, Evaluator(model, (x, y), device="cuda", progress=False), k=2, tol=1e-6,
                              max_iter=200)
    ref = hessian_eigenvalues(model, Evaluator(model, (x, y), device="cpu", dtype=torch.float64, progress=False),
                              k=2, tol=1e-6, max_iter=200)
    # float32 Hessian-vector products (two passes through the chain) against float64; Lanczos stopped at 1e-6
    tol = 2 * float32_tolerance(2 * forward_terms(model) + len(y), sides=1) + 1e-6
    np.testing.assert_allclose(np.asarray(gpu), np.asarray(ref), rtol=tol)


@pytest.mark.parametrize("backend", ["sequential", "vectorized"])
def test_fl_run_on_cuda_repeats_exactly_and_agrees_with_cpu(tmp_path, backend):
    opts = dict(dataset="digits", clients=4, rounds=2, batch_size=32, lr=0.1, momentum=0.5, partition="dirichlet",
                alpha=0.3, progress=False, save_clients="none", backend=backend)
    first = fl.run("fedavg", out=tmp_path / "a", device="cuda", **opts)
    again = fl.run("fedavg", out=tmp_path / "b", device="cuda", **opts)
    cpu = fl.run("fedavg", out=tmp_path / "c", device="cpu", **opts)
    for name, t in first.global_state(2).items():
        torch.testing.assert_close(again.global_state(2)[name], t, rtol=0, atol=0)  # the same seed, the same run
        torch.testing.assert_close(t, cpu.global_state(2)[name], rtol=1e-4, atol=1e-5)


def test_fedavg_cnn_on_cuda_repeats_exactly(tmp_path):
    opts = dict(recipe="fedgucci-mnist1d", rounds=2, progress=False, save_clients="none", device="cuda")
    first = fl.run("fedavg", out=tmp_path / "a", **opts)
    again = fl.run("fedavg", out=tmp_path / "b", **opts)
    for name, t in first.global_state(2).items():
        torch.testing.assert_close(again.global_state(2)[name], t, rtol=0, atol=0)
