"""``landscape``: loss-landscape analysis from the command line.

Subcommands: ``train`` (an FL run, via ``fl.run``), ``path``, ``plane``, ``group``, ``hessian``,
``decompose``, ``check`` (a paper claim) and ``report`` (an HTML report of an FL run).

Models come from an FL run (``--run DIR --round R --models global client:3 ...``) or from
a module spec and checkpoint files (``--module mlp --checkpoints a.pt b.pt --data digits``).
Point metrics are cached in an HDF5 file (``--cache``, default ``<out>/landscape_cache.h5``),
so a rerun or an interrupted run only computes what is missing; result objects are stored
there too. Figures go to ``--out``; a table of numbers goes to stdout (``--json`` for JSON),
and the same numbers to ``<out>/<command>.json``. User errors print one line
``landscape: error: ...`` and exit with status 2; ``check`` exits 0 when the claim holds
and 1 when it does not.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from landscape.infra.errors import ConfigError, LandscapeError

EPILOG_INPUTS = ("models: --run DIR [--round R] [--models SEL ...] with SEL = global | client:K | clients "
                 "(optionally @ROUND), or --module SPEC --checkpoints FILE ... --data digits|NAME|FILE.pt|FILE.npz")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``landscape: error: ...`` and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"landscape: error: {message} (see '{self.prog} --help')", file=sys.stderr)
        raise SystemExit(2)


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except the uninformative None and False."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


# ------------------------------------------------------------------------------- parser
def _inputs_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("models and data")
    g.add_argument("--run", metavar="DIR", help="an FL run directory (written by 'landscape train' or fl.run)")
    g.add_argument("--round", type=int, default=-1, help="round of the run's checkpoints (default: the last)")
    g.add_argument("--models", nargs="+", metavar="SEL",
                   help="run models: global, client:K, clients, each optionally @ROUND")
    g.add_argument("--module", metavar="SPEC",
                   help="architecture: zoo name (mlp, ...), package.module:factory or file.py:factory")
    g.add_argument("--module-kwargs", default="{}", metavar="JSON", help="keyword arguments of the factory, as JSON")
    g.add_argument("--checkpoints", nargs="+", metavar="FILE",
                   help="checkpoint files (.pt/.pth weights only, .safetensors)")
    g.add_argument("--labels", nargs="+", metavar="NAME", help="names of the checkpoints (default: file stems)")
    g.add_argument("--data", metavar="DATA",
                   help="digits, another fl dataset name, or a .pt/.npz file of (inputs, targets)")
    g.add_argument("--split", default="test", help="test | train (| client:K for a run): the evaluation data")
    g.add_argument("--data-root", metavar="DIR", help="folder of torchvision datasets (never downloaded here)")
    g.add_argument("--num-classes", type=int, help="outputs of the model (default: largest label + 1)")
    e = p.add_argument_group("evaluation")
    e.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    e.add_argument("--bn", default="interpolate", choices=("interpolate", "keep", "recompute"), help="BatchNorm mode")
    e.add_argument("--batch-size", type=int, help="evaluation batch size")
    e.add_argument("--loss", default="cross_entropy", choices=("cross_entropy", "mse", "nll"))
    e.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    o = p.add_argument_group("output")
    o.add_argument("--out", default="landscape_out", metavar="DIR",
                   help="folder for figures and JSON")
    o.add_argument("--cache", metavar="FILE", help="HDF5 cache (default <out>/landscape_cache.h5)")
    o.add_argument("--no-cache", action="store_true", help="do not read or write a cache")
    o.add_argument("--json", action="store_true", help="print the numbers as JSON instead of a table")
    o.add_argument("--no-figures", action="store_true", help="skip the figures")
    o.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def _lanczos_parent() -> argparse.ArgumentParser:
    """Options of the Lanczos eigenvalue solver shared by `hessian` and `check flatter`."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--k", type=int, default=1, help="number of top eigenvalues")
    parent.add_argument("--tol", type=float, default=1e-3, help="Lanczos relative residual tolerance")
    parent.add_argument("--max-iter", type=int, default=100, help="Hessian-vector products at most per model")
    parent.add_argument("--seed", type=int, default=0, help="seed of the random start vectors")
    return parent


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="landscape", description=__doc__.split("\n\n")[0].split(": ", 1)[1],
                     epilog="Run 'landscape COMMAND --help' for the options of a command.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    common = [_inputs_parent()]
    fmt = _Formatter

    _train_parser(sub)

    p = sub.add_parser("path", parents=common, formatter_class=fmt, epilog=EPILOG_INPUTS,
                       help="loss/accuracy along the line between two models, barriers (FedGuCci Eq. 3/4)")
    p.add_argument("--alphas", type=int, default=21, help="number of alphas")
    p.add_argument("--alpha-range", nargs=2, type=float, default=(0.0, 1.0), metavar=("LO", "HI"),
                   help="alpha interval (0 and 1 are always added)")
    p.set_defaults(func=cmd_path, default_models=["clients"], keep_clients=2, nmodels=(2, 2))

    p = sub.add_parser("plane", parents=common, formatter_class=fmt, epilog=EPILOG_INPUTS,
                       help="a 2-D plane through three models (or random / PCA directions) and its basins")
    p.add_argument("--kind", default="through", choices=("through", "random", "pca"),
                   help="through the first three models (others placed in it); random around the first; "
                        "PCA of all models around the last")
    p.add_argument("--resolution", type=int, default=21, help="grid points per axis")
    p.add_argument("--margin", type=float, default=0.2, help="grid margin (through / pca)")
    p.add_argument("--span", type=float, default=1.0, help="grid half-width (random)")
    p.add_argument("--normalization", default="filter", choices=("filter", "layer", "none"), help="random")
    p.add_argument("--seed", type=int, default=0, help="random directions")
    p.add_argument("--level", type=float, help="sublevel of the basin analysis (default: highest loss at the models)")
    p.set_defaults(func=cmd_plane, default_models=["clients", "global"], keep_clients=3, nmodels=(1, None))

    p = sub.add_parser("group", parents=common, formatter_class=fmt, epilog=EPILOG_INPUTS,
                       help="group barrier of K models around their centroid (FedGuCci Def. 3.6)")
    p.add_argument("--weights", nargs="+", type=float, help="fusion weights (normalised); default uniform")
    p.add_argument("--by-size", action="store_true", help="also barriers of random subsets of every size K")
    p.add_argument("--draws", type=int, default=5, help="subsets per size")
    p.add_argument("--seed", type=int, default=0, help="seed of the random subsets")
    p.add_argument("--matrix", action="store_true", help="also the pairwise barrier matrix")
    p.add_argument("--alphas", type=int, default=11, help="alphas of the pairwise paths (--matrix)")
    p.set_defaults(func=cmd_group, default_models=["clients"], nmodels=(2, None))

    p = sub.add_parser("hessian", parents=[*common, _lanczos_parent()], formatter_class=fmt, epilog=EPILOG_INPUTS,
                       help="top Hessian eigenvalues (Lanczos), optional trace and spectral density")
    p.add_argument("--trace", action="store_true", help="also the trace (Hutchinson)")
    p.add_argument("--density", action="store_true", help="also the spectral density (SLQ)")
    p.add_argument("--iterations", type=int, default=100, help="Lanczos steps of the density")
    p.set_defaults(func=cmd_hessian, default_models=["global"], nmodels=(1, None))

    p = sub.add_parser("decompose", parents=common, formatter_class=fmt, epilog=EPILOG_INPUTS,
                       help="bias/variance/covariance decomposition of the averaged model's loss (IMA Thm. 1)")
    p.add_argument("--client-data", nargs="+", metavar="FILE",
                   help="one data file per checkpoint (with --module; a run knows its clients' data)")
    p.add_argument("--weights", nargs="+", type=float, help="client weights p_k (default |D_k|/|D|)")
    p.set_defaults(func=cmd_decompose, default_models=["clients"], nmodels=(2, None))

    _check_parser(sub, common, fmt)

    p = sub.add_parser("report", parents=common, formatter_class=fmt,
                       help="an HTML report (report/index.html) of an FL run: curves, paths, plane, basins, claims")
    p.add_argument("--resolution", type=int, default=15, help="plane resolution")
    p.add_argument("--alphas", type=int, default=11, help="alphas of the paths")
    p.set_defaults(func=cmd_report, default_models=None, nmodels=(0, None))
    return parser


