"""IMA's decomposition and the claim checks on Hugging Face transformers, against hand computations.

* ``landscape.decompose`` of ViT client models (several realisations each) equals the IMA
  Theorem 1 terms computed here from the models' own softmax outputs, term by term.
* with the causal-LM loss, the decomposition of GPT-2 clients is Theorem 1 over the counted
  tokens (each token's softmax against its next-token label), computed here token by token;
* ``landscape.claims.transitivity`` on GPT-2 language models with the causal-LM loss: its
  loss barriers are FedGuCci Eq. 3 over hand-computed token losses of the interpolated models.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import landscape
from landscape.space.params import ParameterSpace

from test_transformers import hand_causal_lm, tiny_gpt2

transformers = pytest.importorskip("transformers")


def vit(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=8, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=8, num_labels=10)
    return transformers.ViTForImageClassification(config).eval().double()


def perturbed(model: torch.nn.Module, seed: int, scale: float = 0.05) -> torch.nn.Module:
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return out


def at(template: torch.nn.Module, vec: torch.Tensor) -> torch.nn.Module:
    """A copy of ``template`` holding the flat vector ``vec``."""
    model = copy.deepcopy(template)
    model.load_state_dict(ParameterSpace(template).state_dict(vec))
    return model


def probabilities(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.softmax(model(pixel_values=x).logits.double(), -1)


def test_decomposition_of_vit_clients_equals_theorem_1_by_hand():
    digits = pytest.importorskip("sklearn.datasets").load_digits()
    x = torch.tensor(digits.images[:60], dtype=torch.float64).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target[:60])
    parts = [(x[:25], y[:25]), (x[25:45], y[25:45]), (x[45:], y[45:])]
    base = vit(0)
    clients = [[perturbed(base, 10 * k + s) for s in range(3)] for k in range(3)]  # 3 realisations each
    ev = landscape.Evaluator(base, parts[0], dtype=torch.float64, progress=False)
    dec = landscape.decompose(clients, parts, ev)

    p = torch.tensor([len(py) for _, py in parts], dtype=torch.float64)
    p = p / p.sum()
    target = torch.nn.functional.one_hot(y, 10).double()
    probs = torch.stack([torch.stack([probabilities(m, x) for m in ms]) for ms in clients])  # (K, S, N, C)
    mean = probs.mean(1)                                                                     # (K, N, C)
    member = torch.zeros(3, len(y), dtype=torch.float64)
    member[0, :25], member[1, 25:45], member[2, 45:] = 1, 1, 1
    r = target - mean
    train_bias = torch.einsum("k,kn,knc->nc", p, member, r)
    heter_bias = torch.einsum("k,kn,knc->nc", p, 1 - member, r)
    delta = probs - mean[:, None]
    variance = torch.einsum("k,kn->n", p ** 2, (delta ** 2).sum(-1).mean(1))
    pooled = torch.einsum("k,ksnc->snc", p, delta)
    wens = torch.einsum("k,ksnc->snc", p, probs)
    space = ParameterSpace(base)
    vecs = torch.stack([torch.stack([space.to_vector(m, dtype=torch.float64) for m in ms]) for ms in clients])
    fma_vecs = torch.einsum("k,ksd->sd", p, vecs)
    fma = torch.stack([probabilities(at(base, v), x) for v in fma_vecs])
    expected = {
        "bias": float(((train_bias + heter_bias) ** 2).sum(-1).mean()),
        "train_bias": float((train_bias ** 2).sum(-1).mean()),
        "heter_bias": float((heter_bias ** 2).sum(-1).mean()),
        "variance": float(variance.mean()),
        "covariance": float(((pooled ** 2).sum(-1).mean(0) - variance).mean()),
        "wens_loss": float(((target - wens) ** 2).sum(-1).mean()),
        "fma_loss": float(((target - fma) ** 2).sum(-1).mean()),
    }
    for name, value in expected.items():
        assert getattr(dec, name) == pytest.approx(value, rel=1e-9, abs=1e-14), name
    assert dec.variance > 1e-6 and dec.covariance != 0.0


def test_transitivity_on_language_models_uses_the_token_loss():
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 64, (6, 12), generator=gen)
    labels = ids.clone()
    labels[:, :2] = -100
    anchor = tiny_gpt2(0).double()
    w1, w2 = perturbed(anchor, 1, 0.02), perturbed(anchor, 2, 0.02)
    ev = landscape.Evaluator(anchor, (ids, labels), loss="causal_lm", dtype=torch.float64, progress=False)
    alphas = np.linspace(0, 1, 5)
    verdict = landscape.claims.transitivity(w1, w2, anchor, ev, metric="loss", alphas=alphas, threshold=0.05)
    space = ParameterSpace(anchor)

    def hand_barrier(a: torch.nn.Module, b: torch.nn.Module) -> float:  # FedGuCci Eq. 3 on the grid
        va, vb = (space.to_vector(m, dtype=torch.float64) for m in (a, b))
        losses = [hand_causal_lm(at(anchor, (1 - t) * va + t * vb), ids, labels)[0]
                  for t in alphas]
        return max(loss - ((1 - t) * losses[0] + t * losses[-1]) for t, loss in zip(alphas, losses))

    assert verdict.numbers["barrier_w1_w2"] > 1e-3  # a real barrier, not 0 == 0
    assert verdict.numbers["barrier_w1_w2"] == pytest.approx(hand_barrier(w1, w2), rel=1e-8, abs=1e-12)
    assert verdict.numbers["barrier_w1_anchor"] == pytest.approx(hand_barrier(w1, anchor), rel=1e-8, abs=1e-12)
    assert verdict.status == "reproduced"  # three models within 0.02 of each other share one basin of the token loss


def test_decomposition_of_language_models_is_theorem_1_over_counted_tokens():
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 64, (9, 10), generator=gen)
    labels = ids.clone()
    labels[:, :2] = -100  # a prompt that does not count
    labels[4, 6:] = -100
    parts = [(ids[:4], labels[:4]), (ids[4:], labels[4:])]
    base = tiny_gpt2(0).double()
    clients = [[perturbed(base, 10 * k + s, 0.02) for s in range(2)] for k in range(2)]
    ev = landscape.Evaluator(base, parts[0], loss="causal_lm", dtype=torch.float64, progress=False)
    dec = landscape.decompose(clients, parts, ev)

    def token_probs(model: torch.nn.Module) -> torch.Tensor:  # (M, V): every counted token, in order
        with torch.no_grad():
            logits = model(input_ids=ids).logits.double()
        rows = [torch.softmax(logits[i, t], -1) for i in range(len(ids)) for t in range(ids.shape[1] - 1)
                if labels[i, t + 1] != -100]
        return torch.stack(rows)

    targets = torch.tensor([int(labels[i, t + 1]) for i in range(len(ids)) for t in range(ids.shape[1] - 1)
                            if labels[i, t + 1] != -100])
    owner = torch.tensor([0 if i < 4 else 1 for i in range(len(ids)) for t in range(ids.shape[1] - 1)
                          if labels[i, t + 1] != -100])
    counts = torch.bincount(owner).double()
    p = counts / counts.sum()                                      # weights: counted tokens per client
    target = torch.nn.functional.one_hot(targets, 64).double()
    probs = torch.stack([torch.stack([token_probs(m) for m in ms]) for ms in clients])  # (K, S, M, V)
    mean = probs.mean(1)
    member = torch.stack([(owner == k).double() for k in range(2)])
    r = target - mean
    train_bias = torch.einsum("k,km,kmv->mv", p, member, r)
    heter_bias = torch.einsum("k,km,kmv->mv", p, 1 - member, r)
    variance = torch.einsum("k,km->m", p ** 2, ((probs - mean[:, None]) ** 2).sum(-1).mean(1))
    wens = torch.einsum("k,ksmv->smv", p, probs)
    assert dec.num_samples == len(targets) == int((labels[:, 1:] != -100).sum())
    np.testing.assert_allclose(dec.weights, p.numpy(), rtol=1e-12)
    assert dec.bias == pytest.approx(float(((train_bias + heter_bias) ** 2).sum(-1).mean()), rel=1e-9)
    assert dec.heter_bias == pytest.approx(float((heter_bias ** 2).sum(-1).mean()), rel=1e-9)
    assert dec.variance == pytest.approx(float(variance.mean()), rel=1e-9)
    assert dec.wens_loss == pytest.approx(float(((target - wens) ** 2).sum(-1).mean()), rel=1e-9)
    assert dec.wens_loss == pytest.approx(dec.bias + dec.variance + dec.covariance, rel=1e-9)
