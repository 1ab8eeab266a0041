"""FedAvg, FedProx and IMA.

Stored global models are the documented functions of the stored client models,
FedProx(mu=0) is FedAvg, IMA's model is the mean of its stored window, the local SGD equals
torch.optim.SGD, and the IMA learning-rate schedules match §3.3.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

import fl
from fl.algorithms.base import ClientUpdate, LocalContext, local_sgd, make_generator, minibatches, weighted_average
from fl.algorithms.fedprox import FedProx
from fl.algorithms.ima import IMA
from fl.algorithms.proximal import proximal_term
from landscape.infra.errors import ConfigError

from conftest import float32_tolerance

TINY = dict(dataset="digits", clients=4, rounds=2, batch_size=64, lr=0.1, progress=False)


def _equal_states(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _reference_average(states: list[dict], weights: list[float]) -> dict:
    """Independent float64 weighted average, summed in the given order."""
    total = sum(weights)
    out = {}
    for name, t in states[0].items():
        acc = torch.zeros(t.shape, dtype=torch.float64)
        for w, s in zip(weights, states):
            acc = acc + (w / total) * s[name].double()
        out[name] = acc.to(t.dtype)
    return out


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory):
    return fl.run("fedavg", participation=0.75, out=tmp_path_factory.mktemp("fedavg"), **TINY)


def test_fedavg_global_is_data_size_weighted_average(fedavg_run):
    sizes = {k: len(ds) for k, ds in fedavg_run.client_datasets().items()}
    assert len(set(sizes.values())) > 1  # Dirichlet sizes differ, so the weights matter
    for r in (1, 2):
        clients = fedavg_run.client_states(r)
        assert sorted(clients) == fedavg_run.metrics[r]["clients"] and len(clients) == 3
        ids = sorted(clients)
        expected = _reference_average([clients[k] for k in ids], [sizes[k] for k in ids])
        assert _equal_states(fedavg_run.global_state(r), expected)
        uniform = _reference_average([clients[k] for k in ids], [1.0] * len(ids))
        assert not _equal_states(fedavg_run.global_state(r), uniform)


def test_client_model_is_sgd_from_previous_global(fedavg_run):
    """Re-train a round-2 client independently.

    nn.Module + torch.optim.SGD from global(1) on the client's data, batches from the
    documented seed (seed, "client", round, client).
    """
    datasets = fedavg_run.client_datasets()
    for k, stored in fedavg_run.client_states(2).items():
        model = fedavg_run.module()
        model.load_state_dict(fedavg_run.global_state(1))
        x, y = datasets[k].tensors
        cfg = fedavg_run.config
        opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"],
                              weight_decay=cfg["weight_decay"])
        model.train()
        for idx in minibatches(len(y), TINY["batch_size"], cfg["local_epochs"], make_generator(0, "client", 2, k)):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        for name, ref in model.state_dict().items():
            # the engine's forward, loss and torch.optim.SGD's update ops on the same tensors in the same order
            assert torch.equal(stored[name], ref), (k, name)


def test_fedprox_mu0_equals_fedavg_bit_for_bit(fedavg_run, tmp_path):
    prox = fl.run("fedprox", mu=0.0, participation=0.75, out=tmp_path / "prox", **TINY)
    for r in (0, 1, 2):
        assert _equal_states(prox.global_state(r), fedavg_run.global_state(r))
    for r in (1, 2):
        a, b = prox.client_states(r), fedavg_run.client_states(r)
        assert a.keys() == b.keys() and all(_equal_states(a[k], b[k]) for k in a)


def test_fedprox_keeps_clients_closer_to_global(tmp_path):
    common = dict(TINY, rounds=1, local_epochs=3, lr=0.3)
    avg = fl.run("fedavg", out=tmp_path / "a", **common)
    prox = fl.run("fedprox", mu=1.0, out=tmp_path / "p", **common)
    g0 = avg.global_state(0)

    def dist(run):
        return {k: float(sum(((s[n] - g0[n]) ** 2).sum() for n in s)) for k, s in run.client_states(1).items()}

    da, dp = dist(avg), dist(prox)
    assert all(dp[k] < da[k] for k in da)


def test_proximal_term_value_and_gradient():
    alg = FedProx(FedProx.resolve_options({"mu": 0.3}, {}), {"seed": 0})
    g = {"w": torch.tensor([1.0, -2.0]), "b": torch.tensor([0.5])}
    w = {"w": torch.tensor([2.0, 0.0], requires_grad=True), "b": torch.tensor([0.5], requires_grad=True)}

    class Ctx:
        global_state = g

    term = alg.extra_loss(Ctx(), w, None, None, None)
    # differences and squares of small integers are exact: only mu / 2 in float32 and the product round
    assert term.item() == pytest.approx(0.5 * 0.3 * (1 + 4), rel=float32_tolerance(2, sides=1), abs=0)
    grads = torch.autograd.grad(term, [w["w"], w["b"]])
    # autograd's and the reference's float32 products of a rounded mu with exact differences: 2 roundings each
    torch.testing.assert_close(grads[0], 0.3 * (w["w"] - g["w"]), rtol=float32_tolerance(2), atol=0)
    assert torch.equal(grads[1], torch.zeros(1))
    with pytest.raises(ConfigError, match="mu"):
        FedProx.resolve_options({"mu": -1}, {})


def _ctx(module, x, y, *, lr=0.1, momentum=0.9, wd=1e-3, epochs=2, batch=16, seed=3):
    state = {k: v.clone() for k, v in module.state_dict().items()}
    return LocalContext(round=1, client=0, global_state=state, server_state={}, client_state={}, x=x, y=y,
                        generator=make_generator(seed), lr=lr, local_epochs=epochs, batch_size=batch,
                        momentum=momentum, weight_decay=wd, module=module, options={}, config={},
                        device=torch.device("cpu"), num_classes=10)


def test_local_sgd_matches_torch_optim_sgd_with_batchnorm():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 6, generator=gen), torch.randint(0, 10, (40,), generator=gen)
    torch_gen = torch.Generator().manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 10))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=torch_gen))
    template = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 10))
    template.load_state_dict(model.state_dict())
    ctx = _ctx(template, x, y)
    result = local_sgd(ctx)
    # reference: the module itself with torch.optim.SGD on the same mini-batches
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    model.train()
    losses = []
    for idx in minibatches(40, 16, 2, make_generator(3)):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        losses.append(loss.item() * len(idx))
    # local_sgd runs the module's forward, the loss and torch.optim.SGD's update ops in the same order
    for name, ref in model.state_dict().items():
        assert torch.equal(result.state[name], ref), name
    assert result.loss == sum(losses) / (2 * 40)  # the same float32 losses summed in float64 in the same order
    assert int(result.state["1.num_batches_tracked"]) == 6  # 3 batches x 2 epochs
    for name, p in model.named_parameters():
        assert torch.equal(result.momentum[name], opt.state[p]["momentum_buffer"]), name


@pytest.mark.parametrize("coef", [1.0, 0.3])
def test_local_sgd_proximal_gradient_equals_autograd_of_the_term(coef):
    """``proximal=(anchor, c)`` adds ``c (w - anchor)`` to the gradient: autograd's step on the term, bit for bit."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 6, generator=gen), torch.randint(0, 10, (40,), generator=gen)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 10))
    anchor = {k: v + 0.1 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}
    direct = local_sgd(_ctx(model, x, y), proximal=(anchor, coef))
    graph = local_sgd(_ctx(model, x, y), extra_loss=lambda params, *_: proximal_term(params, anchor, coef))
    for name, ref in graph.state.items():
        assert torch.equal(direct.state[name], ref), name
    assert direct.loss == graph.loss  # the data loss only, in both
    plain = local_sgd(_ctx(model, x, y))
    assert not torch.equal(plain.state["0.weight"], direct.state["0.weight"])  # the term acts


