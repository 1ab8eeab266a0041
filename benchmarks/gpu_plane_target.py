"""The GPU plane target at its full size: a 51x51 ResNet-20 plane on 10,000 CIFAR-sized inputs.

``bench_plane.py`` compares contenders side by side on a smaller plane; this script times
the full target once per evaluator setting, with ``torch.compile`` (the fastest setting
there), in float32 and under bfloat16 autocast. Each Evaluator compiles in a 3x3 warm-up
plane (timed apart), then evaluates the 51x51 plane; CUDA work is synchronised before each
clock read.

    python benchmarks/gpu_plane_target.py --device cuda
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from landscape import Evaluator, plane  # noqa: E402
from landscape.infra.devices import resolve_device  # noqa: E402

from bench_plane import case  # noqa: E402


def timed(call, device: torch.device) -> tuple[float, object]:
    """Seconds of ``call()`` (device synchronised before each clock read) and its result."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, result


def main() -> None:
    """Time the full-size plane for each setting and print one line per setting."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--resolution", type=int, default=51)
    parser.add_argument("--samples", type=int, default=10000)
    args = parser.parse_args()
    device = resolve_device(args.device)
    models, data = case("resnet20", args.samples)
    settings = {"float32, compile": {"compile": True},
                "bfloat16 autocast, compile": {"compile": True, "autocast": torch.bfloat16}}
    for name, options in settings.items():
        ev = Evaluator(models[0], data, device=device, progress=False, batch_size=args.samples, **options)
        warm, _ = timed(lambda: plane(*models, ev, resolution=3), device)
        full, res = timed(lambda: plane(*models, ev, resolution=args.resolution), device)
        points = args.resolution ** 2
        print(f"{name}: {args.resolution}x{args.resolution} plane on {args.samples} inputs in {full:.1f} s "
              f"({1e3 * full / points:.1f} ms/point; compile warm-up {warm:.1f} s); "
              f"loss {res.loss.min():.3f}..{res.loss.max():.3f}", flush=True)


if __name__ == "__main__":
    main()
