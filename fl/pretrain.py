"""Central pretraining: a checkpoint to start federated runs from (``fl.run(..., init=PATH)``).

LSS (and any study of federated fine-tuning) starts from a pretrained model. :func:`pretrain`
trains a zoo model centrally with mini-batch SGD (the same step as a FedAvg client,
:func:`fl.algorithms.sgd.local_sgd`) on data that are neither the federation's training data
nor its test set, and writes its weights as a ``.safetensors`` state_dict.

The pretraining data (:func:`pretraining_data`) exist for MNIST-1D only: a second draw of the
MNIST-1D generator with another seed (:data:`fl.mnist1d.PRETRAIN`: the same generator and
arguments, seed 2024 instead of 42; 5000 signals, all used for training), generated once and
cached beside the standard data like them. Why a new draw rather than a held-out part: every
training signal of ``load_dataset("mnist1d")`` belongs to some client and the test set measures
the federation, so any part of either would be seen twice; a draw from the same generator is
the same task and distribution with no signal in common. The embedded digits and the
torchvision datasets have no such second source, so :func:`pretrain` refuses them (pretrain
elsewhere and pass the weights with ``init=``).

Deterministic: the model's initialisation and the order of the mini-batches come from
``seed`` (its own ``torch.Generator``; the global RNG is untouched), so the same arguments on
the same device give bit-identical weights (on the CPU, the default). The file is written
atomically and never through a symbolic link (:func:`landscape.space.checkpoints.save_state_dict`).
"""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from landscape.infra.devices import resolve_device
from landscape.infra.errors import ConfigError, FileWriteError, TrainingDivergedError
from landscape.infra.options import Options, option
from landscape.space.checkpoints import check_save_path, save_state_dict

from .algorithms.contexts import LocalContext
from .algorithms.seeds import make_generator
from .algorithms.sgd import local_sgd
from .datasets import DataBundle, canonical_name, default_root
from .mnist1d import PRETRAIN, load_mnist1d
from .models import build_model, default_model
from .template import check_model_fits


@dataclasses.dataclass(frozen=True)
class PretrainOptions(Options):
    """The training settings of :func:`pretrain` (validated like every option set).

    Parameters
    ----------
    epochs, batch_size, lr, momentum, weight_decay, seed
        See each field's help.
    """

    epochs: int = option(5, ge=1, le=10_000, help="passes over the pretraining data")
    batch_size: int = option(64, ge=1, le=10_000_000, help="mini-batch size")
    lr: float = option(0.05, gt=0, le=100, help="SGD learning rate")
    momentum: float = option(0.9, ge=0, lt=1, help="SGD momentum")
    weight_decay: float = option(0.0, ge=0, le=1, help="SGD weight decay")
    seed: int = option(0, ge=0, le=2**63 - 1, help="model initialisation and mini-batch order")


def pretraining_data(dataset: str = "mnist1d", *, root: str | os.PathLike | None = None) -> DataBundle:
    """The pretraining data of ``dataset``: disjoint from its training and test sets.

    Parameters
    ----------
    dataset : str
        ``"mnist1d"`` (the only dataset with a disjoint source; see the module docstring).
    root : str or os.PathLike, optional
        Data folder (default :func:`fl.datasets.default_root`); the draw is cached there.

    Returns
    -------
    DataBundle
        ``train_x`` (5000, 1, 40) float32 signals and ``train_y`` labels of the pretraining draw
        (both parts of the generator's split); the test tensors are empty.

    Raises
    ------
    ConfigError
        For any other dataset.
    """
    if canonical_name(str(dataset)) != "mnist1d":
        raise ConfigError(f"pretraining data exist for mnist1d only (a second draw of its generator), not for "
                          f"{dataset!r}, whose every sample is federation training or test data; pretrain "
                          "elsewhere and pass the weights with init=")
    arrays = load_mnist1d(default_root() if root is None else Path(root).expanduser(), PRETRAIN)
    x = torch.from_numpy(np.concatenate([arrays["x"], arrays["x_test"]]))
    y = torch.from_numpy(np.concatenate([arrays["y"], arrays["y_test"]]))
    return DataBundle("mnist1d-pretrain", x, y, x[:0], y[:0], num_classes=10)


