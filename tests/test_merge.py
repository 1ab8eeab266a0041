"""``landscape.merge`` against independent computations.

* every method against a hand computation on small tensors: the weighted mean, task arithmetic,
  TIES's trim, sign election and disjoint mean worked out entry by entry, DARE's rescaling (each
  survivor exactly ``tau / (1 - p)``, the mean over many seeds within five standard errors of
  ``tau``, the same merge for the same seed), SLERP against its closed form on orthogonal,
  60-degree and colinear tensors;
* task arithmetic and TIES against ``peft.utils.merge_utils`` (same density and sign rule);
* the greedy soup against a hand-written loop of Wortsman et al.'s Recipe 1;
* a merge's barriers against :func:`landscape.interpolate` called directly; align-first on a
  permuted copy;
* LoRA adapters of one base merged with ``params="trainable"``, ``.safetensors`` checkpoints read
  tensor by tensor (a damaged one refused), and one-line errors naming the culprit.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import landscape
from landscape import ArchitectureMismatchError, CheckpointError, ConfigError
from landscape.space.safetensors_reader import SafetensorsReader

TAUS = torch.tensor([[0.5, -0.1, 0.3, -0.8, 0.05],
                     [-0.4, 0.2, 0.1, 0.6, -0.9],
                     [0.2, 0.7, -0.05, -0.3, 0.1]], dtype=torch.float64)
BASE = torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0], dtype=torch.float64)


def states(taus: torch.Tensor = TAUS, base: torch.Tensor = BASE) -> list[dict[str, torch.Tensor]]:
    """One state_dict ``{"w": base + tau_i}`` per task vector."""
    return [{"w": base + t} for t in taus]


def merged(*args, **kwargs) -> torch.Tensor:
    """The merged ``w`` of :func:`landscape.merge`."""
    return landscape.merge(*args, **kwargs).state_dict()["w"]


def mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def perturbed(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    out = mlp(0)
    out.load_state_dict({k: v + scale * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()})
    return out


@pytest.fixture(scope="module")
def task():
    """A base MLP, four fine-tunes of it (one ruined), and an evaluator on 200 samples."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 5, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    base = mlp(0)
    opt = torch.optim.SGD(base.parameters(), lr=0.5)
    for _ in range(100):  # full-batch descent: a base that has learnt something
        opt.zero_grad()
        torch.nn.functional.cross_entropy(base(x), y).backward()
        opt.step()
    models = [perturbed(base, s, i) for i, s in enumerate((0.2, 0.3, 4.0, 0.25))]
    return base, models, landscape.Evaluator(base, (x, y), dtype=torch.float64, progress=False)


# ---------------------------------------------------------------- hand computations
def test_mean_and_weighted_mean_by_hand():
    thetas = BASE + TAUS
    assert torch.allclose(merged(states()), thetas.mean(0), atol=1e-15)
    w = [1.0, 3.0, 0.0]
    assert torch.allclose(merged(states(), weights=w), (thetas[0] + 3 * thetas[1]) / 4, atol=1e-15)


def test_task_arithmetic_by_hand():
    sums = torch.tensor([0.3, 0.8, 0.35, -0.5, -0.75], dtype=torch.float64)
    assert torch.allclose(merged(states(), "task_arithmetic", base={"w": BASE}), BASE + sums, atol=1e-15)
    out = merged(states(), "task_arithmetic", base={"w": BASE}, weights=[1, 0, 2], scale=0.5)
    assert torch.allclose(out, BASE + 0.5 * (TAUS[0] + 2 * TAUS[2]), atol=1e-15)


