"""The initial model of a run from given weights (``fl.run(..., init=CHECKPOINT)``).

``init`` names a state_dict file (``.safetensors``, or ``.pt``/``.pth`` read with
``torch.load(weights_only=True)``; :func:`fl.pretrain.pretrain` writes one) or a finished run
folder, whose last global model is taken. The file is read with the toolkit's safe loader
(:func:`landscape.space.checkpoints.load_state_dict`: nothing is unpickled, a FIFO or a device
is refused unread, a corrupt file is refused). Its tensors must be exactly the model's: the
same names and shapes, floating point where the model's are (a floating-point tensor of
another precision is cast to the model's, as ``load_state_dict`` does), and finite. The run's
round 0 is then these weights bit for bit, and the configuration records their digest as
``init_digest`` (see :mod:`fl.config`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, MutableMapping, Sequence

import torch
from torch import nn

from landscape.infra.errors import ArchitectureMismatchError, CheckpointError, LandscapeError, NonFiniteWeightsError
from landscape.space.checkpoints import load_state_dict

from .reader import Run
from .template import state_digest


class InitMismatchError(ArchitectureMismatchError):
    """The ``init`` weights do not fit the run's model; the message names the first tensor that differs and both shapes.

    Parameters
    ----------
    source : str
        The checkpoint or run folder.
    missing, unexpected : Sequence[str]
        Model tensors absent from the checkpoint; checkpoint tensors the model does not have.
    wrong_shape : Sequence[tuple[str, tuple, tuple]]
        ``(name, model shape, checkpoint shape)`` triples.
    first : str
        The first difference, in words.
    """

    def __init__(self, source: str, missing: Sequence[str], unexpected: Sequence[str],
                 wrong_shape: Sequence[tuple[str, tuple, tuple]], first: str):
        self.missing, self.unexpected, self.wrong_shape = list(missing), list(unexpected), list(wrong_shape)
        others = len(self.missing) + len(self.unexpected) + len(self.wrong_shape) - 1
        LandscapeError.__init__(self, f"{source}: the init weights do not fit the run's model: {first}"
                                      f"{f' ({others} more tensors differ)' if others else ''}; pass weights of "
                                      "this model (fl.pretrain with the run's dataset and model writes them)")


def apply_init(template: nn.Module, config: MutableMapping[str, Any]) -> None:
    """Load the weights named by ``config["init"]`` into ``template`` and record their digest.

    Nothing happens when ``init`` is None (the model keeps its seeded random initialisation).

    Parameters
    ----------
    template : nn.Module
        The run's plain architecture (a module built for this run; its weights are replaced).
    config : MutableMapping[str, Any]
        The run configuration; ``init_digest`` is set to the digest of the loaded weights
        (:func:`fl.template.state_digest` of the module's state).

    Raises
    ------
    CheckpointError
        When ``init`` does not exist, is a folder but no run folder or an unfinished run, is not
        a checkpoint (text, another format, pickled objects, corrupt, a FIFO or a device), or
        holds an integer tensor where the model's is floating point (or the reverse).
    InitMismatchError
        When a tensor of the model is missing, the checkpoint holds one the model does not, or
        a shape differs (an :class:`ArchitectureMismatchError`).
    NonFiniteWeightsError
        When a weight is NaN or infinite (also after casting to the model's precision).
    """
    if config.get("init") is None:
        return
    path = Path(config["init"]).expanduser()
    model = template.state_dict()
    state = _read(path, list(model))
    weights = _matched(state, model, str(path))
    template.load_state_dict(weights)
    config["init_digest"] = state_digest(template.state_dict())


def _read(path: Path, keys: list[str]) -> dict[str, torch.Tensor]:
    """The state_dict of a checkpoint file, or the last global model of a finished run folder."""
    if not path.exists() and not path.is_symlink():
        raise CheckpointError(path, "init checkpoint not found; pass a .safetensors or .pt state_dict (fl.pretrain "
                                    "writes one) or a finished run folder")
    if not path.is_dir():
        return load_state_dict(path, template_keys=keys)
    if not (path / "config.json").exists():
        raise CheckpointError(path, "is a folder but not an FL run folder (no config.json); init takes a "
                                    "checkpoint file or a finished run folder")
    run = Run(path)
    if not run.complete:
        stored = f"rounds 0..{run.rounds[-1]}" if run.rounds else "no round"
        raise CheckpointError(path, f"holds an unfinished run ({stored} of {run.config['rounds']} stored); finish "
                                    "it by rerunning it, or pass one of its checkpoints "
                                    "(global/round_RRRR.safetensors) as init")
    return run.global_state(-1)


def _matched(state: Mapping[str, torch.Tensor], model: Mapping[str, torch.Tensor], source: str
             ) -> dict[str, torch.Tensor]:
    """``state`` in the model's dtypes.

    Refused unless its names, shapes and kinds are the model's and every value is finite.
    """
    missing = [k for k in model if k not in state]
    unexpected = [k for k in state if k not in model]
    wrong = [(k, tuple(t.shape), tuple(state[k].shape)) for k, t in model.items()
             if k in state and tuple(state[k].shape) != tuple(t.shape)]
    differences = {k: f"the model's {k} (shape {tuple(model[k].shape)}) is not in the checkpoint" for k in missing}
    differences.update({k: f"{k} has shape {got} in the checkpoint but {want} in the model" for k, want, got in wrong})
    first = next((differences[k] for k in model if k in differences), None)
    if first is None and unexpected:
        first = f"the checkpoint's {unexpected[0]} (shape {tuple(state[unexpected[0]].shape)}) is not in the model"
    if first is not None:
        raise InitMismatchError(source, missing, unexpected, wrong, first)
    for k, t in model.items():
        if t.is_floating_point() != state[k].is_floating_point():
            raise CheckpointError(source, f"{k} is {state[k].dtype} in the init checkpoint but {t.dtype} in the "
                                          "model; save the weights with the model's dtypes")
    weights = {k: state[k].detach().to(t.dtype) for k, t in model.items()}
    bad = [k for k, t in weights.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise NonFiniteWeightsError(bad, f"init checkpoint {source}")
    return weights
