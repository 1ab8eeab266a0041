"""The dry run of ``fl.run``: local steps, evaluations, memory, rounds already stored, time.

:func:`estimate_run` resolves the run as ``fl.run`` does (configuration, dataset, initial model,
folder: :func:`fl.resolved_run.resolve_run`), refuses what the run would refuse (a folder of another
run or of other files), and reads how many rounds the folder already holds, writing nothing (no
folder, no lock file). It counts, for each round left, the sampled clients' local steps
(``local_epochs x ceil(samples / batch_size)`` each) and the global test set's forward passes
(``ceil(test samples / eval_batch_size)`` per round, round 0 included) and the files each round
writes (the kept client models, the global model and :data:`ROUND_RECORDS` small records, each
fsynced), times one client update (the first sampled client's, after round 1's server work,
``begin_round``, as the engine runs it; its time divided by its nominal local steps, so an
algorithm's extra local passes count in the time), one evaluation and one checkpoint write (into a
temporary folder of the system's, removed at once) after a warm-up
(:func:`landscape.infra.estimate.time_once`), and estimates the memory from the model's state, the
data on the device and one minibatch's activations. Server work of later rounds (FLOCO's probe at
``tau``, a personalisation phase) is not counted.
"""
from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from landscape.infra.devices import resolve_device
from landscape.infra.estimate import CacheLookup, JobEstimate, Work, output_bytes, plural, tensor_bytes, time_once
from landscape.space.checkpoints import save_state_dict

from .algorithms.base import LocalContext, State
from .algorithms.contexts import RoundContext
from .evaluation import evaluate
from .federation import Federation, sample_clients
from .resolved_run import ResolvedRun, resolve_run
from .rounds import TrainRequest, client_context
from .rundir import prepare_dir, refuse_foreign, saves_clients, split_clients
from .store import RunStore
from .tracker import tracker_for
from .tracking import Track

#: Files a round writes besides its checkpoints: the metrics line, the manifest and the progress marker.
ROUND_RECORDS = 3
#: Files a new run writes before round 0: its configuration and its partition.
SETUP_RECORDS = 2


def estimate_run(algorithm: str | None = None, *, recipe: str | None = None, model: str | nn.Module | None = None,
                 out: str | os.PathLike | None = None, **settings: Any) -> JobEstimate:
    """What ``fl.run`` with these arguments will cost; nothing trained, nothing written.

    Parameters
    ----------
    algorithm, recipe, model, out, **settings
        As for ``fl.run``.

    Returns
    -------
    JobEstimate
        ``"local step"`` and ``"forward pass"`` work (the whole run, and what is left after the
        rounds its folder holds), the memory, the folder's stored rounds and the time.

    Raises
    ------
    ConfigError, CheckpointError, DataError, InitMismatchError
        As ``fl.run`` raises them before training (a bad setting, a folder of another run).
    """
    start = time.perf_counter()
    resolved = resolve_run(algorithm, recipe=recipe, model=model, out=out, **settings)
    config = resolved.config
    store = RunStore(resolved.path)
    refuse_foreign(store)
    done = store.read_progress() if prepare_dir(store, config) else None
    rounds = int(config["rounds"])
    train_parts, test_parts = split_clients(config, resolved.bundle.train_y.numpy())
    device = resolve_device(config["device"])
    data = Federation.build(resolved.bundle, train_parts, test_parts, device)
    setup = time.perf_counter() - start  # the real run repeats this: configuration, data set, model, partition
    clients = [round_clients(resolved, r) for r in range(1, rounds + 1)]
    steps = [round_steps(resolved, [len(p) for p in train_parts], r, ids) for r, ids in enumerate(clients, 1)]
    writes = [SETUP_RECORDS + 1 + ROUND_RECORDS] + [
        (len(ids) if saves_clients(config, r) else 0) + 1 + ROUND_RECORDS for r, ids in enumerate(clients, 1)]
    first = 1 if done is None else done + 1
    eval_batches = math.ceil(len(data.test_y) / int(config["eval_batch_size"]))
    timed = next((k for k in (clients[0] if clients else []) if len(train_parts[k])), 0)
    step, evaluation, write, tracking, memory = _measure(resolved, data, device, timed)
    track = Track.from_mapping(config["track"]) if config.get("track") else None
    tracked = [r for r in range(rounds + 1) if track is not None and track.due(r, rounds)]
    evaluations_left = rounds + 1 - (0 if done is None else done + 1)  # round 0 is the initial model's evaluation
    work = (Work("set-up", 1, 1, setup, "configuration, data set, initial model, partition (timed in this dry run)"),
            Work("local step", sum(steps), sum(steps[first - 1:]), step,
                 f"{rounds} rounds, local epochs x minibatches of the sampled clients"),
            Work("forward pass", (rounds + 1) * eval_batches, evaluations_left * eval_batches,
                 evaluation / eval_batches,
                 f"{rounds + 1} evaluations x {eval_batches} {plural('batch', eval_batches)}"),
            Work("file write", sum(writes), sum(writes[0 if done is None else first:]), write,
                 "kept client models, global models and round records, each fsynced"))
    if tracked:
        work += (Work("tracked round", len(tracked), sum(r >= first for r in tracked) + (0 in tracked and done is None),
                      tracking, f"rounds 0, {track.every}, {2 * track.every}, ... and {rounds}: "
                      f"{', '.join(track.measures)}"),)
    cache = (CacheLookup(f"run folder {resolved.path}", 0 if done is None else done, rounds),)
    notes = ("the time of a file write is measured on the system's temporary folder",) + (
        ("the run is complete: fl.run only reopens it",) if done is not None and done >= rounds else ())
    return JobEstimate("fl.run", work, memory, cache, notes)