def test_ties_trim_elect_and_disjoint_mean_by_hand():
    # density 0.6 keeps k = 3 of 5 entries of each task vector:
    #   [0.5, 0, 0.3, -0.8, 0], [-0.4, 0, 0, 0.6, -0.9], [0.2, 0.7, 0, -0.3, 0]
    # total mass [0.3, 0.7, 0.3, -0.5, -0.9] elects signs [+, +, +, -, -]; the agreeing entries'
    # means: (0.5 + 0.2) / 2, 0.7, 0.3, (-0.8 - 0.3) / 2, -0.9
    expected = torch.tensor([0.35, 0.7, 0.3, -0.55, -0.9], dtype=torch.float64)
    out = merged(states(), "ties", base={"w": BASE}, density=0.6)
    assert torch.allclose(out, BASE + expected, atol=1e-15)
    half = merged(states(), "ties", base={"w": BASE}, density=0.6, scale=0.5)
    assert torch.allclose(half, BASE + 0.5 * expected, atol=1e-15)
    # density 1 trims nothing: entry 0 then has total 0.3 (+), agreeing 0.5 and 0.2 -> 0.35 again,
    # entry 1 has 0.2 and 0.7 agreeing (total +0.8) -> 0.45
    full = merged(states(), "ties", base={"w": BASE}, density=1.0)
    assert full[1] - BASE[1] == pytest.approx(0.45, abs=1e-15)


def test_dare_keeps_each_entry_or_rescales_it_exactly_and_is_unbiased():
    g = torch.Generator().manual_seed(3)
    tau = torch.randn(40, generator=g, dtype=torch.float64)
    base = torch.randn(40, generator=g, dtype=torch.float64)
    p, runs = 0.7, 1000
    draws = torch.stack([merged([{"w": base + tau}], "dare", base={"w": base}, p=p, seed=s) - base
                         for s in range(runs)])
    kept = draws != 0
    assert torch.allclose(draws[kept], (tau / (1 - p)).expand_as(draws)[kept], rtol=1e-12, atol=0)
    frac = kept.double().mean().item()  # Binomial(40000, 0.3): standard deviation 0.0023
    assert abs(frac - (1 - p)) < 5 * math.sqrt(p * (1 - p) / kept.numel())
    stderr = tau.abs() * math.sqrt(p / (1 - p) / runs)  # of the mean of tau * Bernoulli(1-p) / (1-p)
    assert ((draws.mean(0) - tau).abs() <= 5 * stderr).all()


def test_dare_is_deterministic_under_a_seed_and_p0_is_task_arithmetic():
    kw = dict(base={"w": BASE}, p=0.5)
    a, b = merged(states(), "dare", seed=7, **kw), merged(states(), "dare", seed=7, **kw)
    assert torch.equal(a, b)
    assert not torch.equal(a, merged(states(), "dare", seed=8, **kw))
    assert torch.equal(merged(states(), "dare", base={"w": BASE}, p=0.0),
                       merged(states(), "task_arithmetic", base={"w": BASE}))
    # combine="ties" with p = 0 is TIES without its trim (density 1)
    assert torch.allclose(merged(states(), "dare", base={"w": BASE}, p=0.0, combine="ties"),
                          merged(states(), "ties", base={"w": BASE}, density=1.0), atol=1e-15)


@pytest.mark.parametrize("t", [0.0, 0.3, 0.5, 1.0])
def test_slerp_matches_the_closed_form(t):
    a, b = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64), torch.tensor([0.0, 2.0, 0.0], dtype=torch.float64)
    out = merged([{"w": a}, {"w": b}], "slerp", t=t)  # orthogonal: Omega = pi / 2
    assert torch.allclose(out, math.sin((1 - t) * math.pi / 2) * a + math.sin(t * math.pi / 2) * b, atol=1e-15)
    u = torch.tensor([1.0, 0.0], dtype=torch.float64)
    v = torch.tensor([math.cos(math.pi / 3), math.sin(math.pi / 3)], dtype=torch.float64)
    rotated = merged([{"w": u}, {"w": v}], "slerp", t=t)  # unit vectors 60 degrees apart: a rotation by 60 t
    assert torch.allclose(rotated, torch.tensor([math.cos(t * math.pi / 3), math.sin(t * math.pi / 3)],
                                                dtype=torch.float64), atol=1e-14)
    c = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    for other in (2.5 * c, -c, torch.zeros(3, dtype=torch.float64)):  # colinear, opposite, zero: the line
        assert torch.allclose(merged([{"w": c}, {"w": other}], "slerp", t=t), (1 - t) * c + t * other, atol=1e-15)


