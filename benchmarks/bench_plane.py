r"""Plane evaluation speed.

Our Evaluator against the per-point state_dict loop, the loss-landscapes package
(``planar_interpolation``) and the forward-pass floor.

For each model, three seeded models span a ``resolution`` x ``resolution`` plane; every
contender evaluates that many points on the same data, side by side in one run
(interleaved repeats, medians; see ``_timing.py``):

* ``ours``: ``landscape.plane`` with a fresh ``Evaluator`` per call, its set-up included
  (data moved once, strategy chosen by the evaluator); extra rows with ``--bf16`` autocast
  and ``--compile`` (one Evaluator compiled in the warm-up call, then reused);
* ``state_dict loop``: the usual hand-written loop: per point build a state_dict, call
  ``load_state_dict`` and sum the batch losses with ``.item()`` (same points as ours);
* ``loss-landscapes``: ``loss_landscapes.planar_interpolation`` with its ``Loss`` metric on
  the whole data as one batch, as documented (loss only; CPU only, skipped on GPU), and
  ``loss-landscapes +acc`` with a metric of the same form that also computes the accuracy,
  which ours always does;
* ``forward floor``: the same number of plain forward passes over the same batches at fixed
  parameters (no loss, no parameter change): a lower bound for any evaluator.

Columns: seconds (median), ms per point, ratio to the floor, speed-up over the state_dict
loop, achieved GFLOP/s (matmul and convolution FLOPs of the forward passes) and its share
of the device's dense peak where known, and the largest relative loss difference from the
loop (for bf16 and compile: from fp32 eager ``ours``, with the accuracy change). Contenders marked ``*`` were timed on
``--max-points`` points and scaled to the full plane.

    .venv/bin/python benchmarks/bench_plane.py                        # CPU: MLP and CNN, 21x21
    .venv/bin/python benchmarks/bench_plane.py --models resnet20 --resolution 51 \
        --samples 10000 --device cuda --bf16 --compile --max-points 200  # GPU target
"""
from __future__ import annotations

import argparse
import copy
import math
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fl.models import build_model  # noqa: E402
from landscape import Evaluator, plane  # noqa: E402
from landscape.infra.devices import resolve_device  # noqa: E402

from _timing import device_name, format_table, forward_flops, machine_load, peak_flops, side_by_side  # noqa: E402
from bench_distributed import digits, small_cnn  # noqa: E402