def round_clients(resolved: ResolvedRun, r: int) -> list[int]:
    """The clients trained in round ``r``: those sampled from the run's seed, as the algorithm keeps them.

    Parameters
    ----------
    resolved : ResolvedRun
        The run.
    r : int
        The round (1 or more).

    Returns
    -------
    list of int
    """
    config = resolved.config
    return list(resolved.algorithm.participants(r, sample_clients(int(config["seed"]), r, int(config["clients"]),
                                                                  float(config["participation"]))))


def round_steps(resolved: ResolvedRun, sizes: list[int], r: int, clients: list[int]) -> int:
    """Local steps of round ``r``: ``local_epochs(r) x ceil(samples / batch_size)`` over its clients.

    Parameters
    ----------
    resolved : ResolvedRun
        The run.
    sizes : list of int
        Training samples of each client.
    r : int
        The round (1 or more).
    clients : list of int
        The clients it trains (:func:`round_clients`).

    Returns
    -------
    int
    """
    batch = int(resolved.config["batch_size"])
    return sum(resolved.algorithm.local_epochs(r) * math.ceil(sizes[k] / batch) for k in clients)


def _measure(resolved: ResolvedRun, data: Federation, device: torch.device, client: int
             ) -> tuple[float, float, float, dict[str, int]]:
    """Seconds of a local step (``client``'s update / its steps), an evaluation, a file write; the memory's parts."""
    config, alg = resolved.config, resolved.algorithm
    module = alg.build_module(resolved.template).to(device)
    sent = {k: v.detach().to(device).clone() for k, v in module.state_dict().items()}

    def context(k: int, tag: str, server_state: State) -> LocalContext:
        return client_context(config, alg, module, data, device, TrainRequest(1, [k], tag, sent, server_state,
                                                                              {k: {}}), k)

    initial = alg.init_server_state(sent)
    sampled = sample_clients(int(config["seed"]), 1, int(config["clients"]), float(config["participation"]))
    server_state = alg.begin_round(RoundContext(  # the round's server work, as the engine runs it first
        1, sent, initial, list(sampled), int(config["clients"]),
        lambda ids, tag: {k: alg.client_update(context(k, tag, initial)) for k in ids},
        [len(i) for i in data.client_train]))
    ctx = context(client, "client", server_state)
    size = int(config["batch_size"])
    steps = max(1, ctx.local_epochs * math.ceil(len(ctx.y) / size))
    step = time_once(lambda: alg.client_update(dataclasses.replace(ctx)), device) / steps
    evaluation = time_once(lambda: evaluate(module, sent, data.test_x, data.test_y,
                                            batch_size=int(config["eval_batch_size"])), device)
    with tempfile.TemporaryDirectory() as scratch:  # removed at once: the run folder is not touched
        write = time_once(lambda: save_state_dict(sent, Path(scratch) / "probe.safetensors"))
    tracked = _tracked_round_seconds(resolved, data, device, alg.export_state(sent, server_state), len(sampled))
    activations = 2 * output_bytes(module, lambda: module(ctx.x[:size]))
    state = tensor_bytes(sent)
    participants = max(1, round(int(config["clients"]) * float(config["participation"])))
    memory = {"parameters": state * (3 + participants),
              "data": tensor_bytes([data.train_x, data.train_y, data.test_x, data.test_y]), "activations": activations}
    return step, evaluation, write, tracked, memory


class _PreviousGlobal:
    """Stands in for the run folder a tracker reads the previous global model from (nothing is read or written)."""

    def __init__(self, state: State):
        self.state = state

    def global_path(self, round: int) -> int:
        return round

    def read_state(self, path: Any) -> State:
        return self.state


def _tracked_round_seconds(resolved: ResolvedRun, data: Federation, device: torch.device, exported: State,
                           participants: int) -> float:
    """Seconds of one tracked round's measures (0 when the run is not tracked).

    Timed on the initial model standing in for the global model and for each of the round's
    ``participants`` client models: the measures' cost depends on the number of models and of
    probes, not on the weights.
    """
    config = resolved.config
    tracker = tracker_for(config, resolved.template, data.train_x, data.train_y, data.client_train, device,
                          _PreviousGlobal(exported))  # type: ignore[arg-type]
    if tracker is None:
        return 0.0
    clients = {k: exported for k in range(participants)}
    first_tracked = min(tracker.track.every, int(config["rounds"]))  # a round with client measures
    return time_once(lambda: tracker.record(first_tracked, exported, clients), device)