# ---------------------------------------------------------------- against peft
def test_task_arithmetic_and_ties_match_peft_merge_utils():
    merge_utils = pytest.importorskip("peft.utils.merge_utils")
    g = torch.Generator().manual_seed(0)
    shapes = {"a.weight": (16, 12), "a.bias": (16,), "b.weight": (3, 16)}
    base = {k: torch.randn(s, generator=g, dtype=torch.float64) for k, s in shapes.items()}
    models = [{k: v + 0.1 * torch.randn(v.shape, generator=g, dtype=torch.float64) for k, v in base.items()}
              for _ in range(3)]
    weights = [0.7, 1.0, 1.6]
    largest = 0.0
    for method, kw, reference in [
            ("task_arithmetic", {}, lambda taus, w: merge_utils.task_arithmetic(taus, w)),
            ("ties", {"density": 0.3}, lambda taus, w: merge_utils.ties(taus, w, 0.3, "total"))]:
        state = landscape.merge(models, method, base=base, weights=weights, scale=0.8, **kw).state_dict()
        for name in shapes:
            taus = [m[name] - base[name] for m in models]
            expected = base[name] + 0.8 * reference(taus, torch.tensor(weights, dtype=torch.float64))
            largest = max(largest, float((state[name] - expected).abs().max()))
    assert largest <= 1e-15, largest


# ---------------------------------------------------------------- greedy soup, barriers, alignment
def test_greedy_soup_matches_a_hand_loop(task):
    base, models, ev = task
    acc = ev.evaluate(models).accuracy
    order = sorted(range(len(models)), key=lambda i: -acc[i])
    soup, best = [order[0]], acc[order[0]]
    for i in order[1:]:
        trial = ev.evaluate({k: sum(models[j].state_dict()[k] for j in soup + [i]) / (len(soup) + 1)
                             for k in base.state_dict()}).accuracy[0]
        if trial >= best:
            soup, best = soup + [i], trial
    result = landscape.merge(models, "greedy_soup", held_out=ev)
    assert result.members == [f"model {i}" for i in soup] and "model 2" not in result.members
    expected = {k: sum(models[j].state_dict()[k] for j in soup) / len(soup) for k in base.state_dict()}
    assert all(torch.allclose(result.state_dict()[k], v, atol=1e-6) for k, v in expected.items())
    assert result.selection["soup_score"][-1] == pytest.approx(best)


@pytest.mark.parametrize("alphas", [11, "adaptive"])
def test_barriers_are_those_of_interpolate_called_directly(task, alphas):
    base, models, ev = task
    result = landscape.merge(models[:2], "ties", base=base, evaluator=ev, alphas=alphas, density=0.5)
    for i, m in enumerate(models[:2]):
        path = landscape.interpolate(result.state_dict(), m, ev, alphas=alphas)
        assert result.loss_barrier[i] == path.loss_barrier and result.accuracy_barrier[i] == path.accuracy_barrier
        assert np.array_equal(result.path(i).loss, path.loss)
    metrics = ev.evaluate([result.state_dict(), *models[:2], base])
    assert result.loss == metrics.loss[0] and list(result.endpoint_loss) == list(metrics.loss[1:3])
    assert result.base_accuracy == metrics.accuracy[3]


def test_align_first_recovers_a_permuted_copy(task):
    base, models, ev = task
    a = models[0]
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    sd = a.state_dict()
    b = mlp(0)
    b.load_state_dict({"0.weight": sd["0.weight"][perm], "0.bias": sd["0.bias"][perm],
                       "2.weight": sd["2.weight"][:, perm], "2.bias": sd["2.bias"]})
    result = landscape.merge([a, b], "mean", evaluator=ev, align=True, alphas=5)
    assert all(torch.allclose(result.state_dict()[k], v, atol=1e-6) for k, v in sd.items())
    assert result.worst_loss_barrier == pytest.approx(0.0, abs=1e-9)
    assert result.unaligned["loss"] > result.loss and result.spec["align"] == "weight"


def test_curvature_is_that_of_sharpness_at_the_merge(task):
    base, models, ev = task
    result = landscape.merge(models[:2], "mean", evaluator=ev, curvature=True, rho=0.05, alphas=3)
    direct = landscape.sharpness(result.state_dict(), ev, rho=0.05, kind="l2")
    assert result.sharpness == direct.value and result.lambda_max == direct.lambda_max
    assert result.endpoint_sharpness.shape == (2,) and np.isfinite(result.endpoint_lambda_max).all()


