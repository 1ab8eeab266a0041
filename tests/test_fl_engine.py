"""The FL round loop.

Determinism from the seed, resume after an interruption equals an uninterrupted run bit
for bit, configuration checks, client sampling, and the CLI.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import fl
from fl.cli import main
from fl.engine import sample_clients
from fl.store import RunDivergedError
from landscape.infra.errors import ConfigError

TINY = dict(dataset="digits", clients=4, rounds=3, batch_size=64, lr=0.1, progress=False)


class Stop(Exception):
    pass


def _same_checkpoints(a: fl.Run, b: fl.Run) -> bool:
    """Every stored global, client and algorithm state is bit-identical."""
    if a.rounds != b.rounds:
        return False
    for r in a.rounds:
        pairs = [(a.global_state(r), b.global_state(r)), (a.algorithm_state(r), b.algorithm_state(r))]
        ca, cb = a.client_states(r), b.client_states(r)
        if ca.keys() != cb.keys():
            return False
        pairs += [(ca[k], cb[k]) for k in ca]
        for x, y in pairs:
            if x.keys() != y.keys() or not all(torch.equal(x[n], y[n]) for n in x):
                return False
    return True


def test_same_seed_identical_different_seed_differs(tmp_path):
    opts = dict(TINY, participation=0.5, rounds=2)
    a = fl.run("fedavg", seed=1, out=tmp_path / "a", **opts)
    b = fl.run("fedavg", seed=1, out=tmp_path / "b", **opts)
    c = fl.run("fedavg", seed=2, out=tmp_path / "c", **opts)
    assert _same_checkpoints(a, b)
    assert [m["test_loss"] for m in a.metrics] == [m["test_loss"] for m in b.metrics]
    assert not torch.equal(a.global_state(0)["classifier.weight"], c.global_state(0)["classifier.weight"])
    assert not torch.equal(a.global_state(2)["classifier.weight"], c.global_state(2)["classifier.weight"])


def test_global_rng_untouched(tmp_path):
    torch_state, np_state = torch.random.get_rng_state(), np.random.get_state()
    fl.run("fedprox", out=tmp_path, **dict(TINY, rounds=1))
    assert torch.equal(torch.random.get_rng_state(), torch_state)
    new = np.random.get_state()
    assert new[0] == np_state[0] and np.array_equal(new[1], np_state[1]) and new[2:] == np_state[2:]


@pytest.mark.parametrize("algorithm,options", [("ima", dict(window=2, start_round=2, momentum=0.5)),
                                               ("fedprox", dict(mu=0.1, participation=0.5))])
def test_resume_after_interruption_equals_uninterrupted(tmp_path, algorithm, options):
    full = fl.run(algorithm, out=tmp_path / "full", **TINY, **options)

    def stop_after_2(r, record):
        if r == 2:
            raise Stop

    with pytest.raises(Stop):
        fl.run(algorithm, out=tmp_path / "cut", on_round=stop_after_2, **TINY, **options)
    cut = fl.load_run(tmp_path / "cut")
    assert cut.rounds == [0, 1, 2] and not cut.complete
    # leftovers of a round that was being written when the process died
    store = cut.store
    store.global_path(3).write_bytes(b"half-written")
    store.append_metrics({"round": 3, "test_loss": 9.0, "test_accuracy": 0.5})
    assert [m["round"] for m in cut.metrics] == [0, 1, 2]  # round 3 is not complete
    seen = []
    resumed = fl.run(algorithm, out=tmp_path / "cut", on_round=lambda r, m: seen.append(r), **TINY, **options)
    assert seen == [3]
    assert resumed.complete and _same_checkpoints(resumed, full)
    strip = lambda ms: [{k: v for k, v in m.items() if k != "time"} for m in ms]  # noqa: E731
    assert strip(resumed.metrics) == strip(full.metrics)


def test_finished_run_is_reopened_not_retrained(tmp_path):
    fl.run("fedavg", out=tmp_path, **dict(TINY, rounds=1))
    calls = []
    again = fl.run("fedavg", out=tmp_path, on_round=lambda r, m: calls.append(r), **dict(TINY, rounds=1))
    assert calls == [] and again.complete and again.rounds == [0, 1]


def test_different_config_in_existing_dir_is_rejected(tmp_path):
    fl.run("fedavg", out=tmp_path, **dict(TINY, rounds=1))
    with pytest.raises(ConfigError, match="lr: stored 0.1, requested 0.2"):
        fl.run("fedavg", out=tmp_path, **dict(TINY, rounds=1, lr=0.2))
    with pytest.raises(ConfigError, match="algorithm"):
        fl.run("fedprox", out=tmp_path, **dict(TINY, rounds=1))


def test_unrelated_folder_is_rejected(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not an FL run directory"):
        fl.run("fedavg", out=tmp_path, **TINY)


def test_unknown_options_and_bad_values(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown option\(s\) beta .*valid options: .*momentum"):
        fl.run("fedavg", beta=0.1, out=tmp_path, **TINY)
    with pytest.raises(ConfigError, match="mu"):
        fl.run("fedavg", mu=0.1, out=tmp_path, **TINY)  # FedProx's option is not FedAvg's
    with pytest.raises(ConfigError, match="unknown algorithm 'fedsgd'.*fedavg"):
        fl.run("fedsgd", out=tmp_path, **TINY)
    for bad in (dict(participation=0.0), dict(clients=0), dict(lr=-1.0), dict(save_clients="some")):
        with pytest.raises(ConfigError):
            fl.run("fedavg", out=tmp_path, **{**TINY, **bad})
    assert not (tmp_path / "config.json").exists()


def test_client_sampling():
    picked = sample_clients(0, 1, 10, 0.3)
    assert picked == sorted(set(picked)) and len(picked) == 3 and all(0 <= k < 10 for k in picked)
    assert picked == sample_clients(0, 1, 10, 0.3)
    rounds = {tuple(sample_clients(0, r, 10, 0.3)) for r in range(1, 20)}
    assert len(rounds) > 5  # differs from round to round
    assert sample_clients(0, 1, 10, 1.0) == list(range(10))
    assert len(sample_clients(0, 1, 10, 0.01)) == 1
    counts = np.bincount(np.concatenate([sample_clients(0, r, 10, 0.3) for r in range(1, 2001)]), minlength=10)
    assert np.all(np.abs(counts / 2000 - 0.3) < 0.04)  # uniform without replacement


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--option" in out and "--algorithm" in out and "--rounds" in out


def test_cli_tiny_run_and_errors(tmp_path, capsys):
    out = tmp_path / "cli"
    code = main(["--algorithm", "fedprox", "--rounds", "1", "--clients", "3", "--batch-size", "64",
                 "--option", "mu=0.5", "-o", "save_clients=\"last\"", "--no-progress", "--out", str(out)])
    assert code == 0
    config = json.loads((out / "config.json").read_text())
    assert config["options"] == {"mu": 0.5} and config["save_clients"] == "last" and config["clients"] == 3
    printed = capsys.readouterr().out
    assert str(out) in printed
    assert f"{out}: {fl.load_run(out).convergence()}" in printed  # whether the run stopped improving
    assert fl.load_run(out).client_states(1).keys() == {0, 1, 2}
    code = main(["--algorithm", "fedavg", "-o", "bogus=1", "--out", str(tmp_path / "x"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "bogus" in err and err.startswith("fl-run: error:")
    assert main(["--list-algorithms"]) == 0
    assert "fedprox: mu=0.01" in capsys.readouterr().out


def test_custom_module_model(tmp_path):
    from torch import nn

    def make(seed: int) -> nn.Module:
        gen = torch.Generator().manual_seed(seed)
        net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        with torch.no_grad():
            for p in net.parameters():
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        return net

    net = make(0)
    run = fl.run("fedavg", model=net, out=tmp_path, **dict(TINY, rounds=1))
    assert run.config["model"] == "custom:Sequential"
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in run.global_state(0).items())
    run.module().load_state_dict(run.global_state())
    with pytest.raises(ConfigError, match="custom model"):
        fl.load_run(tmp_path).module()
    fl.load_run(tmp_path, module=net).module().load_state_dict(run.global_state())
    with pytest.raises(ConfigError, match="model_digest"):
        fl.run("fedavg", model=make(1), out=tmp_path, **dict(TINY, rounds=1))


def test_a_round_of_empty_clients_keeps_the_global_model(tmp_path):
    """min_size=0 partitions can give a round whose participants hold no samples.

    FedAvg's weights are then all zero, the round carries no information and the model is
    kept.
    """
    run = fl.run("fedavg", clients=3, rounds=3, participation=0.34, partition="iid", seed=0,
                 out=tmp_path, device="cpu", model="mlp",
                 partition_options={"client_sizes": [0, 0, 500], "min_size": 0})
    participants = [m["clients"] for m in run.metrics[1:]]
    assert participants == [[1], [2], [1]]  # seed 0: empty, with data, empty
    states = [run.global_state(r) for r in range(4)]
    for before, after, changed in ((0, 1, False), (1, 2, True), (2, 3, False)):
        same = all(torch.equal(states[before][k], states[after][k]) for k in states[before])
        assert same != changed, (before, after)


def test_a_diverging_run_stops_at_the_round_and_stays_resumable(tmp_path):
    """A model whose logits are cubed overflows after one step at lr 10.

    The round is not stored, the run is not complete, and a rerun stops at the same round
    again.
    """
    from torch import nn

    class Cube(nn.Module):
        def forward(self, x):
            return x ** 3

    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10), Cube())
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(0.1)
    opts = dict(TINY, rounds=3, clients=2, device="cpu")
    for _ in range(2):
        with pytest.raises(RunDivergedError, match=r"diverged in round 1: non-finite values in .*keeps rounds 0\.\.0"):
            fl.run("fedavg", model=net, out=tmp_path, **{**opts, "lr": 10.0})
        run = fl.load_run(tmp_path, module=net)
        assert run.rounds == [0] and not run.complete and [m["round"] for m in run.metrics] == [0]
    with torch.no_grad():
        net[1].weight[0, 0] = float("inf")
    with pytest.raises(RunDivergedError, match="diverged in round 0: non-finite values in 1.weight"):
        fl.run("fedavg", model=net, out=tmp_path / "inf", **opts)
