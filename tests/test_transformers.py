"""Hugging Face transformers in the evaluator and in curvature, on tiny models built from configs.

Every number is checked against an independent computation: a hand loop over tokens for the
causal-LM loss, the model's own logits for a classifier, a dense ``torch.func`` Hessian for the
top Hessian eigenvalue.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.data import DataLoader, TensorDataset

import landscape
from landscape import ConfigError, DataError
from landscape.space.points import PointSet

transformers = pytest.importorskip("transformers")

VOCAB, LENGTH = 64, 12


def tiny_gpt2(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def tokens() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (10, LENGTH), generator=gen)
    labels = ids.clone()
    labels[:, :3] = -100  # a prompt that does not count
    labels[1, 5:9] = -100
    mask = torch.ones_like(ids)
    mask[2, 8:] = 0  # right padding
    mask[7, 10:] = 0
    return ids, labels, mask


def hand_causal_lm(model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor,
                   mask: torch.Tensor | None = None) -> tuple[float, float]:
    """Mean next-token loss and token accuracy: -log softmax at the shifted label over counted tokens."""
    total, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for i in range(len(ids)):
            kwargs = {} if mask is None else {"attention_mask": mask[i:i + 1]}
            logits = model(input_ids=ids[i:i + 1], **kwargs).logits[0].double()
            for t in range(ids.shape[1] - 1):
                label = int(labels[i, t + 1])
                if label == -100 or (mask is not None and int(mask[i, t + 1]) == 0):
                    continue
                total -= float(torch.log_softmax(logits[t], -1)[label])
                correct += int(int(logits[t].argmax()) == label)
                count += 1
    return total / count, correct / count


def lm_evaluator(model: torch.nn.Module, data, **kwargs) -> landscape.Evaluator:
    return landscape.Evaluator(model, data, loss="causal_lm", dtype=torch.float64, progress=False, **kwargs)


def test_causal_lm_loss_equals_a_hand_loop_over_tokens_with_uneven_batches(tokens):
    ids, labels, _ = tokens
    model = tiny_gpt2(0)
    ev = lm_evaluator(model, (ids, labels), batch_size=4)  # batches of 4, 4 and 2 sequences
    assert [len(y) for _, y in ev.batches] == [4, 4, 2]
    assert ev.num_targets == int((labels[:, 1:] != -100).sum())
    loss, accuracy = hand_causal_lm(model.double(), ids, labels)
    got = ev.evaluate(model)
    assert got.loss[0] == pytest.approx(loss, rel=1e-10)
    assert got.accuracy[0] == pytest.approx(accuracy, rel=1e-12)
    assert got.spec["evaluator"]["loss"] == "causal_lm"


def test_attention_mask_positions_do_not_count(tokens):
    ids, labels, mask = tokens
    model = tiny_gpt2(0)
    rows = [{"input_ids": ids[i], "attention_mask": mask[i], "labels": labels[i]} for i in range(len(ids))]
    ev = lm_evaluator(model, DataLoader(rows, batch_size=3))
    assert ev.num_targets == int(((labels[:, 1:] != -100) & (mask[:, 1:] == 1)).sum())
    assert ev.evaluate(model).loss[0] == pytest.approx(hand_causal_lm(model.double(), ids, labels, mask)[0], rel=1e-10)


def test_dict_loader_and_batch_fn_give_the_same_numbers_as_tensors(tokens):
    ids, labels, _ = tokens
    model = tiny_gpt2(1)
    from_tensors = lm_evaluator(model, (ids, labels), batch_size=4).evaluate(model)
    rows = [{"input_ids": ids[i], "labels": labels[i]} for i in range(len(ids))]
    from_dicts = lm_evaluator(model, DataLoader(rows, batch_size=4)).evaluate(model)
    from_fn = lm_evaluator(model, DataLoader(TensorDataset(ids, labels), batch_size=4),
                           batch_fn=lambda b: ({"input_ids": b[0]}, b[1])).evaluate(model)
    for other in (from_dicts, from_fn):
        np.testing.assert_allclose(other.loss, from_tensors.loss, rtol=1e-12)
        np.testing.assert_allclose(other.accuracy, from_tensors.accuracy, rtol=1e-12)


def test_interpolate_endpoints_equal_the_hand_computed_losses(tokens):
    ids, labels, _ = tokens
    a, b = tiny_gpt2(0), tiny_gpt2(1)
    ev = lm_evaluator(a, (ids, labels), batch_size=4)
    path = landscape.interpolate(a, b, ev, alphas=[0.0, 0.5, 1.0])
    assert path.loss[0] == pytest.approx(hand_causal_lm(a.double(), ids, labels)[0], rel=1e-10)
    assert path.loss[-1] == pytest.approx(hand_causal_lm(b.double(), ids, labels)[0], rel=1e-10)
    assert np.isfinite(path.loss[1]) and path.loss[1] != path.loss[0]


def test_perplexity_is_exp_of_the_mean_token_loss(tokens):
    ids, labels, _ = tokens
    model = tiny_gpt2(0)
    got = lm_evaluator(model, (ids, labels), metric="perplexity").evaluate(model)
    assert got.accuracy[0] == pytest.approx(math.exp(hand_causal_lm(model.double(), ids, labels)[0]), rel=1e-10)
    assert got.spec["evaluator"]["metric"] == "perplexity"


def test_cache_keys_and_entries_differ_between_losses_and_metrics(tokens, tmp_path):
    ids, labels, _ = tokens
    model = tiny_gpt2(0)
    evs = {name: landscape.Evaluator(model, (ids, ids), loss=name, dtype=torch.float64, progress=False,
                                     cache=tmp_path)
           for name in ("causal_lm", "token", "masked_lm")}
    evs["perplexity"] = lm_evaluator(model, (ids, ids), cache=tmp_path, metric="perplexity")
    points = PointSet.explicit(evs["token"].vector(model).unsqueeze(0))
    keys = {name: ev.points_key(points, points.origin) for name, ev in evs.items()}
    assert len(set(keys.values())) == len(keys)
    causal = evs["causal_lm"].evaluate(model)
    token = evs["token"].evaluate(model)  # the same data and model, another loss: computed, not read back
    assert causal.loss[0] != pytest.approx(token.loss[0], rel=1e-3)
    assert evs["causal_lm"].evaluate(model).loss[0] == causal.loss[0]


def test_a_classifier_with_dict_batches_scores_its_logits():
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=32, num_labels=3)
    model = transformers.BertForSequenceClassification(config).eval()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (9, LENGTH), generator=gen)
    mask = torch.ones_like(ids)
    mask[::2, 9:] = 0
    labels = torch.randint(0, 3, (9,), generator=gen)
    rows = [{"input_ids": ids[i], "attention_mask": mask[i], "labels": labels[i]} for i in range(9)]
    ev = landscape.Evaluator(model, DataLoader(rows, batch_size=4), dtype=torch.float64, progress=False,
                             metric="top2_accuracy")
    with torch.no_grad():
        logits = model.double()(input_ids=ids, attention_mask=mask).logits
    got = ev.evaluate(model)
    assert got.loss[0] == pytest.approx(float(torch.nn.functional.cross_entropy(logits, labels)), rel=1e-10)
    top2 = (logits.topk(2, -1).indices == labels[:, None]).any(-1).double().mean()
    assert got.accuracy[0] == pytest.approx(float(top2), rel=1e-12)


def test_bad_batches_and_names_get_one_line_errors(tokens):
    ids, labels, _ = tokens
    model = tiny_gpt2(0)
    with pytest.raises(DataError, match="pass loss='causal_lm'"):
        landscape.Evaluator(model, (ids, ids), progress=False)
    with pytest.raises(DataError, match="a dict batch needs a 'labels' entry"):
        lm_evaluator(model, DataLoader([{"input_ids": ids[i]} for i in range(4)], batch_size=2))
    with pytest.raises(DataError, match="batch_fn must return a pair"):
        lm_evaluator(model, (ids, labels), batch_fn=lambda b: b[0])
    with pytest.raises(DataError, match="every label is ignored"):
        lm_evaluator(model, (ids, torch.full_like(ids, -100)))
    with pytest.raises(DataError, match="needs .N, T, V. logits and integer .N, T. labels"):
        lm_evaluator(model, (ids, labels[:, :5]))
    with pytest.raises(ConfigError, match="unknown metric 'perplexty' .did you mean 'perplexity'"):
        lm_evaluator(model, (ids, labels), metric="perplexty")
    with pytest.raises(ConfigError, match="loss must be one of 'cross_entropy'"):
        landscape.Evaluator(model, (ids, labels), loss="causal", progress=False)


# ---------------------------------------------------------------- curvature through attention
def tiny_vit() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    digits = pytest.importorskip("sklearn.datasets").load_digits()
    x = torch.tensor(digits.images[:48], dtype=torch.float64).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target[:48])
    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=8, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=8, num_labels=10,
                                    attn_implementation="sdpa")
    return transformers.ViTForImageClassification(config).eval().double(), x, y


def dense_top_eigenvalue(model: torch.nn.Module, names: list[str], loss_of_logits, inputs) -> float:
    """Largest eigenvalue of the dense Hessian (torch.func, reverse over reverse) of the loss in ``names``.

    ``torch.func.hessian`` (forward over reverse, with vmapped tangents) returns an asymmetric
    matrix through GPT-2 in PyTorch 2.14.1 (finite differences of the gradient agree with the
    operator's products and with this reference), so the reference differentiates twice in
    reverse mode and checks symmetry.
    """
    params = dict(model.named_parameters())
    chosen = [params[n].detach() for n in names]
    sizes = [p.numel() for p in chosen]

    def loss(theta: torch.Tensor) -> torch.Tensor:
        parts = {n: t.view_as(p) for n, t, p in zip(names, theta.split(sizes), chosen)}
        out = torch.func.functional_call(model, {**params, **parts}, (), inputs, tie_weights=True)
        return loss_of_logits(out.logits)

    theta = torch.cat([p.reshape(-1) for p in chosen])
    with sdpa_kernel(SDPBackend.MATH):
        hessian = torch.func.jacrev(torch.func.grad(loss))(theta)
    assert torch.allclose(hessian, hessian.T, atol=1e-12)
    return float(torch.linalg.eigvalsh(hessian).max())


def test_vit_hessian_top_eigenvalue_matches_the_dense_hessian():  # tolerance: relative 1e-6
    model, x, y = tiny_vit()
    ev = landscape.Evaluator(model, (x, y), dtype=torch.float64, batch_size=20, progress=False)
    patterns = ["vit.encoder.layer.0.attention.attention.query.*", "classifier.*"]
    names = [n for n, _ in model.named_parameters() if n.startswith(("vit.encoder.layer.0.attention.attention.query",
                                                                        "classifier"))]
    assert 50 < sum(p.numel() for n, p in model.named_parameters() if n in names) < 3000
    with pytest.raises(RuntimeError, match="not (been )?implemented"):  # the fused CPU kernel has no 2nd derivative
        torch.func.hessian(lambda p: model(pixel_values=x[:2] * p).logits.sum())(torch.ones(()))
    res = landscape.hessian_eigen(model, ev, k=1, params=patterns, tol=1e-10, max_iter=300)
    expected = dense_top_eigenvalue(model, names, lambda out: torch.nn.functional.cross_entropy(out, y),
                                    {"pixel_values": x})
    assert res.spec["attention_kernel"] == "math"
    assert res.values[0] == pytest.approx(expected, rel=1e-6)


def test_gpt2_hessian_with_the_causal_lm_loss_matches_the_dense_hessian(tokens):
    ids, labels, _ = tokens
    model = tiny_gpt2(0).double()
    ev = lm_evaluator(model, (ids, labels), batch_size=4)
    names = ["transformer.h.1.attn.c_attn.bias", "transformer.ln_f.weight"]
    count = int((labels[:, 1:] != -100).sum())

    def mean_token_loss(logits: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1),
                                                 reduction="sum") / count

    res = landscape.hessian_eigen(model, ev, k=1, params=names, tol=1e-10, max_iter=300)
    expected = dense_top_eigenvalue(model, names, mean_token_loss, {"input_ids": ids})
    assert res.values[0] == pytest.approx(expected, rel=1e-6)


def test_empirical_fisher_of_dict_batches_sums_per_sequence_gradients(tokens):
    ids, labels, _ = tokens
    model = tiny_gpt2(0).double()
    rows = [{"input_ids": ids[i], "labels": labels[i]} for i in range(len(ids))]
    ev = lm_evaluator(model, DataLoader(rows, batch_size=4))
    names = ["transformer.ln_f.weight", "transformer.ln_f.bias"]
    res = landscape.hessian_eigen(model, ev, k=1, params=names, kind="empirical_fisher", tol=1e-10, max_iter=300)
    params = dict(model.named_parameters())
    grads = []
    for i in range(len(ids)):  # one gradient per sequence: its summed next-token losses
        logits = model(input_ids=ids[i:i + 1]).logits[0]
        loss = torch.nn.functional.cross_entropy(logits[:-1], labels[i, 1:], reduction="sum")
        grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, [params[n] for n in names])]))
    g = torch.stack(grads)
    fisher = g.T @ g / int((labels[:, 1:] != -100).sum())
    assert res.values[0] == pytest.approx(float(torch.linalg.eigvalsh(fisher).max()), rel=1e-6)


def test_vmap_and_loop_agree_on_dict_batches_with_attention_masks(tokens):
    ids, labels, mask = tokens
    a, b = tiny_gpt2(0), tiny_gpt2(1)
    rows = [{"input_ids": ids[i], "attention_mask": mask[i], "labels": labels[i]} for i in range(len(ids))]
    results = [lm_evaluator(a, DataLoader(rows, batch_size=4), strategy=strategy).evaluate([a, b])
               for strategy in ("loop", "vmap")]
    np.testing.assert_allclose(results[1].loss, results[0].loss, rtol=1e-10)
    np.testing.assert_allclose(results[1].accuracy, results[0].accuracy, rtol=1e-12)
    assert results[0].loss[0] == pytest.approx(hand_causal_lm(a.double(), ids, labels, mask)[0], rel=1e-10)


def _tiny_gpt2_pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=16, bos_token_id=0,
                        eos_token_id=0)
    torch.manual_seed(0)
    a = GPT2LMHeadModel(config).eval()
    torch.manual_seed(1)
    return a, GPT2LMHeadModel(config).eval()


def test_a_curve_between_language_models_trains_on_dict_batches() -> None:
    """Garipov's curve on token data.

    Untrained it is the line; trained on dict batches it equals training on the same tensors mapped by
    batch_fn (dropout included: the training draws from its own seeded generator), and it lowers the
    midpoint loss.
    """
    a, b = _tiny_gpt2_pair()
    ids = torch.randint(0, 32, (24, 12), generator=torch.Generator().manual_seed(3))
    labels = ids.clone()
    labels[:, :3] = -100
    rows = [{"input_ids": i, "labels": lab} for i, lab in zip(ids, labels)]
    loader = torch.utils.data.DataLoader(rows, batch_size=8)
    ev = landscape.Evaluator(a, loader, loss="causal_lm", progress=False)
    line = landscape.curve(a, b, ev, train_data=loader, epochs=0, points=5)
    np.testing.assert_allclose(line.loss, line.line_loss, rtol=1e-6)  # untrained: the straight segment
    trained = landscape.curve(a, b, ev, train_data=loader, epochs=3, lr=0.5, batch_size=8, points=5)
    mapped_ev = landscape.Evaluator(a, (ids, labels), loss="causal_lm", progress=False,
                                    batch_fn=lambda batch: ({"input_ids": batch[0]}, batch[1]))
    mapped = landscape.curve(a, b, mapped_ev, train_data=(ids, labels), epochs=3, lr=0.5, batch_size=8, points=5)
    np.testing.assert_allclose(trained.knots, mapped.knots, rtol=1e-5, atol=1e-7)
    assert trained.loss[2] < line.loss[2]  # training lowered the middle of the curve


def _token_jacobian(model: torch.nn.Module, names: list[str], ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``(N, T, V)`` and their Jacobian ``(N, T, V, P)`` in the parameters ``names`` (flattened)."""
    params = dict(model.named_parameters())
    chosen = [params[n].detach() for n in names]
    sizes = [p.numel() for p in chosen]

    def logits(theta: torch.Tensor) -> torch.Tensor:
        parts = {n: t.view_as(p) for n, t, p in zip(names, theta.split(sizes), chosen)}
        return torch.func.functional_call(model, {**params, **parts}, (), {"input_ids": ids}).logits

    theta = torch.cat([p.reshape(-1) for p in chosen])
    with sdpa_kernel(SDPBackend.MATH):
        return logits(theta).detach(), torch.func.jacrev(logits)(theta).detach()


@pytest.mark.parametrize("loss, shift", [("causal_lm", 1), ("token", 0)])
def test_token_ggn_is_the_sum_over_counted_tokens_of_jt_h_j(tokens, loss, shift):
    """G = (1/M) sum over the M counted tokens t of J_t^T (diag p_t - p_t p_t^T) J_t, the dense matrix."""
    ids, labels, _ = tokens
    model = tiny_gpt2(0).double()
    names = ["transformer.ln_f.weight", "transformer.ln_f.bias"]
    ev = landscape.Evaluator(model, (ids, labels), loss=loss, dtype=torch.float64, batch_size=4, progress=False)
    out, jac = _token_jacobian(model, names, ids)
    logits, targets, jac = out[:, :LENGTH - shift], labels[:, shift:], jac[:, :LENGTH - shift]
    counted = targets != -100
    p = torch.softmax(logits[counted], -1)                         # (M, V)
    j = jac[counted]                                               # (M, V, P)
    h = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    expected = torch.einsum("mvp,mvw,mwq->pq", j, h, j) / counted.sum()
    op = landscape.curvature_operator(model, ev, kind="ggn", params=names)
    np.testing.assert_allclose(op.dense().numpy(), expected.numpy(), rtol=1e-9, atol=1e-12)


def test_token_fisher_is_its_drawn_per_token_estimate_and_tends_to_the_ggn(tokens):
    """The Monte-Carlo Fisher with the operator's own draws, rebuilt densely; with many draws near the GGN."""
    ids, labels, _ = tokens
    model = tiny_gpt2(0).double()
    names = ["transformer.ln_f.bias"]
    ev = landscape.Evaluator(model, (ids, labels), loss="causal_lm", dtype=torch.float64, progress=False)
    out, jac = _token_jacobian(model, names, ids)
    counted = torch.zeros(ids.shape, dtype=torch.bool)
    counted[:, :-1] = labels[:, 1:] != -100
    m = 4
    op = landscape.curvature_operator(model, ev, kind="fisher", params=names, mc_samples=m, seed=3)
    draws = op.draws[0]                                            # (m, N, T) labels, one batch
    s = torch.softmax(out, -1)[None] - torch.nn.functional.one_hot(draws, VOCAB).double()  # (m, N, T, V)
    g = torch.einsum("anbv,nbvp->anbp", s, jac)[:, counted]        # per draw and counted token: J_t^T s_t
    expected = torch.einsum("amp,amq->pq", g, g) / (m * counted.sum())
    np.testing.assert_allclose(op.dense().numpy(), expected.numpy(), rtol=1e-9, atol=1e-12)
    ggn = landscape.curvature_operator(model, ev, kind="ggn", params=names).dense()
    many = landscape.curvature_operator(model, ev, kind="fisher", params=names, mc_samples=400, seed=3).dense()
    # unbiased for the GGN; tolerance fixed before measuring: 10% of its norm with 400 draws per token
    assert float(torch.linalg.matrix_norm(many - ggn)) < 0.1 * float(torch.linalg.matrix_norm(ggn))