def test_local_sgd_leaves_the_module_as_it_was_also_after_an_error():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 6, generator=gen), torch.randint(0, 10, (40,), generator=gen)
    template = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 10))
    own = template.state_dict(keep_vars=True)
    values = {n: t.detach().clone() for n, t in own.items()}
    start = {n: t + 0.5 for n, t in values.items()}  # the client starts elsewhere than the template
    result = local_sgd(dataclasses.replace(_ctx(template, x, y), global_state=start))

    def failing(params, x, y, logits):
        raise RuntimeError("extra loss failed")

    with pytest.raises(RuntimeError, match="extra loss failed"):
        local_sgd(_ctx(template, x, y), extra_loss=failing)
    after = template.state_dict(keep_vars=True)
    for name, t in own.items():
        assert after[name] is t and torch.equal(t, values[name]), name  # the same objects, unchanged
    assert not any(torch.equal(result.state[n], values[n]) for n in ("0.weight", "3.bias"))


def test_local_sgd_on_tied_weights_trains_the_shared_tensor_once():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 10, (40,), generator=gen), torch.randint(0, 10, (40,), generator=gen)
    embed, head = nn.Embedding(10, 10), nn.Linear(10, 10, bias=False)
    head.weight = embed.weight  # a language model's tied input and output embeddings
    model = nn.Sequential(embed, head)
    start = {n: t.detach().clone() for n, t in model.state_dict().items()}
    result = local_sgd(dataclasses.replace(_ctx(model, x, y), global_state=start))
    # reference: the tied module itself under torch.optim.SGD (one parameter, both uses' gradients summed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    for idx in minibatches(40, 16, 2, make_generator(3)):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    torch.testing.assert_close(result.state["0.weight"], model[0].weight.detach(), rtol=1e-6, atol=1e-7)


