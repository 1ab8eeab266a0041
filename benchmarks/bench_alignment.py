"""Mode-connectivity targets on MNIST-1D.

Barriers before/after permutation alignment and REPAIR, a BatchNorm CNN under each BatchNorm
handling, learned curves vs the line, alignment time of two ResNet-20s, and a cross-check of
weight matching against the ``rebasin`` package.

Run (one core, low priority; about 10 minutes):

    nice -n 10 .venv/bin/python benchmarks/bench_alignment.py > bench_alignment.md

``--quick`` trains fewer epochs and one seed pair (a smoke run). The ``rebasin`` cross-check
runs only when ``import rebasin`` works (it is never a dependency of this project: install it
into a separate folder, e.g. ``pip install --target /tmp/rbenv --no-deps rebasin torchview
graphviz``, and pass ``--rebasin-path /tmp/rbenv``). Prints Markdown tables.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch
from torch import nn

import landscape
from fl.datasets import load_dataset
from fl.models import build_model
from landscape.alignment.align import match
from landscape.connectivity.curves import curve
from landscape.connectivity.repair import repaired_interpolate


class BNConv1d(nn.Module):
    """MNIST-1D CNN with BatchNorm: three Conv1d-BN-ReLU layers (``width`` channels), linear head."""

    def __init__(self, width: int = 64, num_classes: int = 10):
        super().__init__()
        layers: list[nn.Module] = []
        c = 1
        for k in (5, 3, 3):
            layers += [nn.Conv1d(c, width, k, stride=2, padding=1, bias=False), nn.BatchNorm1d(width), nn.ReLU()]
            c = width
        self.features = nn.Sequential(*layers, nn.Flatten())
        self.classifier = nn.Linear(5 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch ``x``."""
        return self.classifier(self.features(x))


