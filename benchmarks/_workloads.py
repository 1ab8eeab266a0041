"""Workloads shared by the benchmarks: the digits images and a small seeded CNN."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn


def small_cnn(seed: int) -> nn.Module:
    """Two 3x3 convolutions (16, 32 channels) and a linear classifier for 1x8x8 digits (9,930 weights)."""
    gen = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.Conv2d(16, 32, 3), nn.ReLU(),
                          nn.Flatten(), nn.Linear(32 * 4 * 4, 10))
    with torch.no_grad():
        for p in model.parameters():
            fan_in = p[0].numel() if p.ndim > 1 else p.numel()
            p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
    return model


def digits(samples: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's digits as (N, 1, 8, 8) float images in [0, 1] and int64 labels."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.from_numpy((data.data[:samples] / 16.0).astype(np.float32)).reshape(-1, 1, 8, 8)
    return x, torch.from_numpy(data.target[:samples].astype(np.int64))