def test_weighted_average_values_and_integer_buffers():
    a = {"w": torch.tensor([0.0, 4.0]), "n": torch.tensor(10)}
    b = {"w": torch.tensor([3.0, 1.0]), "n": torch.tensor(13)}
    avg = weighted_average([a, b], [1, 2])
    assert torch.equal(avg["w"], torch.tensor([2.0, 2.0]))
    assert avg["n"].dtype == torch.int64 and int(avg["n"]) == 12
    with pytest.raises(ConfigError):
        weighted_average([a, b], [0, 0])


# --------------------------------------------------------------------------- IMA
@pytest.fixture(scope="module")
def ima_run(tmp_path_factory):
    return fl.run("ima", window=2, start_round=2, out=tmp_path_factory.mktemp("ima"), **dict(TINY, rounds=4))


def _window(state: dict) -> list[dict]:
    n = len(state["ima.rounds"])
    out = [{} for _ in range(n)]
    for key, v in state.items():
        if key.startswith("ima.window."):
            i, name = key[len("ima.window."):].split(".", 1)
            out[int(i)][name] = v
    return out


def test_ima_model_is_mean_of_stored_window(ima_run):
    sizes = {k: len(ds) for k, ds in ima_run.client_datasets().items()}
    for r in (1, 2, 3, 4):
        state = ima_run.algorithm_state(r)
        window = _window(state)
        assert state["ima.rounds"].tolist() == list(range(max(1, r - 1), r + 1))
        clients = ima_run.client_states(r)
        ids = sorted(clients)
        plain = _reference_average([clients[k] for k in ids], [sizes[k] for k in ids])
        assert _equal_states(window[-1], plain)  # newest entry: the plain aggregate of round r
        glob = ima_run.global_state(r)
        if r < 2:
            assert _equal_states(glob, plain)
        else:
            assert _equal_states(glob, _reference_average(window, [1.0] * len(window)))
            assert not _equal_states(glob, plain)
        if r >= 2:
            assert _equal_states(window[0], _window(ima_run.algorithm_state(r - 1))[-1])


