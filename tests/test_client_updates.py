"""The server refuses what a client sends when it does not fit the round, naming the client.

:func:`fl.update_checks.update_problem` against a table of hostile updates, then the engine's own
round with a remote stand-in that tampers with one client: ``bad_clients="stop"`` stops before
anything of the round is written (and the folder then resumes to the uninterrupted run),
``bad_clients="drop"`` aggregates the others and records the refused client with its reason.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import fl
from fl.algorithms.base import ClientUpdate
from fl.api import open_run
from fl.engine import Engine
from fl.rounds import client_context
from fl.update_checks import ClientRefused, FederationError, check_integer, metrics_problem, update_problem

from fault_counts import tally

SENT = {"w": torch.zeros(4, 4), "b": torch.zeros(4), "n": torch.tensor(3)}


def good(**change) -> ClientUpdate:
    state = {"w": torch.ones(4, 4), "b": torch.ones(4), "n": torch.tensor(4)}
    state.update(change.pop("state", {}))
    return ClientUpdate({k: v for k, v in state.items() if v is not None}, change.pop("n", 10),
                        change.pop("client_state", None), change.pop("metrics", {"train_loss": 0.5}))


HOSTILE = {
    "shape (1,)": (good(state={"w": torch.zeros(1)}), "'w' has shape (1,), the model's is (4, 4)"),
    "shape ()": (good(state={"w": torch.tensor(1.0)}), "'w' has shape (), the model's is (4, 4)"),
    "shape (1, 4)": (good(state={"w": torch.zeros(1, 4)}), "'w' has shape (1, 4)"),
    "int weights": (good(state={"w": torch.zeros(4, 4, dtype=torch.int32)}),
                    "'w' has dtype int32, the model's is float32"),
    "bool weights": (good(state={"w": torch.ones(4, 4, dtype=torch.bool)}), "'w' has dtype bool"),
    "complex weights": (good(state={"w": torch.zeros(4, 4, dtype=torch.complex64)}), "'w' has dtype complex64"),
    "float64 weights": (good(state={"w": torch.zeros(4, 4, dtype=torch.float64)}), "'w' has dtype float64"),
    "NaN": (good(state={"b": torch.tensor([0.0, math.nan, 0.0, 0.0])}), "'b' holds non-finite values"),
    "inf": (good(state={"b": torch.full((4,), math.inf)}), "'b' holds non-finite values"),
    "extra tensor": (good(state={"spy": torch.zeros(2)}), "1 tensor(s) the model does not have ('spy')"),
    "64 MB extra": (good(state={"spy": torch.zeros(16 * 2 ** 20)}), "more than the limit of 1,048,752 bytes"),
    "missing tensor": (good(state={"b": None}), "it lacks 1 tensor(s) of the model ('b')"),
    "numpy array": (good(state={"b": torch.zeros(4).numpy()}), "'b' is not a dense tensor (ndarray)"),
    "sparse": (good(state={"w": torch.zeros(4, 4).to_sparse()}), "'w' is not a dense tensor"),
    "state not a mapping": (ClientUpdate([torch.zeros(4)], 10), "its state is not a mapping"),  # type: ignore[arg-type]
    "0 samples": (good(n=0), "the sample count 0 is not an integer in 1.."),
    "fractional samples": (good(n=1.5), "the sample count 1.5 is not an integer"),
    "negative samples": (good(n=-1), "the sample count -1"),
    "bool samples": (good(n=True), "the sample count True"),
    "huge samples": (good(n=10 ** 30), "the sample count 100000000000..."),
    "test_accuracy metric": (good(metrics={"test_accuracy": 1.0}),
                             "metric 'test_accuracy' is a field the server writes"),
    "round metric": (good(metrics={"round": 77.0}), "metric 'round' is a field the server writes"),
    "NaN metric": (good(metrics={"train_loss": math.nan}), "metric 'train_loss' is not finite"),
    "string metric": (good(metrics={"train_loss": "0.1"}), "metric 'train_loss' is not a number (str)"),
    "bool metric": (good(metrics={"train_loss": True}), "metric 'train_loss' is not a number (bool)"),
    "odd metric name": (good(metrics={"a b/../c": 1.0}), "is not a plain name"),
    "100 metrics": (good(metrics={f"m{i}": 1.0 for i in range(100)}), "it reports 100 metrics, more than 64"),
    "metrics not a mapping": (good(metrics=[1.0]), "its metrics are not a mapping"),
    "client state of another shape": (good(client_state={"w": torch.zeros(2)}), "'client state w' has shape (2,)"),
    "complex client state": (good(client_state={"z": torch.zeros(2, dtype=torch.complex64)}), "has dtype complex64"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_update_is_refused_with_its_reason(case: str) -> None:
    update, reason = HOSTILE[case]
    held = {"w": torch.zeros(4, 4)} if case.startswith("client state") else None
    problem = update_problem(update, SENT, client_state=held)
    assert problem is not None and reason in problem, problem
    assert "\n" not in problem
    tally("bad inputs rejected")


def test_a_good_update_passes_and_frozen_tensors_may_be_left_out() -> None:
    assert update_problem(good(), SENT) is None
    assert update_problem(good(state={"w": None}), SENT, frozen={"w"}) is None  # a LoRA client's upload
    assert update_problem(good(n=0), SENT, samples=0) is None  # a client the partition gives no samples
    assert update_problem(good(state={"b": torch.full((4,), math.nan)}), SENT, finite=False) is None
    held = {"w": torch.zeros(4, 4)}
    assert update_problem(good(client_state={"w": torch.ones(4, 4)}), SENT, client_state=held) is None


def test_integers_are_not_coerced() -> None:
    assert check_integer(2.0, "x", 0, 3) == 2
    for bad in (1.9, True, "1", -3, 10 ** 30, math.inf, None):
        with pytest.raises(ValueError, match="is not an integer in 0..3"):
            check_integer(bad, "x", 0, 3)
    assert metrics_problem({"fma_test_loss": 0.1}) is not None  # any test metric is the server's
    tally("bad inputs rejected", 8)


SETTINGS = dict(dataset="digits", clients=3, rounds=2, seed=4, local_epochs=1, save_clients="all")


def train_with(out: Path, tamper, **settings) -> None:
    """Train a run whose clients are trained by a remote stand-in that lets ``tamper`` change their updates."""
    with open_run("fedavg", out=out, **{**SETTINGS, **settings}) as opened:
        holder: list[Engine] = []

        def remote(request):
            engine = holder[0]
            updates = {}
            for k in request.clients:
                ctx = client_context(engine.config, engine.alg, engine.module, engine.data, engine.device, request, k)
                updates[k] = tamper(request.round, k, engine.alg.client_update(ctx))
            return updates

        engine = Engine(opened.config, opened.store, opened.algorithm, opened.template, opened.data, opened.device,
                        progress=False, remote=remote)
        holder.append(engine)
        engine.run()


def wrong_shape_in_round_2(r: int, k: int, update: ClientUpdate) -> ClientUpdate:
    if r == 2 and k == 1:
        first = next(iter(update.state))
        return ClientUpdate({**update.state, first: torch.zeros(1)}, update.num_samples, None, update.metrics)
    return update


def test_stop_refuses_before_writing_and_the_folder_resumes(tmp_path: Path) -> None:
    refusal = r"^round 2: the update of client 1 is refused: '.*' has shape \(1,\)"
    with pytest.raises(ClientRefused, match=refusal) as info:
        train_with(tmp_path / "run", wrong_shape_in_round_2)
    assert (info.value.round, info.value.client) == (2, 1)
    run = fl.load_run(tmp_path / "run")
    assert run.rounds == [0, 1] and not (tmp_path / "run" / "clients" / "round_0002").exists()
    resumed = fl.run("fedavg", out=tmp_path / "run", progress=False, **SETTINGS)
    reference = fl.run("fedavg", out=tmp_path / "reference", progress=False, **SETTINGS)
    for key, value in reference.global_state(2).items():
        assert torch.equal(resumed.global_state(2)[key], value)
    tally("bad inputs rejected")


def test_drop_aggregates_the_others_and_records_why(tmp_path: Path) -> None:
    train_with(tmp_path / "run", wrong_shape_in_round_2, bad_clients="drop")
    run = fl.load_run(tmp_path / "run")
    assert run.complete
    record = run.metrics[2]
    assert record["clients"] == [0, 2] and record["dropped"] == [1]
    assert record["dropped_reasons"][0].startswith("client 1: '") and "has shape (1,)" in record["dropped_reasons"][0]
    assert sorted(run.client_states(2)) == [0, 2]
    sizes = {k: len(d) for k, d in run.client_datasets().items()}
    for key, value in run.global_state(2).items():
        mean = sum(sizes[k] * run.client_states(2)[k][key].double() for k in (0, 2)) / (sizes[0] + sizes[2])
        torch.testing.assert_close(value.double(), mean, rtol=1e-6, atol=1e-7)  # FedAvg over the kept clients
    tally("bad inputs rejected")


def test_client_metrics_cannot_overwrite_the_servers_fields(tmp_path: Path) -> None:
    def claims(r: int, k: int, update: ClientUpdate) -> ClientUpdate:
        metrics = {**update.metrics, "test_accuracy": 1.0} if k == 0 else update.metrics
        return ClientUpdate(update.state, update.num_samples, None, metrics)

    train_with(tmp_path / "run", claims, bad_clients="drop", rounds=1)
    run = fl.load_run(tmp_path / "run")  # the folder loads
    record = run.metrics[1]
    assert record["dropped"] == [0] and record["test_accuracy"] < 1.0
    assert "metric 'test_accuracy' is a field the server writes" in record["dropped_reasons"][0]
    tally("bad inputs rejected")


def test_a_round_with_every_client_refused_stops(tmp_path: Path) -> None:
    def nan(r: int, k: int, update: ClientUpdate) -> ClientUpdate:
        return ClientUpdate({n: t * math.nan if t.is_floating_point() else t for n, t in update.state.items()},
                            update.num_samples, None, update.metrics)

    with pytest.raises(FederationError, match=r"round 1: every client was refused; client 0: '.*' holds non-finite"):
        train_with(tmp_path / "run", nan, bad_clients="drop")
    assert fl.load_run(tmp_path / "run").rounds == [0]
    tally("bad inputs rejected")
