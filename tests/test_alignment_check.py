"""``check_alignment`` / ``landscape align --check``: a random permutation of the traced groups keeps the outputs."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from torch import nn

import landscape
from landscape import AlignmentCheck, check_alignment
from landscape.alignment.check import ROUNDING_EPSILONS, moving_permutations
from landscape.alignment.graph import discover
from landscape.alignment.permute import apply_permutation
from landscape.alignment.spec import Group, PermutationSpec
from landscape_cli.main import main

EPS32 = float(torch.finfo(torch.float32).eps)


def _randomise(model: nn.Module, seed: int) -> nn.Module:
    """Random values in every floating tensor (positive variances), so that no tensor is invariant to permutations.

    A fresh model has zero biases, unit norm weights and zero running means: leaving one of them out of its
    group would change nothing, and the planted bugs below would pass unseen.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if t.is_floating_point():
                fresh = torch.randn(t.shape, generator=gen) * 0.5
                t.copy_(fresh.abs() + 0.5 if name.endswith("running_var") else fresh)
    return model.eval()


class BatchNormCNN(nn.Module):
    def __init__(self, groups: int = 0) -> None:
        """BatchNorm after each convolution, or GroupNorm of ``groups`` groups."""
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.GroupNorm(groups, 4) if groups else nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 6, 3, stride=2)
        self.bn2 = nn.GroupNorm(groups, 6) if groups else nn.BatchNorm2d(6)
        self.fc = nn.Linear(6 * 3 * 3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x)))
        return self.fc(torch.relu(self.bn2(self.conv2(h))).flatten(1))


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(5, 8)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 12), nn.GELU(), nn.Linear(12, 8))
                                    for _ in range(2))
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.out(h)


class Reused(nn.Module):
    """One square layer applied twice: its output units are also its input features, those of the data."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(6, 6)
        self.out = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.layer(torch.relu(self.layer(x)))))


class PositionBuffer(nn.Module):
    """Token embeddings plus a sinusoidal-like position table kept outside the state_dict."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.register_buffer("position", torch.randn(5, 8, generator=torch.Generator().manual_seed(0)),
                             persistent=False)
        self.hidden = nn.Linear(8, 16)
        self.out = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(self.embed(x) + self.position)))


def _gpt2(seed: int = 0) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=8, bos_token_id=0, eos_token_id=0)).eval()


def _mlp() -> nn.Module:
    return _randomise(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)), 0)