# ---------------------------------------------------------------- inputs
def test_lora_adapters_of_one_base_merge_only_the_adapters():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(mlp(0), peft.LoraConfig(r=2, lora_alpha=4, target_modules=["0", "2"]))
    start = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(5)
    tuned = [{k: v + (0.1 * torch.randn(v.shape, generator=g) if "lora_" in k else 0) for k, v in start.items()}
             for _ in range(2)]
    state = landscape.merge(tuned, "ties", base=start, params="trainable", template=model, density=0.5).state_dict()
    lora = [k for k in start if "lora_" in k]
    assert len(lora) == 4
    for k, v in start.items():
        if k in lora:
            taus = torch.stack([t[k] - v for t in tuned])
            flat = taus.reshape(2, -1)
            keep = flat.abs() >= flat.abs().topk(flat.shape[1] // 2, dim=1).values[:, -1:]
            trimmed = (flat * keep)
            sign = torch.where(trimmed.sum(0) >= 0, 1.0, -1.0)
            agree = torch.sign(trimmed) == sign
            expected = (trimmed * agree).sum(0) / agree.sum(0).clamp(min=1)
            assert torch.allclose(state[k], v + expected.reshape(v.shape), atol=1e-6), k
        else:
            assert torch.equal(state[k], v), k
    tuned[1]["base_model.model.0.base_layer.weight"] = tuned[1]["base_model.model.0.base_layer.weight"] + 1
    with pytest.raises(ConfigError, match=r"model 1 differs from base outside params='trainable' \(first differing "
                                          r"tensor: base_model.model.0.base_layer.weight\)"):
        landscape.merge(tuned, "ties", base=start, params="trainable", template=model)


def test_safetensors_checkpoints_are_read_tensor_by_tensor_and_checked(tmp_path):
    models = [mlp(i).state_dict() for i in range(3)]
    paths = [landscape.save_state_dict(m, tmp_path / f"m{i}.safetensors") for i, m in enumerate(models)]
    from_files = landscape.merge(paths[1:], "ties", base=paths[0], density=0.5).state_dict()
    in_memory = landscape.merge(models[1:], "ties", base=models[0], density=0.5).state_dict()
    assert from_files.keys() == in_memory.keys() and all(torch.equal(from_files[k], in_memory[k]) for k in in_memory)
    with SafetensorsReader(paths[0]) as reader:  # out of order: verify reads the file again
        reader.read(reader.names[-1])
        reader.read(reader.names[0])
        reader.verify()
    data = bytearray(paths[2].read_bytes())
    data[-3] ^= 0x10  # a flipped bit in the last tensor's data
    paths[2].write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"m2\.safetensors: is corrupt"):
        landscape.merge(paths[1:], "mean")


def test_a_module_prefix_is_removed_against_the_template():
    a, b = mlp(0), mlp(1)
    prefixed = {f"module.{k}": v for k, v in b.state_dict().items()}
    out = landscape.merge([a, prefixed], "mean").state_dict()
    assert torch.allclose(out["0.weight"], (a[0].weight + b[0].weight) / 2)


@pytest.mark.parametrize("call,message", [
    (lambda: landscape.merge(states(), "ties"), r"^ties adds task vectors .* pass base="),
    (lambda: landscape.merge(states(), "mean", base={"w": BASE}), r"^mean uses no base model"),
    (lambda: landscape.merge(states(), "slerp"), r"^slerp merges exactly 2 models, got 3$"),
    (lambda: landscape.merge(states(), "ties", base={"w": BASE}, density=0.0), r"^ties option density must be > 0"),
    (lambda: landscape.merge(states(), "ties", base={"w": BASE}, density=1.5), r"^ties option density must be"),
    (lambda: landscape.merge(states(), "dare", base={"w": BASE}, p=1.0), r"^dare option p must be >= 0 and < 1"),
    (lambda: landscape.merge(states(), "dare", base={"w": BASE}, drop=0.5), r"^unknown dare option 'drop'"),
    (lambda: landscape.merge(states(), "mean", weights=[1, 2]), r"^2 weights for 3 models$"),
    (lambda: landscape.merge(states(), "mean", weights=[1, -1, 1]), r"non-negative"),
    (lambda: landscape.merge(states()[:2], "slerp", weights=[1, 1]), r"^slerp takes no weights$"),
    (lambda: landscape.merge(states(), "average"), r"^unknown merge method 'average'"),
    (lambda: landscape.merge(states(), "greedy_soup"), r"^greedy_soup chooses models on held-out data"),
    (lambda: landscape.merge(states(), "mean", params="trainable"), r"^params= needs the architecture"),
])
def test_bad_input_is_one_line_naming_it(call, message):
    with pytest.raises(ConfigError, match=message) as info:
        call()
    assert "\n" not in str(info.value)