def cifar_like(samples: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``samples`` CIFAR-sized inputs (3x32x32, N(0, 1)) with uniform labels over 10 classes."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(samples, 3, 32, 32, generator=gen), torch.randint(0, 10, (samples,), generator=gen)


def case(name: str, samples: int) -> tuple[list[nn.Module], tuple[torch.Tensor, torch.Tensor]]:
    """Three seeded models and the data of one benchmark case."""
    if name == "mlp":
        return [build_model("mlp", num_classes=10, input_shape=(1, 8, 8), seed=s) for s in range(3)], digits()
    if name == "cnn":
        return [small_cnn(s) for s in range(3)], digits()
    if name == "resnet20":
        return ([build_model("resnet20_bn", num_classes=10, input_shape=(3, 32, 32), seed=s) for s in range(3)],
                cifar_like(samples))
    raise SystemExit(f"unknown model {name!r}: choose mlp, cnn, resnet20")


def state_dict_loop(template: nn.Module, result: Any, batches: list, limit: int,
                    device: torch.device) -> np.ndarray:
    """The hand-written per-point loop on the first ``limit`` grid points of ``result``."""
    from landscape.space.params import ParameterSpace

    space = ParameterSpace(template)
    model = copy.deepcopy(template).to(device).eval()
    origin, u, v = (torch.from_numpy(t) for t in (result.origin, result.u, result.v))
    gx, gy = np.meshgrid(result.x, result.y)
    losses = []
    total = sum(len(y) for _, y in batches)
    for x_coord, y_coord in list(zip(gx.ravel(), gy.ravel()))[:limit]:
        model.load_state_dict(space.state_dict((origin + x_coord * u + y_coord * v).float()))
        loss = 0.0
        with torch.no_grad():
            for xb, yb in batches:
                loss += F.cross_entropy(model(xb), yb, reduction="sum").item()
        losses.append(loss / total)
    return np.array(losses)


def forward_floor(model: nn.Module, batches: list, points: int) -> None:
    """Forward passes of ``model`` over ``batches``, ``points`` times: the floor any contender pays."""
    with torch.no_grad():
        for _ in range(points):
            for xb, _ in batches:
                model(xb)


def loss_landscapes_plane(models: list[nn.Module], data: tuple[torch.Tensor, torch.Tensor], steps: int,
                          accuracy: bool = False) -> np.ndarray:
    """The plane by loss-landscapes' ``planar_interpolation``.

    With its ``Loss`` metric, or (``accuracy``) with a metric of the same form that also
    counts correct predictions, as ours does.
    """
    import loss_landscapes
    import loss_landscapes.metrics

    metric = loss_landscapes.metrics.Loss(F.cross_entropy, *data)
    if accuracy:
        class LossAndAccuracy(loss_landscapes.metrics.Metric):
            def __call__(self, model_wrapper) -> tuple[float, float]:
                logits = model_wrapper.forward(data[0])
                return (F.cross_entropy(logits, data[1]).item(),
                        (logits.argmax(-1) == data[1]).float().mean().item())

        metric = LossAndAccuracy()
    return loss_landscapes.planar_interpolation(*[m.eval() for m in models], metric, steps=steps,
                                                deepcopy_model=True)


def relative_difference(a: np.ndarray, b: np.ndarray) -> float:
    """Largest ``|a - b| / |b|`` (losses of the same points by two contenders)."""
    return float((np.abs(a - b) / np.maximum(np.abs(b), 1e-12)).max())


def run_case(name: str, args: argparse.Namespace, device: torch.device) -> str:
    """Table of every contender on one model case."""
    models, data = case(name, args.samples)
    points = args.resolution ** 2
    limit = min(points, args.max_points or points)
    x, y = data
    batches = [(x[i:i + args.batch_size].to(device), y[i:i + args.batch_size].to(device))
               for i in range(0, len(y), args.batch_size)]
    floor_model = copy.deepcopy(models[0]).to(device).eval()

    def ours(reuse: bool = False, **options: Any) -> Callable[[], Any]:
        """A plane with a fresh Evaluator per call, or with one Evaluator reused.

        A fresh Evaluator has its set-up timed too; a reused one is built on the first call
        (compile: compiled once, in the warm-up).
        """
        made: list[Evaluator] = []

        def call():
            if not (reuse and made):
                made[:] = [Evaluator(models[0], data, device=device, progress=False,
                                     batch_size=args.batch_size, **options)]
            ev = made[0]
            result = plane(*models, ev, resolution=args.resolution)
            call.strategy = f"{ev.strategy} ({ev.strategy_reason}; input layers expanded: " \
                            f"{', '.join(ev.shortcut_layers) or 'none'})"
            return result
        return call

    variants = {"ours": ours(), "ours, no input shortcut": ours(input_shortcut=False)}
    if args.bf16:
        variants["ours bf16"] = ours(autocast=torch.bfloat16)
    if args.compile:
        variants["ours compile"] = ours(reuse=True, compile=True)
    reference = variants["ours"]()  # grid of the plane for the loop; also a warm-up
    contenders: dict[str, Callable[[], Any]] = dict(variants)
    contenders["state_dict loop"] = lambda: state_dict_loop(models[0], reference, batches, limit, device)
    use_ll = device.type == "cpu" and "loss-landscapes" not in args.skip
    if use_ll:
        steps = args.resolution if limit == points else max(2, math.isqrt(limit))
        contenders["loss-landscapes"] = lambda: loss_landscapes_plane(models, data, steps)
        contenders["loss-landscapes +acc"] = lambda: loss_landscapes_plane(models, data, steps, accuracy=True)
    contenders["forward floor"] = lambda: forward_floor(floor_model, batches, limit)
    timings = side_by_side(contenders, repeats=args.repeats, warmup=args.warmup, device=device)

    flops_per_point = sum(forward_flops(floor_model, xb) for xb, _ in batches)
    ll_points = steps ** 2 if use_ll else points
    sizes = {n: (points if n in variants else ll_points if n.startswith("loss-landscapes") else limit)
             for n in timings}
    per_point = {n: t.median / sizes[n] for n, t in timings.items()}
    fp32 = timings["ours"].result
    loop_losses = timings["state_dict loop"].result
    rows = []
    for n, t in timings.items():
        total = per_point[n] * points
        tf32 = device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
        dtype = "bfloat16" if "bf16" in n else ("tf32" if tf32 else "float32")
        peak = peak_flops(device, dtype)
        achieved = flops_per_point / per_point[n]
        if n in variants:
            res = t.result
            if n == "ours":
                diff = relative_difference(res.loss.ravel()[:limit], loop_losses)
                note = ""
            else:
                diff = relative_difference(res.loss, fp32.loss)
                note = f"acc change {float(np.abs(res.accuracy - fp32.accuracy).max()):.2g}"
        else:
            diff, note = float("nan"), ""
        marked = n + ("*" if sizes[n] < points else "")
        rows.append([marked, total, per_point[n] * 1e3, per_point[n] / per_point["forward floor"],
                     per_point["state_dict loop"] / per_point[n], achieved / 1e9,
                     f"{100 * achieved / peak:.1f}%" if peak else "n/a", diff, note])
    strategy = getattr(variants["ours"], "strategy", "")
    title = (f"{name}: {args.resolution}x{args.resolution} plane, {len(y)} samples in batches of "
             f"{args.batch_size}, device {device} ({device_name(device)}), median of {args.repeats}; "
             f"ours used {strategy}")
    return title + "\n" + format_table(
        ["contender", "seconds", "ms/point", "x floor", "vs loop", "GFLOP/s", "of peak", "max rel dloss", "note"],
        rows)


def main() -> None:
    """Run the benchmark and print its tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn", help="comma-separated: mlp, cnn, resnet20")
    parser.add_argument("--resolution", type=int, default=21)
    parser.add_argument("--samples", type=int, default=10000, help="CIFAR-sized inputs for resnet20")
    parser.add_argument("--batch-size", type=int, default=2048,
                        help="evaluation batch (2048: all 1,797 digits in one batch, as loss-landscapes)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--max-points", type=int, default=None,
                        help="time the loop, the floor and loss-landscapes on this many points and scale")
    parser.add_argument("--bf16", action="store_true", help="also time ours with bf16 autocast")
    parser.add_argument("--compile", action="store_true", help="also time ours with torch.compile")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--skip", default="", help="contenders to leave out (loss-landscapes)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    print(machine_load())
    for name in args.models.split(","):
        print(run_case(name.strip(), args, device))
        print()


if __name__ == "__main__":
    main()