def _outputs(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(x)
    return getattr(out, "logits", out)


def _named_everywhere(check: AlignmentCheck) -> set[str]:
    named = {m["name"] for g in check.groups for m in g["members"]}
    return named | {e["name"] for e in check.unpermutable + check.fixed} | set(check.tied)


@pytest.mark.parametrize("case", ["mlp", "bn_cnn", "gn_cnn", "residual", "gpt2"])
def test_a_correct_spec_keeps_the_outputs_within_the_rounding_tolerance(case: str) -> None:
    gen = torch.Generator().manual_seed(1)
    model, x = {"mlp": lambda: (_mlp(), torch.randn(16, 4, generator=gen)),
                "bn_cnn": lambda: (_randomise(BatchNormCNN(), 1), torch.randn(8, 1, 8, 8, generator=gen)),
                "gn_cnn": lambda: (_randomise(BatchNormCNN(groups=2), 1), torch.randn(8, 1, 8, 8, generator=gen)),
                "residual": lambda: (_randomise(Residual(), 2), torch.randn(16, 5, generator=gen)),
                "gpt2": lambda: (_gpt2(), torch.randint(0, 32, (4, 8), generator=gen))}[case]()
    check = check_alignment(model, example_input=x, seed=3)
    assert check.passed and not check.error and check.groups
    # the same difference, recomputed from the traced spec and the same permutations
    spec = discover(model, x, strict=False)
    perms = moving_permutations(spec, seed=3)
    assert all(sorted(p.tolist()) == list(range(len(p))) and not (p == torch.arange(len(p))).any() for p in perms)
    permuted = apply_permutation(model, spec, perms)
    reference = _outputs(model, x)
    assert check.max_abs_diff == pytest.approx(float((_outputs(permuted, x) - reference).abs().max()), abs=1e-12)
    assert check.output_scale == pytest.approx(float(reference.abs().max()))
    assert check.tolerance == pytest.approx(ROUNDING_EPSILONS * EPS32 * check.output_scale)
    assert "epsilon" in check.tolerance_reason and check.max_abs_diff <= check.tolerance
    # the permutations did move the weights: the check compares two different parametrisations
    assert any(not torch.equal(v, permuted.state_dict()[k]) for k, v in model.state_dict().items())
    assert check.unpermutable == () and check.pinned == ()
    if case == "gn_cnn":  # cycles within the normalisation groups (apply_permutation refuses any other)
        assert sorted((g["size"], g["block"]) for g in check.groups) == [(4, 2), (6, 3)]


def test_batchnorm_statistics_belong_to_their_groups_and_residual_sums_merge_groups() -> None:
    cnn = check_alignment(_randomise(BatchNormCNN(), 1), input_shape=(1, 8, 8))
    members = [{(m["name"], m["axis"]) for m in g["members"]} for g in cnn.groups]
    assert {("bn.running_mean", 0), ("bn.running_var", 0), ("conv.weight", 0), ("conv2.weight", 1)} <= members[0]
    residual = check_alignment(_randomise(Residual(), 2))
    stream = max(residual.groups, key=lambda g: len(g["members"]))  # input layer, every LayerNorm, both blocks
    names = {m["name"] for m in stream["members"]}
    assert {"inp.weight", "blocks.0.0.weight", "blocks.1.3.bias", "out.weight"} <= names
    assert sorted(g["size"] for g in residual.groups) == [8, 12, 12]


def test_a_spec_that_leaves_running_statistics_out_of_their_group_fails() -> None:
    model = _randomise(BatchNormCNN(), 1)
    x = torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    traced = discover(model, x)
    first = traced.groups[0]
    planted = PermutationSpec((Group(first.size, first.block, tuple(m for m in first.members
                                                                    if m.name != "bn.running_mean"), first.probes),
                               *traced.groups[1:]), traced.pinned, traced.input_shape)
    check = check_alignment(model, example_input=x, spec=planted)
    assert not check.passed and check.max_abs_diff > 1e3 * check.tolerance
    assert [(d["name"], d["axis"]) for d in check.differences] == [("bn.running_mean", 0)]
    assert "leaves out" in check.differences[0]["why"]
    assert check_alignment(model, example_input=x, spec=traced).passed  # the traced spec itself passes


def test_a_layer_applied_twice_is_reported_unpermutable() -> None:
    check = check_alignment(_randomise(Reused(), 0), tolerance=0.0)
    assert check.groups == () and check.passed  # nothing to permute: the outputs cannot change, not even by rounding
    assert check.max_abs_diff == 0.0 and check.tolerance_reason == "given by the caller"
    unpermutable = {(u["name"], u["axis"]): u for u in check.unpermutable}
    assert set(unpermutable) == {("layer.weight", 0), ("layer.bias", 0), ("out.weight", 1)}
    assert all("the model input" in u["why"] and u["permuted"] == 0 and u["length"] == 6
               for u in unpermutable.values())
    fixed = {(f["name"], f["axis"]): f["why"] for f in check.fixed}
    assert fixed[("layer.weight", 1)] == "the model input" and fixed[("out.weight", 0)] == "the model output"


def test_tied_weights_are_permuted_together_and_listed() -> None:
    model = _gpt2()
    check = check_alignment(model)  # token ids guessed from the embedding, 8 random sequences
    assert check.passed and check.input_shape[0] == 8
    assert check.tied == {"lm_head.weight": "transformer.wte.weight"}
    stream = [g for g in check.groups if any(m["name"] == "transformer.wte.weight" for m in g["members"])]
    assert len(stream) == 1 and stream[0]["size"] == 16


def test_a_position_table_outside_the_state_dict_pins_the_embedding_units() -> None:
    check = check_alignment(_randomise(PositionBuffer(), 0))
    assert check.passed and [g["size"] for g in check.groups] == [16]
    why = {(u["name"], u["axis"]): u["why"] for u in check.unpermutable}
    assert set(why) == {("embed.weight", 1), ("hidden.weight", 1)}
    assert all("a buffer outside the state_dict" in w for w in why.values())


def test_lora_wrapped_attention_projections_are_listed_with_the_operation_the_trace_could_not_follow() -> None:
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_gpt2(), peft.LoraConfig(r=2, target_modules=["c_attn"], fan_in_fan_out=True))
    check = check_alignment(model)
    assert check.passed and len(check.pinned) == 1 and "aten.split" in check.pinned[0]
    prefix = "base_model.model.transformer.h.0.attn."
    unpermutable = {u["name"]: u for u in check.unpermutable}
    assert {f"{prefix}c_attn.base_layer.weight", f"{prefix}c_proj.weight"} <= set(unpermutable)
    assert all(check.pinned[0] in u["why"] for u in unpermutable.values())
    ranks = [g for g in check.groups if any("lora_A" in m["name"] and m["axis"] == 0 for m in g["members"])]
    assert [g["size"] for g in ranks] == [2]  # the LoRA rank itself is a permutation group


