"""Resolving a command's inputs: which models (an FL run or checkpoint files), which data, which evaluator.

Models come from an FL run (``--run DIR --round R --models global client:3 ...``) or from a
module spec and checkpoint files (``--module mlp --checkpoints a.pt b.pt --data digits``).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from landscape import ConfigError, DataError
from landscape.infra.commandline import parse_json
from landscape.infra.flags import add_option_flags
from landscape.infra.options import Options, option
from landscape_cli import datafiles, modelspec, runs
from landscape_cli.evaluator_flags import evaluator_options
from landscape_cli.limits import MAX_CLASSES

EPILOG_INPUTS = ("models: --run DIR [--round R] [--models SEL ...] with SEL = global | client:K | clients "
                 "(optionally @ROUND), or --module SPEC --checkpoints FILE ... --data digits|NAME|FILE.pt|FILE.npz")
DATA_FORMAT = ("digits, another fl dataset name, or a data file: .npz (numpy.savez, no pickled objects) with "
               "arrays 'inputs' (N, ...) float and 'targets' (N,) integer class labels (int64; float targets "
               "only with --loss mse), also named x/y, or exactly two unnamed arrays; or .pt holding a tuple "
               "(inputs, targets) of tensors (read with weights_only=True)")
#: Losses whose targets are integer class labels (one per sample).
CLASS_LABEL_LOSSES = ("cross_entropy", "nll")


@dataclass(frozen=True)
class InputOptions(Options):
    """The ``models and data`` flags: where the models and the evaluation data come from.

    Attributes
    ----------
    run, round, models
        An FL run folder, the round of its checkpoints and the run's models to analyse.
    module, module_kwargs, checkpoints, labels
        An architecture, its factory's keyword arguments, checkpoint files and their names.
    data, split, bn_data, data_root, flatten
        The evaluation data, its split, the BatchNorm re-estimation data, the torchvision folder,
        and whether inputs are given as flat vectors.
    num_classes
        Outputs of a model built from ``module``.
    """

    run: str | None = option(None, metavar="DIR", help="an FL run directory (written by 'landscape train' or fl.run)")
    round: int = option(-1, help="round of the run's checkpoints (default: the last)")
    models: list[str] | None = option(None, metavar="SEL",
                                      help="run models: global, client:K, clients, each optionally @ROUND")
    module: str | None = option(None, metavar="SPEC",
                                help="architecture: zoo name (mlp, ...), package.module:factory or file.py:factory")
    module_kwargs: str = option("{}", metavar="JSON", help="keyword arguments of the factory, as JSON")
    checkpoints: list[str] | None = option(None, metavar="FILE",
                                           help="checkpoint files (.pt/.pth weights only, .safetensors)")
    labels: list[str] | None = option(None, metavar="NAME", help="names of the checkpoints (default: file stems)")
    data: str | None = option(None, metavar="DATA", help=DATA_FORMAT)
    split: str = option("test", help="test | train (| client:K for a run): the evaluation data")
    bn_data: str | None = option(None, metavar="DATA",
                                 help="data whose batches re-estimate BatchNorm statistics under --bn recompute (same "
                                      "forms as --data; default: the run's training data with --run, else the "
                                      "evaluation data)")
    data_root: str | None = option(None, metavar="DIR", help="folder of torchvision datasets (never downloaded here)")
    flatten: bool = option(False, help="give --data and --bn-data inputs as flat vectors (N, features): the built-in "
                                       "digits are (1, 8, 8), a model starting with Linear(64, ...) needs (64,)")
    num_classes: int | None = option(None, ge=1, le=MAX_CLASSES,
                                     help="outputs of the model (default: largest label + 1)")


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``models and data`` group (``--run``, ``--module``, ``--checkpoints``, ``--data``, ...).

    Parameters
    ----------
    parser : argparse.ArgumentParser
        A parent parser shared by the analysis commands.
    """
    add_option_flags(parser.add_argument_group("models and data"), InputOptions)


def command_name(args: argparse.Namespace) -> str:
    """The command as typed, e.g. ``"plane"`` or ``"check transitivity"``.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments.

    Returns
    -------
    str
    """
    return f"check {args.claim}" if args.command == "check" else args.command


def json_object(text: str, flag: str) -> dict:
    """A JSON object given on the command line.

    Parameters
    ----------
    text : str
        The flag's value.
    flag : str
        The flag, for the error message.

    Returns
    -------
    dict

    Raises
    ------
    ConfigError
        When ``text`` is not JSON, not an object, or longer or nested deeper than
        :mod:`landscape.infra.commandline` allows.
    """
    value = parse_json(text, flag)
    if not isinstance(value, dict):
        raise ConfigError(f"{flag} must be a JSON object like '{{\"hidden\": [32]}}'")
    return value


def check_labels(targets: torch.Tensor, loss: Any, source: str) -> None:
    """Refuse targets that a class-label loss cannot use, with the fix in the message.

    Parameters
    ----------
    targets : torch.Tensor
        The data's targets.
    loss : Any
        The evaluator's loss (a name; callables are not checked).
    source : str
        Where the data came from (``--data FILE`` or the run), for the message.

    Raises
    ------
    DataError
        For float labels or labels of shape ``(N, 1)`` (or any non 1-D shape) under
        ``cross_entropy``/``nll``.
    """
    if loss not in CLASS_LABEL_LOSSES:
        return
    if torch.is_floating_point(targets):
        raise DataError(f"{source}: targets are {targets.dtype} but --loss {loss} needs integer class labels; "
                        "save them as int64 (numpy: y.astype(np.int64)), or use --loss mse for float targets")
    if targets.ndim != 1:
        raise DataError(f"{source}: targets have shape {tuple(targets.shape)} but --loss {loss} needs one class "
                        "label per sample, shape (N,); save y.reshape(-1)")


