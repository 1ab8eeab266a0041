"""Crashes and unclear messages of the API and the CLI found by an attack campaign.

Crashes: 0-d parameters and buffers (checked against paths and Hessians computed by hand with
``functional_call`` and ``torch.func.hessian``), models on the meta device, attention without a
double backward in curvature. Messages: each bad input is refused with its error class and a
message saying what was wrong (the CLI on one line), and a path or group with non-finite points
warns instead of returning a silent NaN barrier.
"""
from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

import landscape
from landscape import (
    CheckpointError,
    ConfigError,
    CurvatureError,
    DataError,
    Evaluator,
    MetaDeviceError,
    NonFiniteLossWarning,
    ParameterSpace,
    WeightOverflowError,
    group_barrier,
    hessian_eigen,
    interpolate,
)
from landscape.geometry.planes import random_direction
from landscape_cli.main import main

from conftest import make_mlp
from fault_counts import tally
from test_cli_bad_inputs import one_line_error

GAIN_NETS = ("import torch\n"
             "class Divided(torch.nn.Module):\n"
             "    def __init__(self, features, classes):\n"
             "        super().__init__()\n"
             "        self.fc = torch.nn.Linear(features, classes)\n"
             "        self.g = torch.nn.Parameter(torch.tensor(1.0))\n"
             "    def forward(self, x):\n"
             "        return self.fc(x.flatten(1)) / self.g\n"
             "def make(input_shape, num_classes):\n"
             "    return Divided(int(torch.tensor(input_shape).prod()), num_classes)\n")


class ScalarGain(nn.Module):
    """A linear layer times a 0-d gain, plus a 0-d buffer."""

    def __init__(self, features: int = 64, classes: int = 10, gain: float = 1.5, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.fc = nn.Linear(features, classes)
        with torch.no_grad():
            self.fc.weight.copy_(torch.randn(classes, features, generator=gen) / features ** 0.5)
            self.fc.bias.copy_(0.1 * torch.randn(classes, generator=gen))
        self.g = nn.Parameter(torch.tensor(gain))
        self.register_buffer("shift", torch.tensor(0.1 * seed))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1)) * self.g + self.shift


class Divided(nn.Module):
    """Logits divided by a 0-d parameter: the loss is not finite where the gain crosses zero."""

    def __init__(self, gain: float, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.fc = nn.Linear(64, 10)
        with torch.no_grad():
            self.fc.weight.copy_(torch.randn(10, 64, generator=gen) / 8)
            self.fc.bias.zero_()
        self.g = nn.Parameter(torch.tensor(gain))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1)) / self.g