def _train_parser(sub: Any) -> None:
    from fl.cli import build_parser as fl_parser

    sub.add_parser("train", parents=[fl_parser()], conflict_handler="resolve",
                   formatter_class=_Formatter,
                   help="train a federated run with the embedded FL engine (fl.run); rerun to resume",
                   description="Train (or resume) an FL run; every fl.run argument has a flag, algorithm and "
                               "engine options go through --option key=value.").set_defaults(func=cmd_train)


def _check_parser(sub: Any, common: list, fmt: Any) -> None:
    check = sub.add_parser("check", help="check a paper claim on your models (exit 0: holds, 1: does not)",
                           description="Check a claim; exit status 0 when it holds, 1 when it fails or is "
                                       "not applicable, 2 on errors.")
    claims = check.add_subparsers(dest="claim", metavar="CLAIM", required=True, parser_class=_Parser)
    p = claims.add_parser("transitivity", parents=common, formatter_class=fmt, epilog=EPILOG_INPUTS,
                          help="w1, w2 connected to an anchor => connected to each other (models: W1 W2 ANCHOR)")
    p.add_argument("--baseline", nargs=2, metavar=("V1", "V2"),
                   help="a baseline pair (checkpoints, or run selectors with --run) for the relative reduction")
    p.add_argument("--threshold", type=float, default=0.05,
                   help="largest barrier counted as connected (accuracy: relative drop, Eq. 4; loss: Eq. 3)")
    p.add_argument("--min-reduction", type=float, default=0.1,
                   help="with --baseline: smallest relative barrier reduction that supports the claim")
    p.add_argument("--metric", default="accuracy", choices=("accuracy", "loss"), help="barrier metric")
    p.add_argument("--alphas", type=int, default=21, help="alphas per path")
    p.set_defaults(func=cmd_check, default_models=None, nmodels=(3, 3))
    p = claims.add_parser("group", parents=common, formatter_class=fmt, epilog=EPILOG_INPUTS,
                          help="the group barrier of the models is small")
    p.add_argument("--threshold", type=float, default=0.05, help="largest group barrier counted as connected")
    p.add_argument("--metric", default="accuracy", choices=("accuracy", "loss"), help="barrier metric (Eq. 10 / 9)")
    p.add_argument("--by-size", action="store_true", help="also barriers of random subsets of every size K")
    p.add_argument("--draws", type=int, default=5, help="subsets per size")
    p.add_argument("--seed", type=int, default=0, help="seed of the subsets")
    p.set_defaults(func=cmd_check, default_models=["clients"], nmodels=(2, None))
    p = claims.add_parser("shared-basin", parents=common, formatter_class=fmt, epilog=EPILOG_INPUTS,
                          help="clients and the global model lie in one basin (models: clients; global "
                               "from the run or --global)")
    p.add_argument("--global", dest="global_model", metavar="FILE",
                   help="the global model's checkpoint (with --module)")
    p.add_argument("--plane-kind", default="clients", choices=("clients", "pca"),
                   help="plane through the first three clients, or the clients' top-2 PCA around the global")
    p.add_argument("--resolution", type=int, default=21, help="grid points per axis")
    p.add_argument("--margin", type=float, default=0.2, help="grid margin around the models")
    p.add_argument("--level", type=float, help="sublevel c of the basin (default: highest loss at the clients)")
    p.add_argument("--barrier-threshold", type=float, default=0.05,
                   help="largest client-global barrier consistent with one basin")
    p.add_argument("--metric", default="loss", choices=("accuracy", "loss"), help="barrier metric")
    p.add_argument("--alphas", type=int, default=11, help="alphas per client-global path")
    p.set_defaults(func=cmd_check, default_models=["clients", "global"], nmodels=(2, None))
    p = claims.add_parser("flatter", parents=[*common, _lanczos_parent()], formatter_class=fmt, epilog=EPILOG_INPUTS,
                          help="model A has a smaller top Hessian eigenvalue than model B (models: A B)")
    p.add_argument("--margin", type=float, default=0.0, help="A must be below (1 - margin) times B")
    p.set_defaults(func=cmd_check, default_models=None, nmodels=(2, 2))