def train(model: nn.Module, data, *, seed: int, epochs: int, lr: float = 0.05) -> nn.Module:
    """SGD (momentum 0.9, batch 128, cosine learning rate) from the model's own initialisation."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    steps = epochs * ((len(data.train_y) + 127) // 128)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(data.train_y), generator=gen).split(128):
            opt.zero_grad()
            nn.functional.cross_entropy(model(data.train_x[idx]), data.train_y[idx]).backward()
            opt.step()
            sched.step()
    return model.eval()


def fmt(values: list[float]) -> str:
    """Mean of ``values`` (with their spread when there are several) as text."""
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def mlp_table(data, widths, pairs, epochs) -> list[str]:
    """Markdown rows: barriers of MLP pairs of each width before and after alignment."""
    rows = ["| width | test acc. (A, B) | before | weight matching | WM + REPAIR | activation matching | WM time (s) |",
            "|---|---|---|---|---|---|---|"]
    train_xy = (data.train_x, data.train_y)
    for w in widths:
        cols: dict[str, list[float]] = {k: [] for k in ("acc", "before", "wm", "repair", "act", "time")}
        for sa, sb in pairs:
            a = train(build_model(f"mnist1d_mlp_w{w}", num_classes=10, input_shape=data.input_shape, seed=sa), data,
                      seed=sa, epochs=epochs)
            b = train(build_model(f"mnist1d_mlp_w{w}", num_classes=10, input_shape=data.input_shape, seed=sb), data,
                      seed=sb, epochs=epochs)
            ev = landscape.Evaluator(a, (data.test_x, data.test_y), device="cpu")
            found = match(b, to=a)
            wm = found.apply(b)
            act = match(b, to=a, data=train_xy, method="activation").apply(b)
            ends = ev.evaluate([a, b])
            cols["acc"] += list(map(float, ends.accuracy))
            cols["before"].append(landscape.interpolate(a, b, ev, alphas=21).accuracy_barrier)
            cols["wm"].append(landscape.interpolate(a, wm, ev, alphas=21).accuracy_barrier)
            cols["repair"].append(repaired_interpolate(a, wm, ev, data=train_xy, alphas=21).accuracy_barrier)
            cols["act"].append(landscape.interpolate(a, act, ev, alphas=21).accuracy_barrier)
            cols["time"].append(found.seconds)
        rows.append(f"| {w} | {fmt(cols['acc'])} | {fmt(cols['before'])} | {fmt(cols['wm'])} | {fmt(cols['repair'])} "
                    f"| {fmt(cols['act'])} | {fmt(cols['time'])} |")
    return rows


def bn_table(data, pairs, epochs) -> list[str]:
    """Markdown rows: barriers of a BatchNorm CNN pair under each BatchNorm handling."""
    rows = ["| BatchNorm handling | before alignment | after weight matching |", "|---|---|---|"]
    train_xy = (data.train_x, data.train_y)
    res: dict[str, list[float]] = {}
    for sa, sb in pairs:
        models = []
        for s in (sa, sb):
            with torch.random.fork_rng():
                torch.manual_seed(s)
                models.append(train(BNConv1d(), data, seed=s, epochs=epochs))
        a, b = models
        wm = match(b, to=a, data=train_xy).apply(b)
        test = (data.test_x, data.test_y)
        for mode in ("interpolate", "recompute"):
            ev = landscape.Evaluator(a, test, device="cpu", bn=mode, bn_data=train_xy if mode == "recompute" else None)
            res.setdefault(f"{mode}:before", []).append(landscape.interpolate(a, b, ev, alphas=11).accuracy_barrier)
            res.setdefault(f"{mode}:after", []).append(landscape.interpolate(a, wm, ev, alphas=11).accuracy_barrier)
        ev = landscape.Evaluator(a, test, device="cpu")
        res.setdefault("repair:before", []).append(
            repaired_interpolate(a, b, ev, data=train_xy, alphas=11, method="reset").accuracy_barrier)
        res.setdefault("repair:after", []).append(
            repaired_interpolate(a, wm, ev, data=train_xy, alphas=11, method="reset").accuracy_barrier)
        res.setdefault("repair2:before", []).append(
            repaired_interpolate(a, b, ev, data=train_xy, alphas=11).accuracy_barrier)
        res.setdefault("repair2:after", []).append(
            repaired_interpolate(a, wm, ev, data=train_xy, alphas=11).accuracy_barrier)
    names = {"interpolate": "interpolate (running stats averaged)",
             "recompute": "recompute (Evaluator bn='recompute', train data)",
             "repair": "reset on 1024 train inputs (repaired_interpolate method='reset')",
             "repair2": "REPAIR + reset (method='repair')"}
    for key, label in names.items():
        rows.append(f"| {label} | {fmt(res[key + ':before'])} | {fmt(res[key + ':after'])} |")
    return rows


def curve_table(data, pairs, epochs, curve_epochs) -> list[str]:
    """Markdown rows: learned curves against the straight line."""
    rows = ["| model | curve | max loss, line | max loss, curve | acc. barrier, line | acc. barrier, curve | "
            "train time (s) |", "|---|---|---|---|---|---|---|"]
    for kind in ("bezier", "polychain"):
        stats: dict[str, list[float]] = {k: [] for k in ("line", "curve", "lb", "cb", "t")}
        for sa, sb in pairs:
            a = train(build_model("mnist1d_mlp_w128", num_classes=10, input_shape=data.input_shape, seed=sa), data,
                      seed=sa, epochs=epochs)
            b = train(build_model("mnist1d_mlp_w128", num_classes=10, input_shape=data.input_shape, seed=sb), data,
                      seed=sb, epochs=epochs)
            ev = landscape.Evaluator(a, (data.test_x, data.test_y), device="cpu")
            start = time.perf_counter()
            r = curve(a, b, ev, kind=kind, train_data=(data.train_x, data.train_y), epochs=curve_epochs, lr=0.02)
            stats["t"].append(time.perf_counter() - start)
            stats["line"].append(float(r.line_loss.max()))
            stats["curve"].append(float(r.loss.max()))
            stats["lb"].append(r.line_accuracy_barrier)
            stats["cb"].append(r.accuracy_barrier)
        rows.append(f"| mnist1d_mlp_w128 | {kind} | {fmt(stats['line'])} | {fmt(stats['curve'])} | {fmt(stats['lb'])} "
                    f"| {fmt(stats['cb'])} | {fmt(stats['t'])} |")
    return rows


def resnet_timing() -> list[str]:
    """Markdown rows: weight matching time of two ResNet-20s."""
    rows = ["| model | groups | units | weight matching (s), mean of 3 | sweeps |", "|---|---|---|---|---|"]
    a = build_model("resnet20_bn", num_classes=10, input_shape=(3, 32, 32), seed=0)
    b = build_model("resnet20_bn", num_classes=10, input_shape=(3, 32, 32), seed=1)
    first = match(b, to=a)  # includes tracing the graph
    times, sweeps = [], []
    for seed in range(3):
        found = match(b, to=a, seed=seed)
        times.append(found.seconds)
        sweeps.append(found.info["sweeps"])
    rows.append(f"| resnet20_bn (random init, CPU, 1 thread) | {len(first.spec.groups)} | "
                f"{sum(g.size for g in first.spec.groups)} | {fmt(times)} (first call with tracing: "
                f"{first.seconds:.2f}) | {sweeps} |")
    return rows


def objective(a: nn.Module, b: nn.Module) -> float:
    """Weight matching's objective: sum over all parameters of <A, B>."""
    return sum(float((p.double() * dict(b.named_parameters())[n].double()).sum()) for n, p in a.named_parameters())


