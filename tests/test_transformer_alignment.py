"""Permutation alignment of transformers: attention heads, within-head dimensions, MLP and residual units."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    ViTConfig,
    ViTForImageClassification,
)

import landscape
from fl.datasets import load_dataset
from landscape.alignment.align import align, match
from landscape.alignment.attention import find_attention
from landscape.alignment.graph import PermutationError, discover
from landscape.alignment.permute import apply_permutation, random_permutations


def _vit(seed: int, heads: int = 2) -> nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return ViTForImageClassification(ViTConfig(
            image_size=8, patch_size=2, num_channels=1, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=heads, intermediate_size=64, num_labels=10)).eval()


def _gpt2(seed: int) -> nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16,
                                          bos_token_id=0, eos_token_id=0)).eval()


def _llama(seed: int, kv_heads: int = 2) -> nn.Module:
    """A LLaMA-style model: rotary embeddings, RMSNorm, gated MLP, 4 query heads sharing ``kv_heads``."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=kv_heads,
                                            max_position_embeddings=16)).eval()


class TorchAttention(nn.Module):
    """A residual block around ``nn.MultiheadAttention`` (fused in-projection)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 16)
        self.attention = nn.MultiheadAttention(16, 4, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        return self.head((h + self.attention(h, h, h)[0]).mean(1))


def _case(name: str) -> tuple[nn.Module, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    if name == "vit":
        return _vit(0), torch.randn(4, 1, 8, 8, generator=gen)
    if name == "gpt2":
        return _gpt2(0), torch.randint(0, 64, (4, 8), generator=gen)
    if name.startswith("llama"):
        return _llama(0, kv_heads=2 if name == "llama_gqa" else 4), torch.randint(0, 64, (4, 8), generator=gen)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return TorchAttention().eval(), torch.randn(4, 5, 6, generator=gen)


def _logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(x)
    return getattr(out, "logits", out)


def test_attention_blocks_are_found_with_their_heads_and_projections() -> None:
    vit = find_attention(_vit(0, heads=4))
    assert [(b.name, b.heads, b.head_dim) for b in vit] == [(f"vit.layers.{i}.attention", 4, 8) for i in (0, 1)]
    assert [s.name for s in vit[0].query] == ["vit.layers.0.attention.q_proj.weight",
                                              "vit.layers.0.attention.q_proj.bias"]
    assert [(s.name, s.axis) for s in vit[0].output] == [("vit.layers.0.attention.o_proj.weight", 1)]
    gpt = find_attention(_gpt2(0))
    # GPT-2's fused Conv1D c_attn stores its weight as (in, out): q, k, v are thirds of axis 1
    assert [(s.axis, s.start, s.length) for s in gpt[0].key] == [(1, 32, 96), (0, 32, 96)]
    assert [(s.name, s.axis) for s in gpt[0].output] == [("transformer.h.0.attn.c_proj.weight", 0)]
    spec = discover(_vit(0, heads=4), torch.zeros(2, 1, 8, 8))
    assert sorted(g.size for g in spec.groups) == [4, 4, 8, 8, 8, 8, 32, 64, 64]  # heads, q/k, v/o, residual, MLPs


@pytest.mark.parametrize("name", ["vit", "gpt2", "torch_mha", "llama", "llama_gqa"])
def test_random_permutations_keep_the_outputs(name: str) -> None:
    model, x = _case(name)
    spec = discover(model, x[:2])
    permuted = apply_permutation(model, spec, random_permutations(spec, seed=1))
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, permuted.state_dict()[k])]
    attention = {s.name for b in find_attention(model) for s in b.spans if "bias" not in s.name}  # biases start at 0
    assert attention and attention <= set(changed), sorted(attention - set(changed))
    diff = float((_logits(permuted, x) - _logits(model, x)).abs().max())
    assert diff < 1e-5, diff


def test_heads_move_as_blocks_and_query_key_dimensions_together() -> None:
    model = _vit(0, heads=4)
    spec = discover(model, torch.zeros(2, 1, 8, 8))
    perms = [torch.arange(g.size) for g in spec.groups]
    heads, qk = torch.tensor([2, 0, 3, 1]), torch.randperm(8, generator=torch.Generator().manual_seed(0))
    first = [i for i, g in enumerate(spec.groups)
             if any(m.name == "vit.layers.0.attention.q_proj.weight" and m.axis == 0 for m in g.members)]
    head_group, qk_group = sorted(first, key=lambda i: spec.groups[i].size)
    perms[head_group], perms[qk_group] = heads, qk
    out = apply_permutation(model, spec, perms).state_dict()
    ref = model.state_dict()
    for proj in ("q_proj", "k_proj"):
        w = ref[f"vit.layers.0.attention.{proj}.weight"].view(4, 8, 32)
        assert torch.equal(out[f"vit.layers.0.attention.{proj}.weight"].view(4, 8, 32), w[heads][:, qk])
    v, o = ref["vit.layers.0.attention.v_proj.weight"], ref["vit.layers.0.attention.o_proj.weight"]
    assert torch.equal(out["vit.layers.0.attention.v_proj.weight"].view(4, 8, 32), v.view(4, 8, 32)[heads])
    assert torch.equal(out["vit.layers.0.attention.o_proj.weight"].view(32, 4, 8), o.view(32, 4, 8)[:, heads])


@pytest.mark.parametrize("name", ["vit", "gpt2", "llama_gqa"])
def test_weight_matching_recovers_a_planted_permutation(name: str) -> None:
    model, x = _case(name)
    spec = discover(model, x[:2])
    shuffled = apply_permutation(model, spec, random_permutations(spec, seed=5))
    head = "classifier.weight" if name == "vit" else "lm_head.weight"
    assert not torch.equal(shuffled.state_dict()[head], model.state_dict()[head])
    recovered = align(shuffled, to=model)  # traced again, on a guessed input (token ids for GPT-2)
    worst = max(float((recovered.state_dict()[k] - v).abs().max()) for k, v in model.state_dict().items())
    assert worst <= 1e-6, worst


def test_grouped_query_attention_with_rotary_embeddings_keeps_query_key_dimensions() -> None:
    blocks = find_attention(_llama(0, kv_heads=2))
    assert [(b.heads, b.kv_heads, b.group_size, b.head_dim, b.rotary) for b in blocks] == [(4, 2, 2, 8, True)] * 2
    model, x = _case("llama_gqa")
    spec = discover(model, x[:2])
    q_groups = [g for g in spec.groups
                if any(m.name == "model.layers.0.self_attn.q_proj.weight" and m.axis == 0 for m in g.members)]
    assert [g.size for g in q_groups] == [2]  # the two key/value heads, each with its two query heads; no q/k dims
    heads = q_groups[0]
    perms = [torch.arange(g.size) for g in spec.groups]
    perms[spec.groups.index(heads)] = torch.tensor([1, 0])
    out = apply_permutation(model, spec, perms).state_dict()
    ref = model.state_dict()
    q, k = ref["model.layers.0.self_attn.q_proj.weight"], ref["model.layers.0.self_attn.k_proj.weight"]
    assert torch.equal(out["model.layers.0.self_attn.q_proj.weight"].view(2, 16, 32), q.view(2, 16, 32)[[1, 0]])
    assert torch.equal(out["model.layers.0.self_attn.k_proj.weight"].view(2, 8, 32), k.view(2, 8, 32)[[1, 0]])


def test_attention_of_inconsistent_widths_is_refused_and_unknown_attention_names_the_reshape() -> None:
    class Uneven(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.num_heads = 4
            self.q_proj, self.k_proj, self.v_proj = nn.Linear(16, 16), nn.Linear(16, 8), nn.Linear(16, 12)
            self.o_proj = nn.Linear(16, 16)

    with pytest.raises(PermutationError, match="not multi-head or grouped-query attention"):
        find_attention(nn.Sequential(Uneven()))

    class Unnamed(nn.Module):  # heads split by a reshape, but no declared number of heads
        def __init__(self) -> None:
            super().__init__()
            self.inp, self.out = nn.Linear(16, 16), nn.Linear(16, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.inp(x).view(len(x), 4, 4)
            return self.out(torch.softmax(h @ h.transpose(1, 2), -1).matmul(h).reshape(len(x), 16))

    with pytest.raises(PermutationError, match="reshape that splits.*find_attention"):
        discover(Unnamed(), torch.zeros(2, 16))


def test_alignment_does_not_raise_the_barrier_of_independently_trained_vits() -> None:
    data = load_dataset("digits")

    def train(seed: int) -> nn.Module:
        model = _vit(seed, heads=4).train()
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        gen = torch.Generator().manual_seed(seed)
        for _ in range(8):
            for idx in torch.randperm(len(data.train_y), generator=gen).split(64):
                opt.zero_grad()
                nn.functional.cross_entropy(model(data.train_x[idx]).logits, data.train_y[idx]).backward()
                opt.step()
        return model.eval()

    a, b = train(0), train(1)
    evaluator = landscape.Evaluator(a, (data.test_x, data.test_y), output="logits", device="cpu")
    found = match(b, to=a)
    assert found.info["objective"] > found.info["objective_before"]
    path = landscape.interpolate(a, b, evaluator, alphas=11, align="weight")
    before, after = path.spec["unaligned"]["loss_barrier"], path.loss_barrier
    print(f"tiny ViT on digits, loss barrier before alignment {before:.3f}, after {after:.3f}")
    unaligned_end = landscape.interpolate(a, b, evaluator, alphas=[1.0]).loss[0]
    assert abs(path.loss[-1] - unaligned_end) < 1e-5  # the aligned endpoint is the same function as b
    # alignment lowers but does not remove the barrier (Verma & Elbayad 2024; Imfeld et al. 2024)
    assert after <= before + 0.05, (before, after)


def test_activation_matching_reads_the_projection_outputs_of_attention_groups() -> None:
    a, x = _case("vit")
    b = _vit(1)
    spec = discover(a, x[:2])
    attention = [i for i, g in enumerate(spec.groups) if all(".attention." in m.name for m in g.members)]
    assert len(attention) == 6 and all(spec.groups[i].probes for i in attention)
    found = match(b, to=a, data=(torch.randn(64, 1, 8, 8), torch.zeros(64, dtype=torch.long)), method="activation")
    assert found.info["mean_correlation"] > found.info["mean_correlation_before"] + 0.1, found.info
    moved = [i for i in attention if not torch.equal(found.perms[i], torch.arange(spec.groups[i].size))]
    assert moved, "activation matching left every attention group in place"
    diff = float((_logits(found.apply(b), x) - _logits(b, x)).abs().max())
    assert diff < 1e-5, diff