# ------------------------------------------------------------------------------ inputs
class Context:
    """Resolved inputs of a command: module, labelled models, data, evaluator, output folder."""

    def __init__(self, args: argparse.Namespace):
        from landscape_cli import modelspec

        self.args = args
        self.out = Path(args.out)
        self.run = None
        if args.run and args.module:
            raise ConfigError("use either --run DIR or --module SPEC with --checkpoints, not both")
        if args.run:
            if args.checkpoints:
                raise ConfigError("--checkpoints goes with --module; with --run select models with --models")
            self.run = modelspec.open_run(args.run)
            self.module = self.run.module()
            self.data = modelspec.run_data(self.run, args.split)
            selectors = args.models or args.default_models
            if selectors is None:
                raise ConfigError("name the models with --models, e.g. --models client:0 client:1 global")
            self.models = modelspec.run_models(self.run, selectors, args.round)
            keep = getattr(args, "keep_clients", None)
            if not args.models and keep:  # default selection: the first clients of the round (+ global)
                clients = [k for k in self.models if k.startswith("client")][:keep]
                self.models = {k: v for k, v in self.models.items() if k in clients or k.startswith("global")}
        elif args.module:
            if not args.checkpoints:
                raise ConfigError("--module needs --checkpoints FILE ...")
            if not args.data:
                raise ConfigError("--module needs --data (digits, a dataset name, or a .pt/.npz file)")
            if args.models:
                raise ConfigError("--models selects models of a run; with --module list --checkpoints")
            self.data = modelspec.load_data(args.data, split=args.split, root=args.data_root)
            kwargs = _json_arg(args.module_kwargs, "--module-kwargs")
            self.module = modelspec.build_module(
                args.module, input_shape=tuple(self.data[0].shape[1:]),
                num_classes=args.num_classes or modelspec.infer_classes(self.data[1]), kwargs=kwargs)
            self.models = modelspec.checkpoint_models(args.checkpoints, args.labels)
        else:
            raise ConfigError("no models given: " + EPILOG_INPUTS[len("models: "):])
        lo, hi = args.nmodels
        if len(self.models) < lo or (hi is not None and len(self.models) > hi):
            want = f"exactly {lo}" if lo == hi else f"at least {lo}" if hi is None else f"{lo} to {hi}"
            raise ConfigError(f"'{_command(args)}' needs {want} models, got {len(self.models)}: {list(self.models)}")
        self._evaluator = None

    @property
    def evaluator(self):
        from landscape.evaluation.evaluator import Evaluator

        if self._evaluator is None:
            a = self.args
            cache = None if a.no_cache else (a.cache or str(self.out / "landscape_cache.h5"))
            self._evaluator = Evaluator(self.module, self.data, loss=a.loss, device=a.device, bn=a.bn,
                                        dtype=DTYPES[a.dtype], cache=cache, batch_size=a.batch_size,
                                        progress=False if a.quiet else None)
        return self._evaluator

    def split_global(self) -> tuple[dict[str, Any], Any]:
        """(clients, global model): the run's 'global' selection or the --global checkpoint."""
        globals_ = [k for k in self.models if k.startswith("global")]
        clients = {k: v for k, v in self.models.items() if k not in globals_}
        if len(globals_) == 1 and self.run is not None:
            return clients, self.models[globals_[0]]
        if getattr(self.args, "global_model", None):
            return clients, Path(self.args.global_model)
        raise ConfigError("the global model is missing: select 'global' with --run, or pass --global FILE")