def test_a_model_that_cannot_be_traced_fails_with_the_reason() -> None:
    class Branching(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(x) if float(x.sum()) > 0 else -x

    check = check_alignment(Branching())
    assert not check.passed and "cannot trace Branching" in check.error and np.isnan(check.max_abs_diff)


def test_the_json_round_trips_and_names_every_parameter(tmp_path) -> None:
    for model in (_randomise(BatchNormCNN(), 1), _gpt2()):
        check = check_alignment(model, input_shape=(1, 8, 8) if isinstance(model, BatchNormCNN) else None)
        path = tmp_path / "spec.json"
        text = check.to_json(path)
        assert path.read_text() == text
        back = AlignmentCheck.from_json(text)
        assert back == check and back.passed == check.passed
        assert all(getattr(back, f.name) == getattr(check, f.name) for f in dataclasses.fields(check))
        record = json.loads(text)
        assert record["passed"] is True and record["format"].startswith("landscape alignment check")
        state = model.state_dict()
        assert set(record["shapes"]) == set(state)
        missing = {n for n, t in state.items() if t.ndim} - _named_everywhere(check)
        assert missing == set()
    assert landscape.connectivity.check_alignment is check_alignment


def test_the_cli_checks_one_model_writes_the_spec_and_exits_1_for_an_untraceable_one(tmp_path, capsys) -> None:
    (tmp_path / "nets.py").write_text(
        "import torch\n"
        "class Branching(torch.nn.Sequential):  # control flow on values: cannot be traced\n"
        "    def forward(self, x):\n"
        "        return super().forward(x) if float(x.sum()) > 0 else super().forward(-x)\n"
        "def make(input_shape, num_classes):\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(input_shape[0], 6),\n"
        "                               torch.nn.ReLU(), torch.nn.Linear(6, num_classes))\n"
        "def branching(input_shape, num_classes):\n"
        "    return Branching(*make(input_shape, num_classes))\n")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=gen)
    np.savez(tmp_path / "data.npz", inputs=x.numpy(), targets=(x[:, 0] > 0).long().numpy())
    torch.save(_randomise(nn.Sequential(nn.Flatten(), nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2)), 0).state_dict(),
               tmp_path / "a.pt")
    common = ["--checkpoints", tmp_path / "a.pt", "--data", tmp_path / "data.npz", "--out", tmp_path / "o",
              "--json", "--no-cache", "--quiet"]
    code = main([str(a) for a in ["align", "--check", "--module", f"{tmp_path / 'nets.py'}:make", *common,
                                  "--spec-json", tmp_path / "spec.json"]])
    out, err = capsys.readouterr()
    assert code == 0, err
    numbers = json.loads(out)["numbers"]
    written = AlignmentCheck.from_json((tmp_path / "spec.json").read_text())
    assert numbers["passed"] and numbers["units"] == 6 and written.passed and written.input_shape == (40, 3)
    assert {m["name"] for m in written.groups[0]["members"]} == {"1.weight", "1.bias", "3.weight"}
    code = main([str(a) for a in ["align", "--check", "--module", f"{tmp_path / 'nets.py'}:branching", *common]])
    out, err = capsys.readouterr()
    assert code == 1 and "cannot trace Branching" in json.loads(out)["numbers"]["error"], err
    code = main([str(a) for a in ["align", "--module", f"{tmp_path / 'nets.py'}:make", *common]])
    assert code == 2 and "needs --save FILE" in capsys.readouterr()[1]


def test_a_spec_that_permutes_through_an_unsupported_operation_fails(tmp_path) -> None:
    class Rolled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(3, 6), nn.Linear(6, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.roll(torch.relu(self.a(x)), 1, 1))

    model = _randomise(Rolled(), 0)
    traced = check_alignment(model)
    assert traced.passed and traced.groups == () and any("roll" in p for p in traced.pinned)
    assert {(u["name"], u["axis"]) for u in traced.unpermutable} >= {("a.weight", 0), ("b.weight", 1)}
    # a spec that permutes the rolled units as if the roll were not there (what a naive MLP spec would do)
    naive = discover(_randomise(nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2)), 0), torch.zeros(2, 3))
    renamed = PermutationSpec(tuple(dataclasses.replace(g, members=tuple(
        dataclasses.replace(m, name=m.name.replace("0.", "a.").replace("2.", "b.")) for m in g.members))
        for g in naive.groups), (), naive.input_shape)
    check = check_alignment(model, spec=renamed)
    assert not check.passed and check.max_abs_diff > 1e3 * check.tolerance
    assert {(d["name"], d["axis"]) for d in check.differences} == {("a.weight", 0), ("a.bias", 0), ("b.weight", 1)}
    assert all("the trace fixes" in d["why"] for d in check.differences)