def test_models_that_do_not_match_are_named():
    other = states()
    other[2] = {"w": BASE.float() + TAUS[2].float()}
    with pytest.raises(ConfigError, match=r"^model 2: w is torch.float32 but model 0 holds it as torch.float64"):
        landscape.merge(other)
    with pytest.raises(ArchitectureMismatchError, match=r"model 1 \(compared with base\).*wrong-shape keys"):
        landscape.merge([{"w": BASE}, {"w": BASE[:3]}], "task_arithmetic", base={"w": BASE})
    with pytest.raises(ArchitectureMismatchError,
                       match=r"model 1 \(compared with model 0\).*missing keys \[w\]; unexpected keys \[v\]"):
        landscape.merge([{"w": BASE}, {"v": BASE}])


def test_a_cached_merge_keeps_its_numbers_not_its_weights(tmp_path, task):
    base, models, ev = task
    result = landscape.merge(models[:2], "mean", evaluator=ev, alphas=3)
    cache = landscape.Cache(tmp_path / "c")
    cache.save_result("merge", result)
    back = cache.load_result("merge")
    assert back == result and back.loss_barrier.tolist() == result.loss_barrier.tolist()
    with pytest.raises(ConfigError, match="holds no weights"):
        back.state_dict()
    assert torch.equal(result.model[0].weight, result.state_dict()["0.weight"])


# ---------------------------------------------------------------- figures and the command line
def test_the_merge_figures_mark_the_merges(task):
    import figures

    base, models, ev = task
    ties = landscape.merge(models[:2], "ties", base=base, evaluator=ev, alphas=3)
    assert figures.kind_of(ties) == "merge" and set(figures.merging.merge_paths({"ties": ties})) == {
        "ties: merge → model 0", "ties: merge → model 1"}
    plane = landscape.plane(base, models[0], models[1], ev, labels=("base", "a", "b"), resolution=3,
                            extra={"ties": ties.state_dict()})
    assert figures.merging.merge_roles(plane, ["ties"], base="base") == {"base": "anchor", "a": "model",
                                                                        "b": "model", "ties": "merge"}
    with pytest.raises(ConfigError, match="'dare' is not a model of the plane"):
        figures.merge_plane_figure(plane, ["dare"])


def test_the_command_prints_and_saves_what_the_python_api_computes(tmp_path, capsys):
    import json

    from fl.datasets import load_dataset
    from fl.models import build_model
    from landscape_cli.main import main

    states = [build_model("mlp", num_classes=10, input_shape=(1, 8, 8), seed=s).state_dict() for s in range(3)]
    paths = [landscape.save_state_dict(m, tmp_path / f"m{i}.safetensors") for i, m in enumerate(states)]
    code = main(["merge", "--module", "mlp", "--checkpoints", str(paths[1]), str(paths[2]), "--data", "digits",
                 "--method", "ties", "--base", str(paths[0]), "--density", "0.5", "--alphas", "5",
                 "--save", str(tmp_path / "merged.safetensors"), "--out", str(tmp_path / "out"), "--json",
                 "--no-figures", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    numbers = json.loads(out)["numbers"]
    bundle = load_dataset("digits")
    ev = landscape.Evaluator(build_model("mlp", num_classes=10, input_shape=(1, 8, 8), seed=0),
                             (bundle.test_x, bundle.test_y), progress=False)
    api = landscape.merge(paths[1:], "ties", base=paths[0], evaluator=ev, alphas=5, density=0.5, labels=["m1", "m2"])
    assert numbers["loss"] == pytest.approx(api.loss, rel=1e-12)
    assert numbers["loss_barrier"] == pytest.approx(dict(zip(api.labels, api.loss_barrier)), rel=1e-12, abs=1e-15)
    saved = landscape.load_state_dict(tmp_path / "merged.safetensors")
    assert all(torch.equal(saved[k], v) for k, v in api.state_dict().items())