def rebasin_table(data, pairs, epochs, path: str | None) -> list[str]:
    """Markdown rows: weight matching against the ``rebasin`` package (skipped when it is missing)."""
    if path:
        sys.path.insert(0, path)
    try:
        from rebasin import PermutationCoordinateDescent
    except ImportError as exc:
        return [f"(rebasin not importable: {exc}; cross-check skipped)"]
    rows = ["| model | barrier before | barrier, ours | barrier, rebasin 0.0.47 | objective sum <A, P(B)>, ours | "
            "objective, rebasin | time (s), ours | time (s), rebasin |", "|---|---|---|---|---|---|---|---|"]
    stats: dict[str, list[float]] = {k: [] for k in ("before", "ours", "theirs", "o_ours", "o_theirs", "t_ours",
                                                     "t_theirs")}
    for sa, sb in pairs:
        a = train(build_model("mnist1d_mlp_w128", num_classes=10, input_shape=data.input_shape, seed=sa), data,
                  seed=sa, epochs=epochs)
        b = train(build_model("mnist1d_mlp_w128", num_classes=10, input_shape=data.input_shape, seed=sb), data,
                  seed=sb, epochs=epochs)
        ev = landscape.Evaluator(a, (data.test_x, data.test_y), device="cpu")
        found = match(b, to=a)
        theirs = copy.deepcopy(b)
        start = time.perf_counter()
        PermutationCoordinateDescent(copy.deepcopy(a), theirs, data.test_x[:2]).rebasin()
        stats["t_theirs"].append(time.perf_counter() - start)
        with torch.no_grad():
            same = torch.allclose(theirs(data.test_x), b(data.test_x), atol=1e-4)
        stats["before"].append(landscape.interpolate(a, b, ev, alphas=21).accuracy_barrier)
        stats["ours"].append(landscape.interpolate(a, found.apply(b), ev, alphas=21).accuracy_barrier)
        stats["theirs"].append(landscape.interpolate(a, theirs, ev, alphas=21).accuracy_barrier
                               if same else float("nan"))
        stats["t_ours"].append(found.seconds)
        stats["o_ours"].append(objective(a, found.apply(b)))
        stats["o_theirs"].append(objective(a, theirs))
    rows.append(f"| mnist1d_mlp_w128 | {fmt(stats['before'])} | {fmt(stats['ours'])} | {fmt(stats['theirs'])} | "
                f"{fmt(stats['o_ours'])} | {fmt(stats['o_theirs'])} | {fmt(stats['t_ours'])} | "
                f"{fmt(stats['t_theirs'])} |")
    return rows


SECTIONS = ("mlp", "bn", "curves", "timing", "rebasin")


def main() -> None:
    """Run the benchmark and print its tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed pair, few epochs (smoke run)")
    parser.add_argument("--rebasin-path", default=None, help="folder holding the rebasin package (not a dependency)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="sections to run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = load_dataset("mnist1d")
    pairs = [(0, 1)] if args.quick else [(0, 1), (2, 3), (4, 5)]
    epochs = 3 if args.quick else 40
    widths = (32, 128) if args.quick else (32, 128, 512)
    start = time.perf_counter()
    sections = {
        "mlp": ("MLP (mnist1d_mlp), accuracy barrier (Eq. 4) on the test set",
                lambda: mlp_table(data, widths, pairs, epochs)),
        "bn": ("BatchNorm CNN (3 x Conv1d-BN-ReLU, 64 channels), accuracy barrier",
               lambda: bn_table(data, pairs, epochs)),
        "curves": ("Learned curves between independently trained MLPs (test loss / accuracy barrier)",
                   lambda: curve_table(data, pairs, epochs, 3 if args.quick else 20)),
        "timing": ("Alignment time", resnet_timing),
        "rebasin": ("Cross-check against rebasin (accuracy barrier after alignment)",
                    lambda: rebasin_table(data, pairs, epochs, args.rebasin_path))}
    for name in args.only:
        title, table = sections[name]
        print(f"\n### {title}\n")
        print("\n".join(table()))
    print(f"\nseed pairs {pairs}, {epochs} training epochs; total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
