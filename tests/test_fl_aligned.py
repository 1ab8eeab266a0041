"""Aligned averaging (``fedavg_aligned``): FedAvg of clients permuted to match a reference."""
from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import fl
import landscape
from fl.algorithms import aligned, get
from fl.algorithms.averaging import weighted_average
from fl.algorithms.base import ClientUpdate, State
from fl.algorithms.seeds import derive_seed
from fl.models import build_model
from landscape.alignment.graph import discover
from landscape.alignment.permute import permute_state, random_permutations
from landscape.infra.state_aligners import state_aligner

ROOT = Path(__file__).resolve().parents[1]
SIZES = (30, 50, 20)


class RowAttention(nn.Module):
    """Digits as 8 tokens (the image rows), one multi-head attention block with a residual."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 32)
        self.attention = nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.reshape(len(x), 8, 8))
        return self.head((h + self.attention(h, h, h)[0]).mean(1))


class CumulativeMLP(nn.Module):
    """A cumulative sum over hidden units: their order matters, so they cannot be permuted."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(64, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.hidden(x.flatten(1))).cumsum(1))


def mlp(seed: int) -> nn.Module:
    """The MNIST-1D MLP (residual second layer), 16 units wide."""
    return build_model("mnist1d_mlp_w16", num_classes=10, input_shape=(1, 40), seed=seed)


def algorithm(seed: int = 0, input_shape: list[int] | None = None, **options: object):
    """A ``fedavg_aligned`` instance with ``options``, outside a run."""
    cls = get("fedavg_aligned")
    config = {"seed": seed, "input_shape": input_shape or [1, 40]}
    return cls(cls.resolve_options(options, config), config)


def aggregate(alg, template: nn.Module, sent: State, states: list[State], round: int = 1) -> State:
    alg.build_module(template)
    alg.init_server_state(sent)
    updates = {k: ClientUpdate(s, n) for k, (s, n) in enumerate(zip(states, SIZES))}
    return alg.aggregate(sent, updates, {}, round)[0]


def outputs(template: nn.Module, state: State, x: torch.Tensor) -> torch.Tensor:
    model = build_model(template, num_classes=10, input_shape=(1, 40))
    model.load_state_dict(state)
    with torch.no_grad():
        return model.eval()(x)


def test_permuted_copies_average_to_the_global_model_and_fedavg_does_not() -> None:
    template, x = mlp(0), torch.randn(6, 1, 40)
    spec = discover(template, x[:2])
    w = template.state_dict()
    sent = permute_state(w, spec, random_permutations(spec, seed=10))  # the global model: w, permuted
    clients = [permute_state(w, spec, random_permutations(spec, seed=k)) for k in range(3)]
    result = aggregate(algorithm(), template, sent, clients)
    for name in sent:
        torch.testing.assert_close(result[name], sent[name])  # each client mapped onto the global's units
    fedavg = weighted_average(clients, SIZES)
    torch.testing.assert_close(outputs(template, result, x), outputs(template, w, x))
    assert (outputs(template, fedavg, x) - outputs(template, w, x)).abs().max() > 1e-2


def by_hand(template: nn.Module, sent: State, states: list[State], reference: str, passes: int,
            input_shape: tuple[int, ...] = (1, 40)) -> State:
    """The module doc's passes with ``landscape.align`` (round 1, seed 0)."""
    ref = sent if reference == "global" else states[SIZES.index(max(SIZES))]
    for p in range(1, passes + 1):
        permuted = [landscape.align(s, to=ref, template=template, input_shape=input_shape,
                                    seed=derive_seed(0, "fedavg_aligned", 1, k, p)).state_dict()
                    for k, s in enumerate(states)]
        ref = weighted_average(permuted, SIZES, like=sent)
    return ref


def models(case: str) -> list[nn.Module]:
    """Four independent initialisations: the global model's and three clients'."""
    if case == "mlp":
        return [mlp(k) for k in range(4)]
    out = []
    for k in range(4):
        with torch.random.fork_rng():
            torch.manual_seed(k)
            out.append(RowAttention())
    return out


@pytest.mark.parametrize("case, reference, passes", [("mlp", "global", 1), ("mlp", "largest", 1),
                                                     ("mlp", "global", 2), ("attention", "global", 1)])
