"""Shared fixtures of the analysis-core tests: digits as tensors and tiny seeded models.

Every random choice uses its own ``torch.Generator``; the global RNG is never touched.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

# Tiny models gain nothing from intra-op threads, and on a shared 2-core machine the thread
# pool's spinning makes them several times slower.
torch.set_num_threads(1)

N_DIGITS = 300  # samples used by the tests (of 1797): enough for meaningful accuracies, fast

#: Unit roundoff u of float32 and float64 (round to nearest): each operation is exact to a factor 1 + d, |d| <= u.
FLOAT32_UNIT_ROUNDOFF = 2.0 ** -24
FLOAT64_UNIT_ROUNDOFF = 2.0 ** -53


def float32_tolerance(terms: int, *, sides: int = 2, unit: float = FLOAT32_UNIT_ROUNDOFF,
                      probabilistic: bool = False) -> float:
    """Relative bound on how far float32 results of one quantity may differ only through rounding.

    A float32 sum of ``n`` terms, in any order and with any blocking (vector width, BLAS or
    oneDNN kernel, batch split), has an error of at most ``gamma_n * sum(|terms|)`` with
    ``gamma_n = n u / (1 - n u)`` and ``u = 2**-24`` (Higham, *Accuracy and Stability of
    Numerical Algorithms*, 2nd ed., Sec. 3.1 and 4.2); a dot product of length ``n`` likewise.
    For a chain of such sums (a forward pass layer after layer, then a loss summed over the
    samples) the relative errors add to first order, so ``terms`` is the total length of the
    chain: the fan-ins of the layers plus the number of samples summed in float32. Two float32
    computations that round differently (``sides=2``) differ by at most twice the bound; a float32
    result against a float64 reference (``sides=1``) by the bound itself (float64's own error,
    ``n * 2**-53``, is negligible). The bound is relative to the sum of absolute values; for the
    quantities compared with it (sums of non-negative per-sample losses of O(1) logits, norms,
    weighted means) that is the size of the result, and a difference of such quantities (a
    barrier) takes it times the size of the larger one as an absolute tolerance.

    It is the worst case over every summation order, so a comparison using it holds on every CPU;
    the typical error grows like ``sqrt(n) u``, far below it. For a computation done wholly in
    float64 pass ``unit=FLOAT64_UNIT_ROUNDOFF``.

    For a deep network, whose worst-case chain runs to 1e5 terms and more (GroupNorm statistics
    over feature maps), ``probabilistic=True`` gives Higham and Mary's probabilistic bound
    (SIAM J. Sci. Comput. 41(5), 2019, Thm. 2.4) ``lambda sqrt(n) u`` with ``lambda = 7``: with
    rounding errors that are mean-independent and zero-mean it holds with probability at least
    ``1 - 2 n exp(-lambda**2 / 2)``, above 0.999 for ``n`` up to 1e7.

    Parameters
    ----------
    terms
        Number of float32 terms summed along the computation (at least 1).
    sides
        How many of the two compared values were rounded in float32 (1 or 2).
    unit
        Unit roundoff of the arithmetic (float32's by default).
    probabilistic
        Give the probabilistic bound ``7 sqrt(terms) u`` instead of the worst case ``gamma_terms``.

    Returns
    -------
    float
        The relative tolerance ``sides * gamma_terms`` (or ``sides * 7 sqrt(terms) u``).
    """
    nu = terms * unit
    assert terms >= 1 and sides in (1, 2) and (probabilistic or nu < 0.5), (terms, sides)
    return sides * (7.0 * math.sqrt(terms) * unit if probabilistic else nu / (1 - nu))


def forward_terms(model: nn.Module, spatial: int = 1) -> int:
    """Length of the chain of float32 sums in a forward pass of ``model``, for :func:`float32_tolerance`.

    The sum of the fan-ins of its weight matrices and kernels (every parameter with two or more
    dimensions, ``weight[0].numel()``), plus the size of each normalisation statistic: the
    normalised size of a ``LayerNorm``, and ``channels / groups * spatial`` for a ``GroupNorm``.
    BatchNorm in eval mode uses stored statistics and sums nothing.

    Parameters
    ----------
    model
        The module.
    spatial
        Largest number of spatial positions of a feature map (``H * W`` of the input for a
        CNN; 1 for flat features).

    Returns
    -------
    int
        The number of terms (at least 1).
    """
    terms = sum(p[0].numel() for p in model.parameters() if p.ndim >= 2)
    for m in model.modules():
        if isinstance(m, nn.LayerNorm):
            terms += math.prod(m.normalized_shape)
        elif isinstance(m, nn.GroupNorm):
            terms += m.num_channels // m.num_groups * spatial
    return max(terms, 1)


def seeded_init_(module: nn.Module, seed: int, scale: float = 1.0) -> nn.Module:
    """Re-initialise every float parameter and BN buffer of ``module`` from ``seed``.

    Weights get N(0, scale^2 / fan_in); BN running means N(0, 0.1^2) and variances
    U(0.5, 1.5), so that the BatchNorm modes give visibly different results.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            fan_in = p[0].numel() if p.ndim > 1 else p.numel()
            p.copy_(torch.randn(p.shape, generator=gen) * scale / fan_in ** 0.5)
        for name, b in module.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))
    return module