def test_ima_metrics_report_plain_aggregate_during_ima(ima_run):
    m = ima_run.metrics
    assert "fma_test_accuracy" not in m[1] and "fma_test_accuracy" in m[2]
    assert m[3]["lr"] == pytest.approx(0.1 * 0.97)  # exp decay from start round 2


def test_ima_window1_without_decay_is_fedavg(fedavg_run, tmp_path):
    ima = fl.run("ima", window=1, start_round=1, schedule="none", participation=0.75, out=tmp_path, **TINY)
    for r in (0, 1, 2):
        assert _equal_states(ima.global_state(r), fedavg_run.global_state(r))


def test_ima_learning_rate_schedules():
    config = {"seed": 0, "lr": 0.01, "lr_decay": 0.01, "rounds": 400, "local_epochs": 5}

    def make(**opts):
        return IMA(IMA.resolve_options(opts, config), config)

    exp = make()
    assert exp.start == 301  # paper t_s = 0.75 R (0-based) is our round 301
    assert exp.lr(1) == pytest.approx(0.01)
    assert exp.lr(300) == pytest.approx(0.01 * 0.99 ** 299)
    assert exp.lr(301) == pytest.approx(0.01 * 0.99 ** 300)  # ~4.90e-4 (IMA Sec. 3.3, docs/methods/ima.md)
    assert exp.lr(301) == pytest.approx(4.90e-4, rel=1e-3)
    assert exp.lr(400) == pytest.approx(0.01 * 0.99 ** 300 * 0.97 ** 99)
    assert make(schedule="const").lr(350) == 5e-5
    cyc = make(schedule="cyclic")
    assert cyc.lr(301) == pytest.approx(0.95 * 1e-2 + 0.05 * 5e-5)
    assert cyc.lr(320) == pytest.approx(5e-5) and cyc.lr(321) == cyc.lr(301)
    assert make(schedule="cyclic", cycle_max=None).lr(301) == pytest.approx(
        0.95 * 0.01 * 0.99 ** 300 + 0.05 * 5e-5)
    ep = make(schedule="epoch")
    assert [ep.local_epochs(r) for r in (300, 301, 321, 361, 381, 400)] == [5, 5, 4, 2, 1, 1]
    assert ep.lr(350) == pytest.approx(0.01 * 0.99 ** 349)
    assert make(schedule="none").lr(350) == pytest.approx(0.01 * 0.99 ** 349)
    with pytest.raises(ConfigError, match="schedule"):
        make(schedule="cosine")
    with pytest.raises(ConfigError, match="window"):
        make(window=0)


def test_ima_on_top_of_fedprox(tmp_path):
    run = fl.run("fedprox", mu=0.1, ima={"window": 2, "start_round": 1}, out=tmp_path, **TINY)
    assert run.config["ima"]["window"] == 2 and run.config["options"] == {"mu": 0.1}
    window = _window(run.algorithm_state(2))
    assert _equal_states(run.global_state(2), _reference_average(window, [1.0, 1.0]))
    with pytest.raises(ConfigError, match="unknown ima option 'windw' \\(did you mean 'window'\\?\\)"):
        fl.run("fedprox", ima={"windw": 2}, out=tmp_path / "x", **TINY)
    with pytest.raises(ConfigError, match="already"):
        fl.run("ima", ima=True, out=tmp_path / "y", **TINY)


def test_default_start_round_is_three_quarters():
    config = {"seed": 0, "lr": 0.05, "lr_decay": 0.0, "rounds": 20, "local_epochs": 1}
    assert IMA.resolve_options({}, config)["start_round"] == 16
    assert math.floor(0.75 * 20) + 1 == 16


def test_client_update_contract_default_counts_samples():
    module = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    x, y = torch.randn(10, 4), torch.arange(10) % 3
    update = FedProx({"mu": 0.0}, {"seed": 0}).client_update(_ctx(module, x, y, momentum=0.0, wd=0.0))
    assert isinstance(update, ClientUpdate) and update.num_samples == 10
    assert set(update.state) == set(module.state_dict()) and "train_loss" in update.metrics
