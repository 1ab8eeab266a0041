"""The vectorised FL back end (fl.vectorized) against the sequential one.

Same client models and losses to floating-point tolerance for clients of different sizes,
through fl.run too, and clear refusals where padding would change the result.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import fl
from fl.algorithms.base import LocalContext, make_generator
from fl.api import build_config
from fl.vectorized import train_clients, unsupported_reason
from landscape.infra.errors import ConfigError

from conftest import float32_tolerance


def _mlp(seed: int = 0) -> nn.Module:
    gen = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.Tanh(), nn.Linear(8, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model


def _algorithm(name: str, **options):
    base = dict(dataset="digits", model=None, clients=4, rounds=1, participation=1.0, local_epochs=2,
                batch_size=5, lr=0.1, partition="iid", alpha=0.5, seed=0, device="cpu")
    return build_config(name, options=options, **base)[1]


def _contexts(module: nn.Module, sizes: list[int], *, momentum: float, weight_decay: float,
              epochs: int = 2, batch_size: int = 5) -> list[LocalContext]:
    gen = torch.Generator().manual_seed(1)
    start = {k: v.clone() for k, v in module.state_dict().items()}
    out = []
    for k, n in enumerate(sizes):
        x = torch.randn(n, 12, generator=gen)
        y = torch.randint(0, 3, (n,), generator=gen)
        out.append(LocalContext(
            round=1, client=k, global_state=start, server_state={}, client_state={}, x=x, y=y,
            generator=make_generator(7, "client", 1, k), lr=0.2, local_epochs=epochs,
            batch_size=batch_size, momentum=momentum, weight_decay=weight_decay, module=module,
            options={}, config={}, device=torch.device("cpu"), num_classes=3))
    return out


@pytest.mark.parametrize("algorithm,options,momentum,weight_decay", [
    ("fedavg", {}, 0.0, 0.0), ("fedavg", {}, 0.9, 0.01), ("fedprox", {"mu": 0.5}, 0.5, 0.0)])
def test_train_clients_equals_sequential_for_unequal_clients(algorithm, options, momentum, weight_decay):
    # sizes: several epochs of short last batches, a client smaller than one batch, an empty
    # client, and a client with many more steps than the others
    sizes = [13, 3, 0, 10, 27]
    module = _mlp()
    alg = _algorithm(algorithm, **options)
    sequential = {c.client: alg.client_update(c)
                  for c in _contexts(module, sizes, momentum=momentum, weight_decay=weight_decay)}
    vectorised = train_clients(alg, _contexts(module, sizes, momentum=momentum, weight_decay=weight_decay))
    assert sorted(vectorised) == sorted(sequential) == list(range(len(sizes)))
    start = module.state_dict()
    # a short training run: each of up to 2 epochs x 6 batches rounds the forward's dot products (fan-ins 12
    # and 8), the sum over a batch of 5 and the update's 3 terms (gradient, momentum, decay or proximal term)
    # otherwise; to first order the steps' relative errors add
    tol = 2 * 6 * float32_tolerance(12 + 8 + 5 + 3)
    for k, upd in sequential.items():
        vec = vectorised[k]
        assert vec.num_samples == upd.num_samples == sizes[k]
        assert vec.metrics["train_loss"] == pytest.approx(upd.metrics["train_loss"], rel=tol, abs=0)
        for name, t in upd.state.items():
            torch.testing.assert_close(vec.state[name], t, rtol=tol, atol=tol * float(t.abs().max()))
        moved = any(not torch.equal(upd.state[n], start[n]) for n in start)
        assert moved == (sizes[k] > 0)  # the empty client keeps the received model exactly
    # the clients really differ from one another (a shared update would pass the checks above
    # only if every client had the same data)
    assert not torch.allclose(vectorised[0].state["1.weight"], vectorised[3].state["1.weight"])


def test_fl_run_backends_agree(tmp_path):
    opts = dict(dataset="digits", clients=4, rounds=2, batch_size=32, lr=0.1, momentum=0.5,
                partition="dirichlet", alpha=0.3, progress=False, device="cpu", save_clients="all")
    seq = fl.run("fedavg", out=tmp_path / "s", backend="sequential", **opts)
    vec = fl.run("fedavg", out=tmp_path / "v", backend="vectorized", **opts)
    assert vec.config["backend"] == "vectorized"
    sizes = [len(d) for d in seq.client_datasets().values()]
    assert len(set(sizes)) > 1  # the Dirichlet split gives clients of different sizes
    for r in (1, 2):
        a, b = seq.global_state(r), vec.global_state(r)
        for name in a:
            torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-5)
        for k, state in seq.client_states(r).items():
            other = vec.client_states(r)[k]
            for name in state:
                torch.testing.assert_close(other[name], state[name], rtol=1e-4, atol=1e-5)
    for ms, mv in zip(seq.metrics, vec.metrics):
        assert mv["test_loss"] == pytest.approx(ms["test_loss"], rel=1e-4)
    # the back end is a runtime choice: the same directory resumes with the other one
    again = fl.run("fedavg", out=tmp_path / "v", backend="sequential", **opts)
    assert again.path == vec.path


def test_unsupported_cases_are_refused():
    fedavg = _algorithm("fedavg")
    assert unsupported_reason(fedavg, _mlp()) is None
    assert unsupported_reason(_algorithm("ima", window=2, start_round=1), _mlp()) is None
    bn = nn.Sequential(nn.Linear(12, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    assert "BatchNorm" in unsupported_reason(fedavg, bn)
    drop = nn.Sequential(nn.Linear(12, 8), nn.Dropout(0.5), nn.Linear(8, 3))
    assert "dropout" in unsupported_reason(fedavg, drop)
    assert unsupported_reason(fedavg, nn.Sequential(nn.Linear(12, 3), nn.Dropout(0.0))) is None
    mixed = nn.Sequential(nn.Linear(12, 8), nn.Linear(8, 3).double())
    assert "several dtypes" in unsupported_reason(fedavg, mixed)
    assert "does not declare vectorizable" in unsupported_reason(_algorithm("fedgucci"), _mlp())
    # the flag of a wrapper is its base's
    assert unsupported_reason(_algorithm("fedprox", ima={"window": 2}), _mlp()) is None
    assert "'ima on lss'" in unsupported_reason(_algorithm("lss", ima=True), _mlp())


def test_vectorizable_flag_is_reset_by_an_own_client_update():
    from fl.algorithms.base import ClientUpdate
    from fl.algorithms.fedprox import FedProx

    class Custom(FedProx):  # no name: not registered
        def client_update(self, ctx):
            return ClientUpdate(dict(ctx.global_state), len(ctx.y))

    class Declared(Custom):
        vectorizable = True

    assert FedProx.vectorizable and not Custom.vectorizable and Declared.vectorizable


def test_fl_run_rejects_bad_backend_and_unsupported_algorithm(tmp_path):
    opts = dict(dataset="digits", clients=2, rounds=1, progress=False, device="cpu")
    with pytest.raises(ConfigError, match="backend must be one of"):
        fl.run("fedavg", out=tmp_path / "a", backend="gpu", **opts)
    with pytest.raises(ConfigError, match="vectorized back end cannot train.*sequential"):
        fl.run("lss", out=tmp_path / "b", backend="vectorized", **opts)


def test_auto_backend_rule_and_run(tmp_path):
    """The auto rule, and an auto run of the digits MLP on the CPU equal to the vectorized one.

    Sequential for a CPU convolution or an unsupported algorithm, vectorized for an MLP or
    on a GPU; the two runs agree bit for bit.
    """
    from fl.models import build_model
    from fl.vectorized import choose_backend

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    cnn = build_model("fedgucci_cnn", num_classes=10, input_shape=(3, 32, 32), seed=0)
    assert choose_backend(_algorithm("fedavg"), _mlp(), cpu)[0] == "vectorized"
    assert choose_backend(_algorithm("fedavg"), cnn, cuda)[0] == "vectorized"
    backend, why = choose_backend(_algorithm("fedavg"), cnn, cpu)
    assert backend == "sequential" and "convolution" in why
    backend, why = choose_backend(_algorithm("fedgucci"), _mlp(), cuda)
    assert backend == "sequential" and "vectorizable" in why
    opts = dict(dataset="digits", clients=5, rounds=2, seed=3, save_clients="none", progress=False, device="cpu")
    auto = fl.run("fedavg", out=tmp_path / "a", backend="auto", **opts)
    vec = fl.run("fedavg", out=tmp_path / "v", backend="vectorized", **opts)
    for a, v in zip(auto.metrics, vec.metrics):
        assert a["test_loss"] == v["test_loss"]
    assert [m.get("backend") for m in auto.metrics] == [None, "vectorized", "vectorized"]  # recorded per round
    assert all("backend" not in m for m in vec.metrics)