class Context:
    """Resolved inputs of a command: module, labelled models, data, evaluator, output folder.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments; the command's ``set_defaults`` provide ``nmodels`` (least, most
        models), ``default_models`` (run selectors used without ``--models``) and
        optionally ``keep_clients`` (how many clients that default keeps).

    Raises
    ------
    ConfigError, DataError, CheckpointError
        For inputs that are missing, contradictory or unreadable.
    """

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.command = command_name(args)
        self.out = Path(args.out)
        self.run = None
        if args.run and args.module:
            raise ConfigError("use either --run DIR or --module SPEC with --checkpoints, not both")
        if args.run:
            self._from_run(args)
        elif args.module:
            self._from_files(args)
        else:
            raise ConfigError("no models given: " + EPILOG_INPUTS[len("models: "):])
        lo, hi = args.nmodels
        if len(self.models) < lo or (hi is not None and len(self.models) > hi):
            want = f"exactly {lo}" if lo == hi else f"at least {lo}" if hi is None else f"{lo} to {hi}"
            raise ConfigError(f"'{self.command}' needs {want} models, got {len(self.models)}: {list(self.models)}")
        self._evaluator = None

    def _from_run(self, args: argparse.Namespace) -> None:
        if args.checkpoints:
            raise ConfigError("--checkpoints goes with --module; with --run select models with --models")
        self.run = runs.open_run(args.run)
        self.module = self.run.module()
        self.data = runs.run_data(self.run, args.split)
        selectors = args.models or args.default_models
        if selectors is None:
            raise ConfigError("name the models with --models, e.g. --models client:0 client:1 global")
        self.models = runs.run_models(self.run, selectors, args.round)
        keep = getattr(args, "keep_clients", None)
        if not args.models and keep:  # default selection: the first clients of the round (+ global)
            clients = [k for k in self.models if k.startswith("client")][:keep]
            self.models = {k: v for k, v in self.models.items() if k in clients or k.startswith("global")}

    def _from_files(self, args: argparse.Namespace) -> None:
        if not args.checkpoints:
            raise ConfigError("--module needs --checkpoints FILE ...")
        if not args.data:
            raise ConfigError("--module needs --data (digits, a dataset name, or a .pt/.npz file)")
        if args.models:
            raise ConfigError("--models selects models of a run; with --module list --checkpoints")
        self.data = datafiles.load_data(args.data, split=args.split, root=args.data_root, flatten=args.flatten)
        check_labels(self.data[1], args.loss, f"--data {args.data}")
        kwargs = json_object(args.module_kwargs, "--module-kwargs")
        self.module = modelspec.build_module(
            args.module, input_shape=tuple(self.data[0].shape[1:]),
            num_classes=args.num_classes or datafiles.infer_classes(self.data[1]), kwargs=kwargs)
        self.models = modelspec.checkpoint_models(args.checkpoints, args.labels)

    @property
    def evaluator(self) -> Any:
        """The :class:`landscape.Evaluator` of the command (built on first use).

        Returns
        -------
        landscape.Evaluator
            Over the command's data, with the evaluation flags and the cache
            (``--cache``, default ``<out>/landscape_cache``, written only if neither it nor
            ``<out>`` is a link; none with ``--no-cache``).
        """
        from landscape import Cache, Evaluator

        if self._evaluator is None:
            a = self.args
            options = evaluator_options(a)
            cache = None if a.no_cache else (a.cache or Cache(self.out / "landscape_cache", root=self.out.parent,
                                                              flush_interval=options.flush_interval))
            self._evaluator = Evaluator(self.module, self.data, bn_data=self._bn_data(), cache=cache,
                                        options=options)
        return self._evaluator

    def _bn_data(self) -> Any:
        """Data for ``--bn recompute``: ``--bn-data``, else the run's training data (said on stderr)."""
        a = self.args
        if getattr(a, "bn", None) != "recompute":
            return None
        if getattr(a, "bn_data", None):
            return datafiles.load_data(a.bn_data, split="train", root=a.data_root, flatten=a.flatten)
        if self.run is not None:
            print("landscape: note: --bn recompute re-estimates BatchNorm statistics on the run's training data "
                  "(the union of its clients' data)", file=sys.stderr)
            return runs.run_data(self.run, "train")
        return None

    def split_global(self) -> tuple[dict[str, Any], Any]:
        """The client models and the global model.

        Returns
        -------
        tuple[dict[str, Any], Any]
            (label -> client model, global model): the run's ``global`` selection or the
            ``--global`` checkpoint.

        Raises
        ------
        ConfigError
            When neither names a global model.
        """
        globals_ = [k for k in self.models if k.startswith("global")]
        clients = {k: v for k, v in self.models.items() if k not in globals_}
        if len(globals_) == 1 and self.run is not None:
            return clients, self.models[globals_[0]]
        global_file = vars(self.args).get("global")  # check shared-basin --global
        if global_file:
            return clients, Path(global_file)
        raise ConfigError("the global model is missing: select 'global' with --run, or pass --global FILE")