def _json_arg(text: str, flag: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{flag} must be a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag} must be a JSON object like '{{\"hidden\": [32]}}'")
    return value


def _command(args: argparse.Namespace) -> str:
    return f"check {args.claim}" if args.command == "check" else args.command


# ------------------------------------------------------------------------------ output
def _plain(value: Any) -> Any:
    """JSON-safe: arrays to lists, numpy scalars to Python, NaN/inf to None."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in (value.tolist() if isinstance(value, np.ndarray) else value)]
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(float(value)) else None
    if isinstance(value, Path):
        return str(value)
    return value


def _table(numbers: Mapping[str, Any], indent: str = "") -> list[str]:
    lines = []
    width = max((len(str(k)) for k in numbers), default=0)
    for key, value in numbers.items():
        if isinstance(value, Mapping):
            lines.append(f"{indent}{key}:")
            lines += _table(value, indent + "  ")
        else:
            lines.append(f"{indent}{str(key).ljust(width)}  {_cell(value)}")
    return lines


def _cell(value: Any) -> str:
    if isinstance(value, (list, tuple, np.ndarray)):
        items = list(value)
        shown = ", ".join(_cell(v) for v in items[:8])
        return f"[{shown}{', ...' if len(items) > 8 else ''}]"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.6g}"
    return str(value)


def emit(ctx: Context, numbers: Mapping[str, Any], results: Mapping[str, Any],
         draw: Callable[[], Mapping[str, Any]] | None = None) -> Path:
    """Write ``<out>/<command>.json``, the figures and the cached results; print the numbers."""
    args = ctx.args
    name = _command(args).replace(" ", "_")
    ctx.out.mkdir(parents=True, exist_ok=True)
    record = {"command": _command(args), "models": list(ctx.models), "numbers": _plain(numbers)}
    target = ctx.out / f"{name}.json"
    target.write_text(json.dumps(record, indent=2) + "\n")
    written = [target]
    if ctx.evaluator.cache is not None:
        from landscape.cache.store import make_key

        for label, result in results.items():
            ctx.evaluator.cache.save_result(make_key({"command": name, "label": label, "models": list(ctx.models),
                                                      "spec": _plain(dict(result.spec))}), result)
    if draw is not None and not args.no_figures:
        from figures.html import save

        for filename, fig in draw().items():
            written.append(save(fig, ctx.out / filename))
            if hasattr(fig, "clf"):
                import matplotlib.pyplot as plt

                plt.close(fig)
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        print("\n".join(_table(numbers)))
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return target


# ---------------------------------------------------------------------------- commands
def cmd_train(args: argparse.Namespace) -> int:
    import fl

    if args.list_algorithms:
        from fl.algorithms import registry

        for name, cls in sorted(registry().items()):
            print(f"{name}: " + (", ".join(f"{k}={v!r}" for k, v in cls.options.items()) or "no options"))
        return 0
    options = dict(args.option)
    if args.no_progress:
        options["progress"] = False
    result = fl.run(args.algorithm, dataset=args.dataset, model=args.model, clients=args.clients,
                    rounds=args.rounds, participation=args.participation, local_epochs=args.local_epochs,
                    batch_size=args.batch_size, lr=args.lr, partition=args.partition, alpha=args.alpha,
                    seed=args.seed, out=args.out, device=args.device, **options)
    last = result.metrics[-1]
    print(f"{result.path}: round {last['round']}, test accuracy {last['test_accuracy']:.4f}, "
          f"test loss {last['test_loss']:.4f}")
    return 0


def cmd_path(args: argparse.Namespace) -> int:
    from landscape.geometry.basin import basin
    from landscape.geometry.paths import interpolate

    ctx = Context(args)
    lo, hi = args.alpha_range
    if not hi > lo or args.alphas < 2:
        raise ConfigError("--alpha-range needs LO < HI and --alphas at least 2")
    alphas = np.union1d(np.linspace(lo, hi, args.alphas), [0.0, 1.0])
    (la, a), (lb, b) = ctx.models.items()
    path = interpolate(a, b, ctx.evaluator, alphas=alphas)
    found = basin(path, models={la: 0.0, lb: 1.0})
    numbers = {"from": la, "to": lb, "loss_barrier": path.loss_barrier, "accuracy_barrier": path.accuracy_barrier,
               "loss_barrier_midpoint": path.loss_barrier_midpoint if np.isclose(alphas, 0.5).any() else None,
               "accuracy_barrier_midpoint": path.accuracy_barrier_midpoint if np.isclose(alphas, 0.5).any() else None,
               "common_basin": found.common, "bottom_alpha": float(found.refined_bottom[0]),
               "bottom_loss": found.refined_loss, "alphas": path.alphas, "loss": path.loss, "accuracy": path.accuracy}

    def draw():
        from figures.paths import path_figure, path_plotly

        named = {f"{la} → {lb}": path}
        return {"path.png": path_figure(named, endpoint_labels=(la, lb)), "path.html": path_plotly(named)}

    emit(ctx, numbers, {"path": path, "basin": found}, draw)
    return 0


def cmd_plane(args: argparse.Namespace) -> int:
    from landscape.geometry.basin import basin
    from landscape.geometry.planes import pca_plane, plane, random_plane

    ctx = Context(args)
    labels = list(ctx.models)
    models = list(ctx.models.values())
    if args.kind == "through":
        if len(models) < 3:
            raise ConfigError(f"a plane through models needs three of them, got {len(models)}")
        grid = plane(*models[:3], ctx.evaluator, resolution=args.resolution, margin=args.margin,
                     labels=tuple(labels[:3]), extra=dict(zip(labels[3:], models[3:])))
    elif args.kind == "random":
        grid = random_plane(models[0], ctx.evaluator, resolution=args.resolution, span=args.span,
                            normalization=args.normalization, seed=args.seed,
                            extra=dict(zip(labels[1:], models[1:])))
        grid = _relabel(grid, {"center": labels[0]})
    else:
        grid = pca_plane(models, ctx.evaluator, resolution=args.resolution, margin=args.margin)
        grid = _relabel(grid, {f"step {i}": label for i, label in enumerate(labels)})
    placed = {k: v for k, v in grid.models.items() if _inside(grid, v)}
    found = basin(grid, models=list(placed), level=args.level)
    numbers = {"kind": args.kind, "resolution": args.resolution,
               "x_range": [float(grid.x[0]), float(grid.x[-1])], "y_range": [float(grid.y[0]), float(grid.y[-1])],
               "min_loss": float(np.nanmin(grid.loss)), "max_accuracy": float(np.nanmax(grid.accuracy)),
               "models": {k: [float(c) for c in v] for k, v in grid.models.items()},
               "basin": {"level": found.level, "common": found.common, "components": found.num_components,
                         "bottom": found.refined_bottom, "bottom_loss": found.refined_loss,
                         "distance_to_bottom": dict(zip(found.names, found.distance))}}

    def draw():
        from figures.planes import plane_figure, plane_plotly

        return {"plane_loss.png": plane_figure(grid, metric="loss"),
                "plane_accuracy.png": plane_figure(grid, metric="accuracy"),
                "plane.html": plane_plotly(grid, metric="loss")}

    emit(ctx, numbers, {"plane": grid, "basin": found}, draw)
    return 0


def _relabel(grid: Any, names: Mapping[str, str]) -> Any:
    import dataclasses

    return dataclasses.replace(grid, models={names.get(k, k): v for k, v in grid.models.items()})


def _inside(grid: Any, xy: Sequence[float]) -> bool:
    return bool(grid.x.min() <= xy[0] <= grid.x.max() and grid.y.min() <= xy[1] <= grid.y.max())


def cmd_group(args: argparse.Namespace) -> int:
    from landscape.geometry.groups import group_barrier, group_barrier_by_size
    from landscape.geometry.paths import barrier_matrix

    ctx = Context(args)
    models = list(ctx.models.values())
    if args.weights is not None and len(args.weights) != len(models):
        raise ConfigError(f"{len(args.weights)} weights for {len(models)} models")
    group = group_barrier(models, ctx.evaluator, weights=args.weights)
    numbers: dict[str, Any] = {"size": len(models), "loss_barrier": group.loss_barrier,
                               "accuracy_barrier": group.accuracy_barrier, "fused_loss": group.fused_loss,
                               "fused_accuracy": group.fused_accuracy,
                               "member_loss": dict(zip(ctx.models, group.member_loss)),
                               "member_accuracy": dict(zip(ctx.models, group.member_accuracy))}
    results: dict[str, Any] = {"group": group}
    if args.by_size:
        sizes = group_barrier_by_size(models, ctx.evaluator, draws=args.draws, seed=args.seed)
        for metric in ("accuracy", "loss"):
            numbers[f"{metric}_barrier_by_size"] = {
                int(k): float(np.mean(r)) for k, r in zip(sizes.sizes, getattr(sizes, f"{metric}_barrier"))}
        results["by_size"] = sizes
    if args.matrix:
        matrix = barrier_matrix(models, ctx.evaluator, alphas=args.alphas, labels=list(ctx.models))
        numbers["pairwise_loss_barrier"] = matrix.loss_barrier
        numbers["pairwise_accuracy_barrier"] = matrix.accuracy_barrier
        results["matrix"] = matrix

    def draw():
        from figures.groups import barrier_matrix_figure, group_size_figure

        figs = {}
        if "by_size" in results:
            s = results["by_size"]
            figs["group_by_size.png"] = group_size_figure(
                {"models": {int(k): list(map(float, r)) for k, r in zip(s.sizes, s.accuracy_barrier)}})
        if "matrix" in results:
            figs["barrier_matrix.png"] = barrier_matrix_figure(results["matrix"])
        return figs

    emit(ctx, numbers, results, draw)
    return 0


def cmd_hessian(args: argparse.Namespace) -> int:
    from landscape.curvature.functions import hessian_density, hessian_eigen, hessian_trace

    ctx = Context(args)
    numbers: dict[str, Any] = {}
    results: dict[str, Any] = {}
    densities = {}
    for label, model in ctx.models.items():
        eig = hessian_eigen(model, ctx.evaluator, k=args.k, tol=args.tol, max_iter=args.max_iter, seed=args.seed)
        entry: dict[str, Any] = {"eigenvalues": eig.values, "converged": eig.converged, "hvps": eig.matvecs}
        results[f"{label} eigen"] = eig
        if args.trace:
            tr = hessian_trace(model, ctx.evaluator, tol=args.tol, max_iter=args.max_iter, seed=args.seed)
            entry.update(trace=tr.value, trace_stderr=tr.stderr)
            results[f"{label} trace"] = tr
        if args.density:
            densities[label] = hessian_density(model, ctx.evaluator, iterations=args.iterations, seed=args.seed)
            results[f"{label} density"] = densities[label]
        numbers[label] = entry

    def draw():
        from figures.curvature import spectral_density_figure, spectral_density_plotly

        if not densities:
            return {}
        return {"hessian_density.png": spectral_density_figure(densities),
                "hessian_density.html": spectral_density_plotly(densities)}

    emit(ctx, numbers, results, draw)
    return 0


def cmd_decompose(args: argparse.Namespace) -> int:
    from landscape_cli import modelspec

    try:
        from landscape.decomposition.ima import decompose
    except ImportError as exc:
        raise ConfigError(f"the decomposition is not available in this installation: {exc}") from None
    ctx = Context(args)
    if ctx.run is not None:
        if args.client_data:
            raise ConfigError("--client-data goes with --module; a run knows its clients' data")
        by_client = modelspec.run_client_data(ctx.run)
        ids = [int(label.split()[1]) for label in ctx.models if label.startswith("client")]
        if len(ids) != len(ctx.models):
            raise ConfigError("decompose takes client models only (--models clients or client:K ...)")
        client_data = [by_client[k] for k in ids]
    else:
        if not args.client_data or len(args.client_data) != len(ctx.models):
            raise ConfigError(f"--client-data needs one data file per checkpoint ({len(ctx.models)})")
        client_data = [modelspec.load_tensor_file(p) for p in args.client_data]
    dec = decompose(list(ctx.models.values()), client_data, ctx.evaluator, weights=args.weights)
    numbers = {name: getattr(dec, name) for name in ("bias", "train_bias", "heter_bias", "cross", "variance",
                                                      "covariance", "wens_loss", "fma_loss", "gap")}
    numbers["locality"] = dict(zip(ctx.models, np.atleast_1d(dec.locality)))
    emit(ctx, numbers, {"decomposition": dec})
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from landscape import claims
    from landscape_cli import modelspec

    ctx = Context(args)
    models = list(ctx.models.values())
    if args.claim == "transitivity":
        baseline = None
        if args.baseline:
            if ctx.run is not None:
                baseline = tuple(modelspec.run_models(ctx.run, list(args.baseline), args.round).values())
            else:
                baseline = tuple(Path(p) for p in args.baseline)
        verdict = claims.transitivity(*models, ctx.evaluator, baseline=baseline, threshold=args.threshold,
                                      min_reduction=args.min_reduction, metric=args.metric, alphas=args.alphas)
    elif args.claim == "group":
        verdict = claims.group_connectivity(models, ctx.evaluator, threshold=args.threshold, metric=args.metric,
                                            by_size=args.by_size, draws=args.draws, seed=args.seed)
    elif args.claim == "shared-basin":
        clients, global_model = ctx.split_global()
        verdict = claims.shared_basin(clients, global_model, ctx.evaluator, plane_kind=args.plane_kind,
                                      resolution=args.resolution, margin=args.margin, level=args.level,
                                      barrier_threshold=args.barrier_threshold, metric=args.metric,
                                      alphas=args.alphas)
    else:
        verdict = claims.flatter(*models, ctx.evaluator, k=args.k, tol=args.tol, max_iter=args.max_iter,
                                 seed=args.seed, margin=args.margin)
    numbers = {"holds": verdict.holds, "status": verdict.status, "reason": verdict.reason, **verdict.numbers}
    results = {k: v for k, v in _flat_results(verdict.results).items()}
    draw = None if args.claim in ("flatter",) or (args.claim == "group" and not args.by_size) else (
        lambda: {f"check_{args.claim}.png": verdict.figure()})
    if not args.json:
        print(f"Claim: {verdict.claim}")
    emit(ctx, numbers, results, draw)
    return 0 if verdict.holds else 1


def _flat_results(results: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    from landscape.results.base import Result

    out: dict[str, Any] = {}
    for key, value in results.items():
        if isinstance(value, Result):
            out[prefix + key] = value
        elif isinstance(value, Mapping):
            out.update(_flat_results(value, f"{prefix}{key}/"))
    return out


def cmd_report(args: argparse.Namespace) -> int:
    from figures.fl_curves import fl_curves_figure
    from figures.paths import path_figure
    from figures.planes import plane_figure
    from figures.report import Report

    from landscape import claims
    from landscape.geometry.groups import group_barrier
    from landscape.geometry.paths import interpolate

    if not args.run:
        raise ConfigError("report needs --run DIR (an FL run directory)")
    if args.out == "landscape_out":
        args.out = str(Path(args.run) / "report")
    args.models = args.models or ["clients", "global"]
    ctx = Context(args)
    cfg = ctx.run.config
    clients = {k: v for k, v in ctx.models.items() if k.startswith("client")}
    global_label = next((k for k in ctx.models if k.startswith("global")), None)
    rep = Report(f"{cfg.get('algorithm')} on {cfg.get('dataset')}",
                 subtitle=f"run {ctx.run.path}, round {ctx.run.rounds[args.round]}; evaluation data: {args.split}")
    rep.section("Configuration").add_table([{"option": k, "value": json.dumps(v) if not isinstance(v, str) else v}
                                             for k, v in cfg.items()])
    rep.section("Training").add_image(fl_curves_figure({cfg.get("algorithm", "run"): ctx.run.metrics}))
    numbers: dict[str, Any] = {}
    names = list(clients)
    if len(names) >= 2:
        paths = {f"{names[0]} → {names[1]}": interpolate(clients[names[0]], clients[names[1]], ctx.evaluator,
                                                           alphas=args.alphas)}
        if global_label:
            paths[f"{names[0]} → {global_label}"] = interpolate(clients[names[0]], ctx.models[global_label],
                                                                ctx.evaluator, alphas=args.alphas)
        rep.section("Linear interpolation", "Loss and accuracy along straight lines (FedGuCci Eq. 3/4).")
        rep.add_image(path_figure(paths, endpoint_labels=None))
        rep.add_table([{"path": k, "loss barrier": p.loss_barrier, "accuracy barrier": p.accuracy_barrier}
                       for k, p in paths.items()])
        numbers["paths"] = {k: {"loss_barrier": p.loss_barrier, "accuracy_barrier": p.accuracy_barrier}
                            for k, p in paths.items()}
        group = group_barrier(list(clients.values()), ctx.evaluator)
        rep.section("Group barrier", f"{len(clients)} client models around their centroid (FedGuCci Def. 3.6).")
        rep.add_table([{"loss barrier": group.loss_barrier, "accuracy barrier": group.accuracy_barrier,
                        "fused accuracy": group.fused_accuracy,
                        "mean client accuracy": float(np.mean(group.member_accuracy))}])
        numbers["group"] = {"loss_barrier": group.loss_barrier, "accuracy_barrier": group.accuracy_barrier}
    if len(names) >= 3 and global_label:
        verdict = claims.shared_basin(clients, ctx.models[global_label], ctx.evaluator,
                                      resolution=args.resolution, alphas=args.alphas)
        rep.section("Shared basin", verdict.claim + ". " + verdict.reason + ".")
        rep.add_image(plane_figure(verdict.results["plane"], metric="loss"))
        rep.add_html(verdict._repr_html_())
        numbers["shared_basin"] = {"holds": verdict.holds, **verdict.numbers}
    target = rep.write(ctx.out / "index.html")
    emit(ctx, numbers, {})
    print(f"report: {target}", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``landscape`` console command; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed on one line)
        return int(exc.code or 0)
    try:
        return args.func(args)
    except LandscapeError as exc:
        print("landscape: error: " + " ".join(str(exc).split()), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("landscape: interrupted; rerun the same command to reuse the cached points", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (e.g. piped into head): the files are written anyway
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
