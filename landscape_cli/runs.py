"""FL runs named on the command line: ``--run DIR``, run selectors and run data.

**Run selectors**: ``global``, ``client:K``, ``clients`` (every client trained in the round),
each optionally ``@R`` for another round than ``--round``. The ``fl`` package is imported
lazily.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from landscape import ConfigError
from landscape_cli.datafiles import TensorPair

_SELECTOR = re.compile(r"^(global|clients|client:(\d+))(?:@(-?\d+))?$")


def open_run(path: str) -> Any:
    """An FL run directory as a :class:`fl.Run`.

    Parameters
    ----------
    path : str
        The run directory.

    Returns
    -------
    fl.Run

    Raises
    ------
    ConfigError
        When the directory does not exist, or ``path`` is a file (``fl.load_run`` checks the
        folder's content).
    """
    import fl

    if not Path(path).is_dir():
        if Path(path).exists():
            raise ConfigError(f"--run {path} is a file, not a run folder: --run takes the folder an FL run wrote "
                              "(landscape train --out DIR, or fl.run(out=DIR)), the one holding config.json")
        raise ConfigError(f"run directory {path} not found")
    return fl.load_run(path)


def run_models(run: Any, selectors: list[str], round: int = -1) -> dict[str, Any]:
    """State dicts of a run selected by ``global``, ``client:K``, ``clients``, each optionally ``@R``.

    Parameters
    ----------
    run : fl.Run
        The run.
    selectors : list[str]
        Run selectors.
    round : int
        Round of selectors without ``@R`` (negative: from the end).

    Returns
    -------
    dict[str, dict[str, torch.Tensor]]
        Label (``global``, ``client 3``, ``client 3 @5``) -> state_dict.

    Raises
    ------
    ConfigError
        A malformed selector, a round without client models, or a client that did not train.
    """
    out: dict[str, Any] = {}
    for sel in selectors:
        m = _SELECTOR.match(sel.strip())
        if m is None:
            raise ConfigError(f"bad model selector {sel!r}: use global, client:K or clients, optionally @ROUND")
        r = int(m.group(3)) if m.group(3) is not None else round
        suffix = f" @{r}" if m.group(3) is not None else ""
        if m.group(1) == "global":
            out[f"global{suffix}"] = run.global_state(r)
            continue
        clients = run.client_states(r)
        shown = f"{r} (round {run.rounds[r]})" if r < 0 and -len(run.rounds) <= r else str(r)
        if not clients:
            raise ConfigError(f"round {shown} has no client models (round 0 is the initial model); "
                              "pick another --round")
        if m.group(1) == "clients":
            out.update({f"client {k}{suffix}": s for k, s in clients.items()})
        else:
            k = int(m.group(2))
            if k not in clients:
                raise ConfigError(f"--models client:{k}: client {k} did not train in round {shown}; "
                                  f"trained: {sorted(clients)}")
            out[f"client {k}{suffix}"] = clients[k]
    return out


def run_data(run: Any, split: str = "test") -> TensorPair:
    """Evaluation data of a run.

    Parameters
    ----------
    run : fl.Run
        The run.
    split : str
        ``test`` (the run's test set), ``train`` (the union of its clients' training data) or
        ``client:K``.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        Inputs and targets.

    Raises
    ------
    ConfigError
        An unknown split or client.
    """
    if split == "test":
        return _tensors(run.test_dataset())
    datasets = run.client_datasets()
    if split == "train":
        parts = [_tensors(d) for d in datasets.values()]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    m = re.match(r"^client:(\d+)$", split)
    if m and int(m.group(1)) in datasets:
        return _tensors(datasets[int(m.group(1))])
    raise ConfigError(f"split {split!r}: use test, train or client:K with K in {sorted(datasets)}")


def run_client_data(run: Any) -> dict[int, TensorPair]:
    """Each client's training data as tensors.

    Parameters
    ----------
    run : fl.Run
        The run.

    Returns
    -------
    dict[int, tuple[torch.Tensor, torch.Tensor]]
        Client id -> (inputs, targets).
    """
    return {k: _tensors(d) for k, d in run.client_datasets().items()}


def _tensors(dataset: Any) -> TensorPair:
    if hasattr(dataset, "tensors") and len(dataset.tensors) >= 2:
        return dataset.tensors[0], dataset.tensors[1]
    xs, ys = zip(*(dataset[i] for i in range(len(dataset))))
    return torch.stack(list(xs)), torch.as_tensor(ys)
