"""Shared timing helpers of the benchmark scripts.

Contenders are timed *side by side in one run*: after a warm-up call each, the repeats
are interleaved (contender order rotated every repeat) and the median is reported, so a
load change on a shared machine hits every contender alike and ratios stay meaningful.
CUDA work is synchronised before each clock read. Also: the machine load, FLOPs of one
forward pass (``torch.utils.flop_counter``) and the device's peak FLOP/s where known.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

#: Dense peak FLOP/s of known accelerators by (name fragment, dtype): vendor data sheets
#: (H100 SXM5: 67 TFLOP/s FP32, 989 TFLOP/s BF16/TF32x2 dense; H200 the same chip).
PEAK_FLOPS: dict[tuple[str, str], float] = {
    ("H100", "float32"): 67e12, ("H100", "tf32"): 494.5e12, ("H100", "bfloat16"): 989e12,
    ("H200", "float32"): 67e12, ("H200", "tf32"): 494.5e12, ("H200", "bfloat16"): 989e12,
    ("A100", "float32"): 19.5e12, ("A100", "tf32"): 156e12, ("A100", "bfloat16"): 312e12,
}


@dataclass
class Timing:
    """Wall-clock seconds of each repeat of one contender."""

    name: str
    seconds: list[float] = field(default_factory=list)
    result: Any = None

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def best(self) -> float:
        return min(self.seconds)


def synchronize(device: torch.device | str | None) -> None:
    """Wait for queued CUDA work on ``device`` (no-op on CPU)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def side_by_side(contenders: Mapping[str, Callable[[], Any]], *, repeats: int = 3, warmup: int = 1,
                 device: torch.device | str | None = None) -> dict[str, Timing]:
    """Time every contender ``repeats`` times, interleaved, after ``warmup`` calls each.

    The order of the contenders is rotated each repeat. ``Timing.result`` keeps the value
    returned by the last call (to compare the contenders' outputs).
    """
    names = list(contenders)
    out = {n: Timing(n) for n in names}
    for name in names:
        for _ in range(warmup):
            out[name].result = contenders[name]()
        synchronize(device)
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            synchronize(device)
            start = time.perf_counter()
            out[name].result = contenders[name]()
            synchronize(device)
            out[name].seconds.append(time.perf_counter() - start)
    return out


def machine_load() -> str:
    """One line: CPU count, 1-minute load average, Python/torch versions, threads."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"cpus={os.cpu_count()} load1={load:.1f} torch={torch.__version__} "
            f"threads={torch.get_num_threads()} python={platform.python_version()}")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def peak_flops(device: torch.device, dtype: str) -> float | None:
    """Dense peak FLOP/s of ``device`` for ``dtype`` ("float32", "tf32", "bfloat16"), or None.

    None when unknown (every CPU: its peak depends on clocks and SIMD units we cannot read).
    """
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for (fragment, kind), value in PEAK_FLOPS.items():
        if fragment in name and kind == dtype:
            return value
    return None


def forward_flops(module: nn.Module, x: torch.Tensor) -> int:
    """FLOPs (2 per multiply-add) of one forward pass of ``module`` on ``x``.

    Counted by ``torch.utils.flop_counter.FlopCounterMode`` (matmuls and convolutions
    only).
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        module(x)
    return int(counter.get_total_flops())


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table with right-aligned columns (floats with 3 significant digits)."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.3e}"
        return str(v)

    text = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in text)) if text else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in text]
    return "\n".join(lines)
