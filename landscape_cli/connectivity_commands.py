"""Entry points for command-line tools.

Align a checkpoint to another and write it; train a curve between two checkpoints and summarise
it. Each returns a JSON-ready dict.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

from torch import nn

from landscape import Cache, Evaluator, save_state_dict
from landscape.alignment.align import as_module, match
from landscape.connectivity.curves import curve
from landscape.space.checkpoints import check_save_path


def align_file(model: Any, to: Any, out: str | os.PathLike, *, template: nn.Module, data: Any = None,
               method: str = "weight", seed: int = 0, input_shape: Sequence[int] | None = None,
               strict: bool = True) -> dict[str, Any]:
    """Align ``model`` to ``to`` (:func:`~.align.match`) and write the aligned state_dict to ``out``.

    Parameters
    ----------
    model, to : model-like
        Model-likes (checkpoint paths, state_dicts or modules) of ``template``'s architecture.
    out : str or os.PathLike
        Destination (``.safetensors``, ``.pt`` or ``.pth``; written atomically by
        :func:`landscape.save_state_dict`).
    template : torch.nn.Module
        The architecture.
    data : data, optional
        As :func:`~.align.match`.
    method : str
        ``"weight"`` or ``"activation"``, as :func:`~.align.match`.
    seed : int
        As :func:`~.align.match`.
    input_shape : sequence of int, optional
        As :func:`~.align.match`.
    strict : bool
        As :func:`~.align.match`.

    Returns
    -------
    dict
        ``out``, ``method``, ``groups``, ``units``, ``units_moved``, ``seconds``, the matching
        information (weight matching: ``objective_before``/``objective``, ``sweeps``), and the
        operations whose units were left in place (``pinned``).

    Raises
    ------
    ConfigError
        If ``out`` has no checkpoint suffix (refused before aligning).
    """
    check_save_path(out)
    found = match(model, to=to, data=data, method=method, seed=seed, template=template, input_shape=input_shape,
                  strict=strict)
    aligned = found.apply(as_module(model, template))
    path = save_state_dict(aligned.state_dict(), out)
    return {"out": str(path), "method": method, "groups": len(found.perms),
            "units": int(sum(len(p) for p in found.perms)), "units_moved": found.moved_units,
            "seconds": found.seconds, **found.info, "pinned": list(found.spec.pinned)}


def curve_summary(a: Any, b: Any, evaluator: Evaluator, *, train_data: Any, kind: str = "bezier",
                  cache: str | os.PathLike | None = None, key: str | None = None, **training: Any) -> dict[str, Any]:
    """Train a curve (:func:`~.curves.curve`), optionally store it in an HDF5 cache, and summarise it.

    Parameters
    ----------
    a, b : model-like
        Endpoints of the curve.
    evaluator : Evaluator
        Architecture, loss and evaluation data.
    train_data : Any
        Data the bend knots are trained on.
    kind : str
        ``"bezier"`` or ``"polychain"`` (Garipov et al. 2018).
    cache, key : str or os.PathLike, str, optional
        HDF5 cache file and key to store the :class:`~.results.CurveResult` under.
    **training : Any
        Further keyword arguments of :func:`~.curves.curve` (epochs, lr, seed, ...).

    Returns
    -------
    dict
        Curve and line barriers (loss and accuracy), maximum losses, the training history, and
        ``cache``/``key`` where the :class:`~.results.CurveResult` was stored.
    """
    result = curve(a, b, evaluator, kind=kind, train_data=train_data, **training)
    summary: dict[str, Any] = {
        "kind": kind, "loss_barrier": result.loss_barrier, "accuracy_barrier": result.accuracy_barrier,
        "line_loss_barrier": result.line_loss_barrier, "line_accuracy_barrier": result.line_accuracy_barrier,
        "max_loss": float(result.loss.max()), "line_max_loss": float(result.line_loss.max()),
        "history": list(result.history)}
    if cache is not None:
        key = key or f"curve-{kind}-seed{training.get('seed', 0)}"
        Cache(cache).save_result(key, result)
        summary.update({"cache": str(cache), "key": key})
    return summary