#: Terms of the float32 dot products along a forward pass of ``make_mlp()`` (fan-ins 64 and 16) and
#: of ``make_bn_cnn()`` (fan-ins 1*3*3, 27 and 8), for :func:`float32_tolerance`.
MLP_FAN_INS = 64 + 16
BN_CNN_FAN_INS = 9 + 27 + 8
#: Values summed by one BatchNorm2d statistic of ``make_bn_cnn()`` per sample (a 6x6 feature map).
BN_CNN_MAP = 36


def make_mlp(seed: int = 0, hidden: int = 16, in_features: int = 64, classes: int = 10) -> nn.Module:
    """64-hidden-10 ReLU MLP on flat inputs."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, classes))
    return seeded_init_(model, seed)


def make_bn_cnn(seed: int = 0) -> nn.Module:
    """Tiny CNN with BatchNorm2d and BatchNorm1d for 1x8x8 inputs."""
    model = nn.Sequential(
        nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.AvgPool2d(2),  # 3x3x3
        nn.Flatten(), nn.Linear(27, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 10))
    return seeded_init_(model, seed)


def make_linear(seed: int = 0, in_features: int = 3, out_features: int = 2) -> nn.Module:
    """A single linear layer (for analytic MSE cases)."""
    return seeded_init_(nn.Linear(in_features, out_features), seed)


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = 40, lr: float = 0.05) -> nn.Module:
    """Full-batch Adam on cross-entropy (deterministic; no randomness involved)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model.eval()


def train_digits_mlp(data, seed: int, *, width: int, epochs: int = 20) -> nn.Module:
    """The zoo MLP (two hidden layers of ``width``) trained by seeded minibatch SGD on a digits bundle."""
    from fl.models import MLP

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = MLP((1, 8, 8), 10, hidden=(width, width))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(data.train_y), generator=gen).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(data.train_x[idx]), data.train_y[idx]).backward()
            opt.step()
    return model.eval()


@pytest.fixture(scope="session")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, labels)``: 300 digits, inputs float32 (N, 64) in [0, 1], labels int64."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.from_numpy((data.data[:N_DIGITS] / 16.0).astype(np.float32))
    y = torch.from_numpy(data.target[:N_DIGITS].astype(np.int64))
    return x, y


@pytest.fixture(scope="session")
def digits_images(digits) -> tuple[torch.Tensor, torch.Tensor]:
    """The same digits as (N, 1, 8, 8) images."""
    x, y = digits
    return x.reshape(-1, 1, 8, 8), y


@pytest.fixture(scope="session")
def trained_mlps(digits) -> list[nn.Module]:
    """Three MLPs trained from different seeds (accuracies well above chance)."""
    x, y = digits
    return [train(make_mlp(seed), x, y) for seed in (1, 2, 3)]


def pytest_terminal_summary(terminalreporter) -> None:
    """Print the fault-injection totals of every module that ran (see ``fault_counts``)."""
    from fault_counts import COUNTS, summary

    if any(COUNTS.values()):
        terminalreporter.write_line(summary())