class Attention(nn.Module):
    """A token embedding, one attention layer and a classifier of the mean token.

    The attention layer is nn.MultiheadAttention or a direct
    scaled_dot_product_attention call.
    """

    def __init__(self, direct: bool, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.direct = direct
        self.embed = nn.Linear(3, 4)
        if direct:
            self.q, self.k, self.v = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        else:
            self.attn = nn.MultiheadAttention(4, 2, batch_first=True)
        self.head = nn.Linear(4, 2)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        if self.direct:
            h = F.scaled_dot_product_attention(self.q(h), self.k(h), self.v(h))
        else:
            h = self.attn(h, h, h, need_weights=False)[0]
        return self.head(h.mean(1))


def _mean_loss(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(functional_call(model, params, (x,)), y)


def _dense_hessian_eigenvalues(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """Eigenvalues (descending) of the dense Hessian of the mean loss over every parameter.

    From ``torch.func.hessian`` of a ``functional_call`` closure (float64, math attention
    kernel).
    """
    model = model.double()
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    numels = [p.numel() for _, p in model.named_parameters()]
    buffers = dict(model.named_buffers())
    theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def loss(flat: torch.Tensor) -> torch.Tensor:
        params = {n: t.reshape(s) for n, t, s in zip(names, torch.split(flat, numels), shapes)}
        return _mean_loss(model, {**params, **buffers}, x.double(), y)

    with sdpa_kernel(SDPBackend.MATH):
        dense = torch.func.hessian(loss)(theta)
    return np.sort(np.linalg.eigvalsh(dense.numpy()))[::-1]


# --------------------------------------------------------------------------- 0-d parameters
def test_zero_d_parameters_and_buffers_flatten_and_unflatten():
    model = ScalarGain(features=4, classes=3, gain=-2.5, seed=3)
    space = ParameterSpace(model)
    assert {e.name: e.shape for e in space.entries} == {"g": (), "shift": (), "fc.weight": (3, 4), "fc.bias": (3,)}
    vec = space.to_vector(model)
    views = space.unflatten(vec)
    assert views["g"].shape == () and float(views["g"]) == -2.5 and float(views["shift"]) == pytest.approx(0.3)
    batched = space.unflatten(torch.stack([vec, 2 * vec]))
    assert batched["g"].shape == (2,) and batched["g"].tolist() == [-2.5, -5.0]
    fresh = ScalarGain(features=4, classes=3, gain=0.0, seed=9)
    fresh.load_state_dict(space.state_dict(vec))
    assert torch.equal(space.to_vector(fresh), vec)


@pytest.mark.parametrize("strategy", ["loop", "vmap"])
def test_path_of_a_scalar_gain_model_equals_functional_call_by_hand(digits, strategy):
    x, y = digits
    a, b = ScalarGain(gain=1.5, seed=0), ScalarGain(gain=-0.5, seed=1)
    ev = Evaluator(ScalarGain(), (x, y), strategy=strategy, dtype="float64")
    path = interpolate(a, b, ev, alphas=5)
    template = ScalarGain().double()
    sa, sb = a.double().state_dict(), b.double().state_dict()
    for alpha, loss, acc in zip(path.alphas, path.loss, path.accuracy):
        params = {k: (1 - alpha) * sa[k] + alpha * sb[k] for k in sa}
        with torch.no_grad():
            logits = functional_call(template, params, (x.double(),))
        assert loss == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-10)
        assert acc == pytest.approx(float((logits.argmax(1) == y).double().mean()), abs=1e-12)


def test_random_direction_treats_a_zero_d_parameter_as_its_own_filter():
    model = ScalarGain(features=4, classes=3, gain=-2.5, seed=3)
    space = ParameterSpace(model)
    center = space.to_vector(model, dtype=torch.float64)
    at = {e.name: slice(e.offset, e.offset + e.numel) for e in space.entries}
    assert space.entries[0].name == "g"  # the first draw of the generator is the gain's
    draw = float(torch.randn(1, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    for normalization in ("filter", "layer"):
        d = random_direction(space, center, torch.Generator().manual_seed(0), normalization=normalization)
        assert float(d[at["g"]]) == pytest.approx(np.sign(draw) * 2.5, rel=1e-12)  # sign(d) |w|: its own filter
        assert float(d[at["shift"]]) == 0.0 and torch.all(d[at["fc.bias"]] == 0)  # buffers none, biases zeroed
        dim = 1 if normalization == "filter" else None  # per output filter, or the whole tensor
        torch.testing.assert_close(d[at["fc.weight"]].reshape(3, 4).norm(dim=dim),
                                   center[at["fc.weight"]].reshape(3, 4).norm(dim=dim))
    raw = random_direction(space, center, torch.Generator().manual_seed(0), normalization="none")
    assert float(raw[at["g"]]) == draw  # the raw Gaussian draw, not rescaled


def test_hessian_of_a_scalar_gain_model_equals_torch_func_hessian(digits):
    x, y = digits
    model = ScalarGain(features=64, classes=3, gain=0.8, seed=2)
    labels = y % 3
    ev = Evaluator(model, (x, labels), dtype="float64")
    found = hessian_eigen(model, ev, k=3, tol=1e-9, max_iter=300)
    expected = _dense_hessian_eigenvalues(ScalarGain(features=64, classes=3, gain=0.8, seed=2), x, labels)
    np.testing.assert_allclose(found.values, expected[:3], rtol=1e-7)
    assert found.dim == 64 * 3 + 3 + 1  # the 0-d gain is differentiated, the 0-d buffer is not


# --------------------------------------------------------------------------- meta device
def test_a_model_on_the_meta_device_is_refused_clearly(digits):
    x, y = digits
    with torch.device("meta"):
        ghost = nn.Linear(64, 10)
    with pytest.raises(MetaDeviceError, match="Linear is on the meta device: it has shapes but no weights; load "
                                              "or materialise its weights first"):
        Evaluator(ghost, (x, y))
    ev = Evaluator(nn.Linear(64, 10), (x, y))
    with pytest.raises(MetaDeviceError, match="Linear is on the meta device"):
        interpolate(nn.Linear(64, 10), ghost, ev, alphas=3)
    with pytest.raises(MetaDeviceError, match="state_dict is on the meta device"):
        ev.vector(ghost.state_dict())
    tally("bad inputs rejected", 3)


# --------------------------------------------------------------------------- attention curvature
@pytest.mark.parametrize("direct", [False, True], ids=["MultiheadAttention", "scaled_dot_product_attention"])
def test_hessian_through_attention_equals_the_dense_hessian(direct):
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(24, 5, 3, generator=gen), torch.randint(0, 2, (24,), generator=gen)
    model = Attention(direct)
    expected = _dense_hessian_eigenvalues(Attention(direct), x, y)
    ev = Evaluator(model, (x, y), dtype="float64")
    for hvp in ("forward-over-reverse", "reverse-over-reverse", "retained"):
        found = hessian_eigen(model, ev, k=1, tol=1e-9, max_iter=200, hvp=hvp)
        assert found.values[0] == pytest.approx(expected[0], rel=1e-7), hvp
        assert found.spec["attention_kernel"] == "math"


def test_an_op_without_a_second_derivative_raises_curvature_error_naming_it(digits):
    x, y = digits
    model = nn.Linear(64, 10)
    ev = Evaluator(model, (x, y), loss=lambda out, t: F.multi_margin_loss(out, t, reduction="none"))
    for hvp in ("reverse-over-reverse", "retained"):
        with pytest.raises(CurvatureError, match=r"multi_margin_loss has no double backward "
                                                 r"\(aten::multi_margin_loss_backward is not differentiable\)"):
            hessian_eigen(model, ev, hvp=hvp, max_iter=5)
    with pytest.raises(CurvatureError, match="multi_margin_loss has no forward-mode derivative.*"
                                             "hvp='reverse-over-reverse' avoids forward-mode AD"):
        hessian_eigen(model, ev, hvp="forward-over-reverse", max_iter=5)
    tally("bad inputs rejected", 3)


# --------------------------------------------------------------------------- API messages
def test_plane_margins_outside_the_accepted_range_are_refused(digits):
    mlps = [make_mlp(seed) for seed in range(3)]
    ev = Evaluator(mlps[0], digits)
    with pytest.raises(ConfigError, match=r"margin 1e\+308 is too large: the accepted range is \[0, 10\]"):
        landscape.plane(*mlps, ev, margin=1e308)
    for bad in (float("nan"), -0.5, float("inf"), "0.2"):
        with pytest.raises(ConfigError, match=r"margin must be a finite number in \[0, 10\]"):
            landscape.pca_plane(mlps, ev, margin=bad)
    assert ev.points_evaluated == 0
    tally("bad inputs rejected", 5)


def test_weights_so_large_that_arithmetic_overflows_are_named(digits):
    x, y = digits
    near = ScalarGain(seed=0)
    huge = {k: torch.full_like(v, 3e38) for k, v in near.state_dict().items()}
    with pytest.raises(WeightOverflowError, match=r"^a state_dict: weights so large \(max \|w\| = 3e\+38, .*"
                                                  r"overflows float32"):
        interpolate(near, huge, Evaluator(ScalarGain(), (x, y)), alphas=3)
    wide = Evaluator(ScalarGain(), (x, y), dtype=torch.float64)
    assert float(wide.vector(huge).max()) == pytest.approx(3e38, rel=1e-7)  # float64 has the room
    tally("bad inputs rejected", 1)


@pytest.mark.parametrize("value, fragment", [
    ("half", "got 'half'"), ("bfloat16", "autocast='bfloat16'"), (torch.float16, "autocast='float16'"),
    (3, "got 3")])
def test_evaluator_dtype_names_are_accepted_and_others_listed(digits, value, fragment):
    ev = Evaluator(nn.Linear(64, 10), digits, dtype="float64", autocast="bfloat16")
    assert ev.dtype == torch.float64 and ev.options.autocast == torch.bfloat16
    assert Evaluator(nn.Linear(64, 10), digits, dtype="float32", autocast="none").options.autocast is None
    with pytest.raises(ConfigError, match=r"dtype must be one of 'float32', 'float64'") as info:
        Evaluator(nn.Linear(64, 10), digits, dtype=value)
    assert fragment in str(info.value)
    with pytest.raises(ConfigError, match=r"autocast must be one of 'bfloat16', 'float16'.*dtype='float64'"):
        Evaluator(nn.Linear(64, 10), digits, autocast="float64")
    tally("bad inputs rejected", 2)


def test_boolean_and_negative_labels_are_data_errors(digits):
    x, _ = digits
    with pytest.raises(DataError, match=r"labels are booleans, but cross_entropy needs integer class indices >= 0"):
        Evaluator(nn.Linear(64, 10), (x, torch.arange(len(x)) % 2 == 0))
    with pytest.raises(DataError, match=r"\(integer class indices >= 0\); found labels in \[-1, -1\]"):
        Evaluator(nn.Linear(64, 10), (x, torch.full((len(x),), -1)))
    tally("bad inputs rejected", 2)


def test_a_text_file_is_not_a_checkpoint(tmp_path):
    for name in ("notes.pt", "notes.safetensors"):
        (tmp_path / name).write_text("learning rate 0.1, 20 epochs\n")
        with pytest.raises(CheckpointError, match=rf"{name}: is not a checkpoint: it is a text file .*accepted: "
                                                  r"\.pt/\.pth files written by torch\.save and \.safetensors"):
            landscape.load_state_dict(tmp_path / name)
    (tmp_path / "image.pt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(CheckpointError, match="image.pt: is not a checkpoint: it is of an unknown format"):
        landscape.load_state_dict(tmp_path / "image.pt")
    tally("corrupt inputs tried", 3)


def test_nonfinite_points_on_a_path_warn_and_keep_the_nan_barrier(digits):
    from figures import path_figure

    x, y = digits
    a, b = Divided(1.0), Divided(-1.0)  # the gain crosses zero at alpha = 0.5
    ev = Evaluator(Divided(1.0), (x, y))
    with pytest.warns(NonFiniteLossWarning, match=r"path: 1 of 5 points have a non-finite loss \(alpha=0\.5\), "
                                                  "so its loss barrier is not finite"):
        path = interpolate(a, b, ev, alphas=5)
    assert np.isnan(path.loss_barrier) and path.nonfinite == 1 and np.isfinite(path.loss[[0, 1, 3, 4]]).all()
    assert "1 non-finite" in path_figure(path)._suptitle.get_text()  # the figure still draws
    with pytest.warns(NonFiniteLossWarning, match=r"group barrier: 1 of 3 points .*\(the fused model\)"):
        group = group_barrier([a, b], ev)
    assert np.isnan(group.loss_barrier) and np.isfinite(group.member_loss).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteLossWarning)  # finite paths do not warn
        interpolate(a, Divided(0.5), ev, alphas=5)


# --------------------------------------------------------------------------- the CLI
@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """Zoo MLP checkpoints, bad files and folders, and the Divided model's checkpoints.

    Checkpoints a, c, and one of 3e38 weights; a text file named .pt, bad data files, a folder, and
    the Divided model's module file with checkpoints of gain 1 and -1.
    """
    from fl.models import build_model
    from landscape import save_state_dict

    folder = tmp_path_factory.mktemp("messages")
    for seed, name in ((0, "a"), (1, "b"), (2, "c")):
        model = build_model("mlp", num_classes=10, input_shape=(1, 8, 8), seed=seed)
        save_state_dict(model.state_dict(), folder / f"{name}.pt")
    save_state_dict({k: torch.full_like(v, 3e38) for k, v in model.state_dict().items()}, folder / "big.pt")
    (folder / "text.pt").write_text("hello, these are my notes\n")
    (folder / "data_dir").mkdir()
    inputs = np.random.default_rng(0).normal(size=(40, 64)).astype(np.float32)
    np.savez(folder / "bool.npz", inputs=inputs, targets=inputs[:, 0] > 0)
    np.savez(folder / "minus_one.npz", inputs=inputs, targets=-np.ones(40, dtype=np.int64))
    (folder / "gain.py").write_text(GAIN_NETS)
    for gain, name in ((1.0, "up"), (-1.0, "down")):  # the same keys as the file's model: g, fc.weight, fc.bias
        save_state_dict(Divided(gain).state_dict(), folder / f"{name}.pt")
    return {"folder": str(folder), **{p.name: str(p) for p in folder.iterdir()}}


def _m(f: dict[str, str], *ckpts: str, data: str = "digits", module: str = "mlp") -> list[str]:
    return ["--module", module, "--checkpoints", *(f[c] for c in ckpts), "--data", f.get(data, data), "--no-cache",
            "--quiet", "--out", f["folder"] + "/out"]


CLI_CASES = [
    (["plane"], ("a.pt", "b.pt", "c.pt"), {}, ["--margin", "1e308"],
     ["argument --margin", "margin 1e+308 is too large", "accepted range is [0, 10]"]),
    (["path"], ("a.pt", "big.pt"), {}, [], ["big.pt: weights so large (max |w| = 3e+38", "overflows float32"]),
    (["plane"], ("a.pt", "b.pt", "big.pt"), {}, [], ["big.pt: weights so large (max |w| = 3e+38", "overflows float32"]),
    (["path"], ("a.pt", "text.pt"), {}, [], ["text.pt: is not a checkpoint: it is a text file", "accepted: .pt/.pth"]),
    (["path"], ("a.pt", "c.pt"), {"data": "data_dir"}, [],
     ["data_dir is a folder, not data", "name a dataset (digits"]),
    (["path"], ("a.pt", "c.pt"), {"data": "bool.npz"}, [],
     ["bool.npz: targets are booleans, but labels must be integer class indices >= 0"]),
    (["path"], ("a.pt", "c.pt"), {"data": "minus_one.npz"}, [],
     ["labels must be class indices 0..C-1, found the label -1"]),
    (["path"], ("a.pt", "c.pt"), {"module": "tv:resnet18"}, [],
     ["cannot import 'tv': there is no such module (did you mean 'torchvision.models:resnet18'?)",
      "a module spec is a zoo name"]),
]


@pytest.mark.parametrize("words, ckpts, where, extra, fragments", CLI_CASES,
                         ids=[" ".join(c[0] + c[3]) + f" {c[1]} {c[2]}" for c in CLI_CASES])
def test_cli_refusals_are_one_clear_line(files, capsys, words, ckpts, where, extra, fragments):
    line = one_line_error(main([*words, *_m(files, *ckpts, **where), *extra]), capsys.readouterr()[1])
    assert all(f in line for f in fragments), line
    tally("bad inputs rejected")


def test_report_run_given_a_file_says_it_is_not_a_run_folder(files, capsys):
    line = one_line_error(main(["report", "--run", files["a.pt"], "--out", files["folder"] + "/out"]),
                          capsys.readouterr()[1])
    assert f"--run {files['a.pt']} is a file, not a run folder" in line
    tally("bad inputs rejected")


@pytest.mark.parametrize("extra, fragment", [
    (["--dataset", "bogus"], "unknown dataset 'bogus'; choose one of digits, mnist1d"),
    (["--dataset", "cifar-11"], "unknown dataset 'cifar-11' (did you mean 'cifar10'?)"),
    (["--dataset", "mnst", "--model", "mlp"], "unknown dataset 'mnst' (did you mean 'mnist'?)")])
def test_fl_run_unknown_dataset_lists_the_datasets(tmp_path, capsys, extra, fragment):
    from fl.cli import main as fl_main

    code = fl_main([*extra, "--rounds", "1", "--out", str(tmp_path / "run")])
    lines = capsys.readouterr()[1].strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("fl-run: error:") and fragment in lines[0], lines
    assert not (tmp_path / "run").exists()
    tally("bad inputs rejected")


def test_cli_prints_the_nonfinite_warning_once_and_still_draws(files, capsys):
    code = main(["path", *_m(files, "up.pt", "down.pt", module=files["gain.py"] + ":make"), "--alphas", "5"])
    out, err = capsys.readouterr()
    warned = [line for line in err.splitlines() if line.startswith("landscape: warning:")]
    assert code == 0 and len(warned) == 1, err
    assert "path: 1 of 5 points have a non-finite loss (alpha=0.5)" in warned[0] and "Traceback" not in err
    assert re.search(r"^loss_barrier +nan$", out, re.M), out
    assert (files["folder"] + "/out/path.png") in err  # the figure was written
    code = main(["group", *_m(files, "up.pt", "down.pt", module=files["gain.py"] + ":make")])
    err = capsys.readouterr()[1]
    assert code == 0 and [line for line in err.splitlines() if "warning" in line] == [
        "landscape: warning: group barrier: 1 of 3 points have a non-finite loss (the fused model), so its loss "
        "barrier is not finite (kept as NaN/inf, never computed from the finite points alone)"], err