def pretrain(dataset: str = "mnist1d", model: str | None = None, *, out: str | os.PathLike,
             epochs: int = 5, seed: int = 0, lr: float = 0.05, momentum: float = 0.9,
             batch_size: int = 64, weight_decay: float = 0.0, data_root: str | os.PathLike | None = None,
             device: str = "cpu", progress: bool | None = None,
             on_epoch: Callable[[int, float, dict[str, torch.Tensor]], None] | None = None) -> Path:
    """Train ``model`` centrally on the pretraining data of ``dataset`` and write its weights.

    Parameters
    ----------
    dataset : str
        ``"mnist1d"`` (:func:`pretraining_data`).
    model : str, optional
        A zoo name (``fl.models.MODELS``); default: the dataset's model, as in ``fl.run``.
    out : str or os.PathLike
        The checkpoint to write: ``.safetensors`` (or ``.pt``/``.pth``); its folder is created.
    epochs, seed, lr, momentum, batch_size, weight_decay
        :class:`PretrainOptions`: SGD for ``epochs`` passes over shuffled mini-batches.
    data_root : str or os.PathLike, optional
        Data folder (default :func:`fl.datasets.default_root`).
    device : str
        ``"cpu"`` (default, bit-reproducible), ``"auto"``, ``"cuda"`` or ``"cuda:N"``.
    progress : bool, optional
        Show a tqdm bar over the epochs (default: when stderr is a terminal).
    on_epoch : callable, optional
        ``f(epoch, loss, state)`` after each epoch (1-based): the epoch's mean training loss and
        the model's state_dict, e.g. to evaluate it on a test set and check convergence
        (:func:`fl.convergence.assess` takes ``{"round": epoch, "test_accuracy": ...}`` records).

    Returns
    -------
    Path
        ``out``, a state_dict of ``model`` for ``fl.run(..., dataset=dataset, model=model, init=out)``.

    Raises
    ------
    ConfigError
        For a dataset without pretraining data, an unknown model, a setting out of range, or an
        ``out`` whose suffix names no checkpoint format (before any training).
    FileWriteError
        When ``out`` is a symbolic link (before any training) or cannot be written.
    TrainingDivergedError
        When the loss or the weights become NaN or infinite (nothing is written).
    """
    opts = PretrainOptions.from_mapping({"epochs": epochs, "batch_size": batch_size, "lr": lr, "momentum": momentum,
                                         "weight_decay": weight_decay, "seed": seed}, owner="pretrain option ")
    out = check_save_path(Path(out).expanduser())
    if out.is_symlink():
        raise FileWriteError(out, "is a symbolic link; a checkpoint is never written through a link: remove it "
                                  "or choose another out")
    bundle = pretraining_data(dataset, root=data_root)
    dev = resolve_device(device)
    net = build_model(model or default_model(dataset), num_classes=bundle.num_classes,
                      input_shape=bundle.input_shape, seed=opts.seed)
    check_model_fits(net, bundle)
    net = net.to(dev)
    ctx = LocalContext(round=0, client=0, global_state={k: v.detach() for k, v in net.state_dict().items()},
                       server_state={}, client_state={}, x=bundle.train_x.to(dev), y=bundle.train_y.to(dev),
                       generator=make_generator(opts.seed, "pretrain"), lr=opts.lr, local_epochs=1,
                       batch_size=opts.batch_size, momentum=opts.momentum, weight_decay=opts.weight_decay,
                       module=net, options={}, config={}, device=dev, num_classes=bundle.num_classes)
    _train(ctx, opts, sys.stderr.isatty() if progress is None else progress, on_epoch)
    return save_state_dict(ctx.global_state, out)


def _train(ctx: LocalContext, opts: PretrainOptions, progress: bool,
           on_epoch: Callable[[int, float, dict[str, torch.Tensor]], None] | None) -> None:
    """``opts.epochs`` epochs of :func:`local_sgd`, one call per epoch.

    The generator and the momentum carry over, so the steps are those of one call over all
    epochs; the state ends in ``ctx.global_state``; ``on_epoch`` sees it after every epoch.
    """
    from landscape.infra.progress import progress_bar

    momentum: dict[str, torch.Tensor] = {}
    with progress_bar(range(opts.epochs), disable=not progress, unit="epoch", desc="pretraining") as bar:
        for epoch in bar:
            result = local_sgd(ctx, momentum_state=momentum)
            bad = [] if np.isfinite(result.loss) else ["loss"]
            if any(t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in result.state.values()):
                bad.append("weights")
            if bad:
                raise TrainingDivergedError("pretraining", epoch, bad, {"lr": opts.lr, "momentum": opts.momentum})
            ctx.global_state, momentum = result.state, result.momentum
            bar.set_postfix(loss=f"{result.loss:.3f}")
            if on_epoch is not None:
                on_epoch(epoch + 1, result.loss, ctx.global_state)
