"""Ditto (fl/algorithms/ditto.py).

FedAvg's global model plus persistent personal models trained on ``F_k(v) + lam/2 |v -
w_received|^2``; ``local_accuracy`` as FLOCO's.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fl
from fl.algorithms.seeds import make_generator
from fl.datasets import load_dataset

from conftest import train_digits_mlp

RUN = dict(dataset="digits", clients=4, rounds=3, local_epochs=1, batch_size=32, lr=0.1, seed=0, progress=False)


class Stop(Exception):
    pass


def _strip(metrics: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if k != "time"} for m in metrics]


def _personal(run: fl.Run) -> dict[int, dict[str, torch.Tensor]]:
    """The personal models the server keeps after the run's last round (its client state)."""
    return run.store.read_client_states(run.rounds[-1])


def _accuracy(run: fl.Run, state: dict, x: torch.Tensor, y: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Accuracy of ``state`` on (x, y) and its logits."""
    module = run.module()
    module.load_state_dict(state)
    module.eval()
    with torch.no_grad():
        logits = module(x)
    return float((logits.argmax(1) == y).double().mean()), logits


def _same_states(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_global_model_is_fedavgs_bit_for_bit(tmp_path) -> None:
    """Ditto's global update is FedAvg's (Algorithm 1): same seed and settings, same global models."""
    settings = dict(RUN, participation=0.5, local_test_fraction=0.2, momentum=0.5)
    ditto = fl.run("ditto", out=tmp_path / "ditto", **settings)
    fedavg = fl.run("fedavg", out=tmp_path / "fedavg", **settings)
    assert ditto.config["options"] == {"lam": 1.0, "personal_epochs": 1}  # personal_epochs = local_epochs
    for r in ditto.rounds:
        assert _same_states(ditto.global_state(r), fedavg.global_state(r)), r
    for a, b in zip(ditto.metrics, fedavg.metrics):
        for key in ("round", "test_loss", "test_accuracy", "train_loss", "clients"):
            assert a.get(key) == b.get(key), key
    # the client checkpoints are the personal models, which the proximal training keeps apart from
    # FedAvg's client models
    personal, last = _personal(ditto), ditto.rounds[-1]
    clients = ditto.client_states(last)
    assert sorted(clients) == ditto.metrics[-1]["clients"] and set(clients) <= set(personal)
    for k, state in clients.items():
        assert _same_states(state, personal[k])
        assert not _same_states(state, fedavg.client_states(last)[k])
    assert all("local_accuracy" in m and "personal_loss" in m for m in ditto.metrics[1:])


def test_lam_zero_personal_model_is_plain_local_sgd(tmp_path) -> None:
    """With lam = 0 a client's personal model is plain SGD from the initial global model on its data.

    For a client that takes part every round: an independent torch.optim.SGD loop over the same
    mini-batches (the run's per-round batch stream (seed, "client", round, client), momentum restarted
    every round) reproduces it.
    """
    settings = dict(RUN, rounds=2, momentum=0.5, lam=0.0)
    run = fl.run("ditto", out=tmp_path / "ditto", **settings)
    personal = _personal(run)
    assert sorted(personal) == list(range(RUN["clients"]))
    data = run.client_datasets()
    for k in range(RUN["clients"]):
        x, y = data[k].tensors
        module = run.module()
        module.load_state_dict(run.global_state(0))
        module.train()
        for r in (1, 2):
            opt = torch.optim.SGD(module.parameters(), lr=RUN["lr"], momentum=0.5)
            gen = make_generator(RUN["seed"], "client", r, k)
            for _ in range(RUN["local_epochs"]):
                for idx in torch.randperm(len(y), generator=gen).split(RUN["batch_size"]):
                    opt.zero_grad()
                    F.cross_entropy(module(x[idx]), y[idx]).backward()
                    opt.step()
        # the same float32 operations in the same order (a forward pass, its gradients, SGD's update):
        # torch.optim.SGD and the engine's step agree to a few roundings per step at most
        for name, t in module.state_dict().items():
            torch.testing.assert_close(personal[k][name], t, rtol=1e-5, atol=1e-6)
    # round 1 starts the personal and the global update from w0 on the same mini-batches, so with
    # lam = 0 the personal model is FedAvg's client model of that round, bit for bit
    fedavg = fl.run("fedavg", out=tmp_path / "fedavg", **dict(RUN, rounds=1, momentum=0.5, local_test_fraction=0.2))
    for k, state in run.client_states(1).items():
        assert _same_states(state, fedavg.client_states(1)[k])


def test_large_lam_pins_personal_models_to_the_received_model(tmp_path) -> None:
    """As lam -> infinity, v_k -> w. Plain SGD on lam/2 |v - w|^2 is stable only for lr * lam < 2.

    At lam = 1/lr every step lands on v = w - lr grad F_k(v), the SGD image of the limit, so v stays
    one small step from w. Bound: v's prediction on a sample can differ from the received model w's
    only where w's top-2 logit margin is at most twice the largest change of a logit, so on a client's
    split |acc(v) - acc(w)| <= the share of such samples. From a trained initial model with a small
    step (margins of several units, logit changes of a few hundredths) that share is small.
    """
    lr = 0.0005
    net = train_digits_mlp(load_dataset("digits"), 0, width=32, epochs=3)
    settings = dict(RUN, rounds=1, lr=lr, momentum=0.0, save_clients="none")
    pinned = fl.run("ditto", model=net, out=tmp_path / "pinned", lam=1.0 / lr, **settings)
    free = fl.run("ditto", model=net, out=tmp_path / "free", lam=0.0, **settings)
    received = pinned.global_state(0)  # what every client received in round 1

    def distance(state: dict) -> float:
        return sum(float((state[n] - received[n]).norm()) ** 2 for n in received) ** 0.5

    tests = pinned.client_test_datasets()
    personal_acc, global_acc, bounds = [], [], []
    for k, v in sorted(_personal(pinned).items()):
        x, y = tests[k].tensors
        acc_v, z_v = _accuracy(pinned, v, x, y)
        acc_w, z_w = _accuracy(pinned, received, x, y)
        top2 = z_w.topk(2, dim=1).values
        bound = float((top2[:, 0] - top2[:, 1] <= 2 * (z_v - z_w).abs().max(dim=1).values).double().mean())
        assert abs(acc_v - acc_w) <= bound + 1e-12, (k, acc_v, acc_w, bound)
        personal_acc.append(acc_v)
        global_acc.append(acc_w)
        bounds.append(bound)
        assert distance(v) < 0.5 * distance(_personal(free)[k]), k  # without the pull it drifts further
    assert len(bounds) == RUN["clients"] and max(bounds) <= 0.05, bounds
    local = pinned.metrics[-1]["local_accuracy"]  # recorded: the mean of the personal accuracies
    assert local == pytest.approx(sum(personal_acc) / len(personal_acc), abs=1e-9)
    assert abs(local - sum(global_acc) / len(global_acc)) <= sum(bounds) / len(bounds) + 1e-12


def test_local_accuracy_uses_the_global_model_for_clients_without_a_personal_model(tmp_path) -> None:
    run = fl.run("ditto", out=tmp_path, **dict(RUN, rounds=1, participation=0.25))
    (participant,) = run.metrics[1]["clients"]
    personal = _personal(run)
    assert sorted(personal) == [participant]
    accs = []
    for k, data in sorted(run.client_test_datasets().items()):
        state = personal[k] if k == participant else run.global_state(1)
        accs.append(_accuracy(run, state, *data.tensors)[0])
    assert len(accs) == RUN["clients"]
    assert run.metrics[1]["local_accuracy"] == pytest.approx(sum(accs) / len(accs), abs=1e-9)


def test_resume_and_same_seed_equal_an_uninterrupted_run(tmp_path) -> None:
    settings = dict(RUN, participation=0.5, momentum=0.5, seed=1)  # clients {0, 3}, {0, 2}, then {1, 2}
    full = fl.run("ditto", out=tmp_path / "full", **settings)

    def stop_after_2(r, record):
        if r == 2:
            raise Stop

    with pytest.raises(Stop):
        fl.run("ditto", out=tmp_path / "cut", on_round=stop_after_2, **settings)
    assert fl.load_run(tmp_path / "cut").rounds == [0, 1, 2]
    seen = []
    resumed = fl.run("ditto", out=tmp_path / "cut", on_round=lambda r, m: seen.append(r), **settings)
    assert seen == [3] and resumed.complete
    again = fl.run("ditto", out=tmp_path / "again", **settings)
    other = fl.run("ditto", out=tmp_path / "other", **dict(settings, seed=2))
    for run in (resumed, again):
        assert _strip(run.metrics) == _strip(full.metrics)
        for r in full.rounds:
            assert _same_states(run.global_state(r), full.global_state(r))
            assert run.client_states(r).keys() == full.client_states(r).keys()
            assert all(_same_states(s, full.client_states(r)[k]) for k, s in run.client_states(r).items())
        mine, theirs = _personal(run), _personal(full)
        assert mine.keys() == theirs.keys() and all(_same_states(mine[k], theirs[k]) for k in mine)
    # clients 0 and 3 trained before the cut and not after: their personal models came through the resume
    assert full.metrics[3]["clients"] == [1, 2] and sorted(_personal(full)) == [0, 1, 2, 3]
    assert [m.get("local_accuracy") for m in other.metrics] != [m.get("local_accuracy") for m in full.metrics]


def test_mnist1d_run_records_local_accuracy(tmp_path) -> None:
    run = fl.run("ditto", dataset="mnist1d", clients=3, rounds=2, local_epochs=1, batch_size=64, seed=0,
                 out=tmp_path, progress=False)
    assert run.complete and run.config["options"] == {"lam": 1.0, "personal_epochs": 1}
    assert run.config["local_test_fraction"] == 0.2  # local test splits, as FLOCO's default
    for m in run.metrics[1:]:
        assert 0.0 <= m["local_accuracy"] <= 1.0 and m["local_loss"] > 0
    assert sorted(_personal(run)) == [0, 1, 2]