def test_aligned_average_is_align_then_average(case: str, reference: str, passes: int) -> None:
    template, *clients = models(case)
    shape = (1, 40) if case == "mlp" else (1, 8, 8)
    sent, states = template.state_dict(), [c.state_dict() for c in clients]
    got = aggregate(algorithm(reference=reference, passes=passes, input_shape=list(shape)), template, sent, states)
    expected = by_hand(template, sent, states, reference, passes, shape)
    for name in sent:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6)
    fedavg = weighted_average(states, SIZES)
    moved = [n for n in sent if (got[n] - fedavg[n]).abs().max() > 1e-3]  # units the alignment moved
    assert moved and (case == "mlp" or "attention.in_proj_weight" in moved)


def test_a_pass_that_repeats_the_last_alignment_ends_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    seeds: list[int] = []

    def counting(*args: object, **kwargs: object):
        inner = state_aligner(*args, **kwargs)

        def align(state: State, reference: State, *, seed: int = 0) -> State:
            seeds.append(seed)
            return inner(state, reference, seed=seed)
        return align

    template = mlp(0)
    sent, states = template.state_dict(), [mlp(k).state_dict() for k in (1, 2, 3)]
    monkeypatch.setattr(aligned, "state_aligner", counting)
    many = aggregate(algorithm(passes=20), template, sent, states)
    done = len(seeds) // len(states)
    assert 2 <= done < 20 and len(seeds) == done * len(states)
    last = aggregate(algorithm(passes=done - 1), template, sent, states)  # pass `done` repeated pass done - 1
    assert all(torch.equal(many[n], last[n]) for n in sent)


def test_the_same_seed_gives_the_same_aggregate_and_the_seed_reaches_the_matching() -> None:
    template = mlp(0)
    sent, states = template.state_dict(), [mlp(k).state_dict() for k in (4, 5, 6)]
    a, b = (aggregate(algorithm(seed=7), template, sent, states, round=3) for _ in range(2))
    assert all(torch.equal(a[n], b[n]) for n in sent)
    expected = by_hand(template, sent, states, "global", 1)  # seeds of run seed 0, round 1
    other = aggregate(algorithm(seed=0), template, sent, states, round=1)
    assert all(torch.allclose(other[n], expected[n], atol=1e-6) for n in sent)


def test_fl_run_trains_fedavg_aligned_reproducibly(tmp_path: Path) -> None:
    settings = dict(dataset="digits", clients=3, rounds=2, seed=1, local_epochs=1, progress=False)
    model = models("attention")[0]
    runs = [fl.run("fedavg_aligned", model=copy.deepcopy(model), out=tmp_path / name, **settings) for name in "ab"]
    assert runs[0].complete and runs[0].rounds == [0, 1, 2]
    for r in runs[0].rounds:
        a, b = runs[0].global_state(r), runs[1].global_state(r)
        assert all(torch.equal(a[n], b[n]) for n in a)


def test_a_model_that_cannot_be_aligned_is_refused_before_any_round(tmp_path: Path) -> None:
    trained = []
    with pytest.raises(landscape.ConfigError, match=r"fedavg_aligned \(model CumulativeMLP\): .*cumsum") as err:
        fl.run("fedavg_aligned", model=CumulativeMLP(), dataset="digits", clients=2, rounds=7, out=tmp_path / "run",
               progress=False, on_round=lambda r, record: trained.append(r))
    assert trained == [] and "\n" not in str(err.value)
    assert not list((tmp_path / "run").rglob("*.safetensors"))  # not even round 0


def test_frozen_parameters_are_refused(tmp_path: Path) -> None:
    model = RowAttention()
    model.embed.requires_grad_(False)
    with pytest.raises(landscape.ConfigError, match=r"frozen parameters \(embed\.bias, \.\.\.\)"):
        fl.run("fedavg_aligned", model=model, dataset="digits", clients=2, rounds=1, out=tmp_path / "run",
               progress=False)


def test_fl_run_loads_the_alignment_itself_and_import_fl_stays_light(tmp_path: Path) -> None:
    code = ("import sys, fl\n"
            "print(any(m.startswith('landscape.alignment') for m in sys.modules))\n"
            f"run = fl.run('fedavg_aligned', dataset='digits', clients=2, rounds=1, out={str(tmp_path / 'r')!r}, "
            "progress=False)\n"
            "print(len(run.metrics), any(m.startswith('landscape.alignment') for m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.splitlines() == ["False", "2 True"]
