"""No raw tracebacks and no unbounded work from the command line.

Hostile JSON options, degenerate data files, absurd iteration counts, a diverging curve and a
checkpoint written under a wrong suffix: each is refused with one specific line (exit status 2,
no traceback) before any work is done, and the API refuses the same requests with a specific
exception. Anything unexpected becomes one ``internal error`` line.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from landscape import (
    ConfigError,
    DataError,
    Evaluator,
    NonFiniteWeightsError,
    TrainingDivergedError,
    hessian_density,
    hessian_eigenvalues,
    hessian_trace,
    load_state_dict,
    save_state_dict,
)
from landscape.curvature import budget
from landscape.curvature.hessian import HessianOperator
from landscape.infra import host_memory
from landscape.infra.commandline import MAX_JSON_CHARS, MAX_JSON_DEPTH, json_depth, parse_json
from landscape_cli.main import main

from conftest import make_mlp
from fault_counts import tally

DEEP = "[" * 50_000 + "]" * 50_000
INTERNAL = "please report it with the command line"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """Two zoo-MLP checkpoints (a.pt, c.pt) and hostile data files beside them."""
    from fl.models import build_model

    folder = tmp_path_factory.mktemp("limits")
    for seed, name in ((0, "a.pt"), (1, "c.pt")):
        save_state_dict(build_model("mlp", num_classes=10, input_shape=(1, 8, 8), seed=seed).state_dict(),
                        folder / name)
    x = np.random.default_rng(0).random((20, 64), dtype=np.float32)
    y = np.arange(20, dtype=np.int64) % 10
    np.savez(folder / "empty.npz", inputs=np.zeros((0, 64), np.float32), targets=np.zeros(0, np.int64))
    torch.save((torch.zeros(0, 64), torch.zeros(0, dtype=torch.long)), folder / "empty.pt")
    np.savez(folder / "scalars.npz", inputs=np.float32(1.0), targets=np.int64(1))
    torch.save((torch.tensor(1.0), torch.tensor(1)), folder / "scalars.pt")
    np.savez(folder / "scalar_targets.npz", inputs=x, targets=np.int64(1))
    np.savez(folder / "flat_inputs.npz", inputs=x[:, 0], targets=y)
    huge = y.copy()
    huge[3] = 10**12
    np.savez(folder / "huge_label.npz", inputs=x, targets=huge)
    negative = y.copy()
    negative[0] = -5
    np.savez(folder / "negative_label.npz", inputs=x, targets=negative)
    out = {name: str(folder / name) for name in ("a.pt", "c.pt", "empty.npz", "empty.pt", "scalars.npz",
                                                 "scalars.pt", "scalar_targets.npz", "flat_inputs.npz",
                                                 "huge_label.npz", "negative_label.npz")}
    out["folder"] = str(folder)
    return out


def models(f: dict[str, str], data: str = "digits") -> list[str]:
    """``--module mlp --checkpoints a.pt c.pt --data DATA --no-cache`` with quiet output under the folder."""
    return ["--module", "mlp", "--checkpoints", f["a.pt"], f["c.pt"], "--data", f.get(data, data), "--no-cache",
            "--quiet", "--no-figures", "--out", str(Path(f["folder"]) / "out")]


def one_line(code: int, err: str, prefix: str = "landscape: error:") -> str:
    """The single stderr line of a refused command (exit status 2, no traceback)."""
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), err
    return lines[0]


def refused(argv: list[str], capsys) -> str:
    """Run ``landscape ARGV`` in-process and return its one error line."""
    code = main(argv)
    return one_line(code, capsys.readouterr()[1])


def fl_refused(argv: list[str], capsys) -> str:
    """Run ``fl-run ARGV`` in-process (a usage error exits through SystemExit) and return its one error line."""
    from fl.cli import main as fl_main

    try:
        code = fl_main(argv)
    except SystemExit as exc:
        code = exc.code
    return one_line(code, capsys.readouterr()[1], "fl-run: error:")


@pytest.fixture
def tiny_host(monkeypatch) -> int:
    """The host reports 1 MiB of available memory."""
    monkeypatch.setattr(host_memory, "available_bytes", lambda: 1 << 20)
    return 1 << 20


@pytest.fixture
def no_products(monkeypatch) -> None:
    """Any Hessian-vector product fails the test: refusals must come before the work."""
    def refuse(self, v):
        raise AssertionError("a Hessian-vector product was computed before the refusal")

    monkeypatch.setattr(HessianOperator, "matvec", refuse)


@pytest.fixture(scope="module")
def evaluator(digits) -> Evaluator:
    """A 64-16-10 MLP (1,210 parameters) over 300 digits."""
    return Evaluator(make_mlp(0), digits, progress=False)


# ------------------------------------------------------------------ JSON options
def test_deep_and_long_json_options_are_refused_on_one_line(files, capsys):
    line = refused(["path", *models(files), "--module-kwargs", DEEP], capsys)
    assert "--module-kwargs is nested 50,000 levels deep, more than the limit of 32" in line
    wide = json.dumps({"k": "x" * MAX_JSON_CHARS})
    line = refused(["path", *models(files), "--module-kwargs", wide], capsys)
    assert f"--module-kwargs has {len(wide):,} characters, more than the limit of {MAX_JSON_CHARS:,}" in line
    line = refused(["train", "--partition-options", DEEP], capsys)
    assert "argument --partition-options: the JSON value is nested 50,000 levels deep" in line
    line = fl_refused(["--partition-options", DEEP], capsys)
    assert "argument --partition-options: the JSON value is nested 50,000 levels deep" in line
    line = fl_refused(["--option", "partition_options=" + DEEP], capsys)
    assert "argument --option/-o: the JSON value is nested 50,000 levels deep" in line
    tally("bad inputs rejected", 5)


def test_an_integer_longer_than_python_converts_in_a_json_option_is_refused_on_one_line(files, capsys):
    """Refused as not JSON, not with Python's ValueError advising sys.set_int_max_str_digits()."""
    huge = "1" * 5001
    words = "an integer of 5,001 digits (Python converts at most 4,300; this toolkit never writes one)"
    line = refused(["path", *models(files), "--module-kwargs", f'{{"hidden": {huge}}}'], capsys)
    assert f"--module-kwargs must be JSON: {words}" in line
    with pytest.raises(ConfigError, match=re.escape(f"x must be JSON: {words}")):
        parse_json(f"[{huge}]", "x")
    assert parse_json("[" + "9" * 4300 + "]", "x") == [int("9" * 4300)]  # Python's limit itself is accepted
    tally("bad inputs rejected", 2)


def test_json_depth_ignores_brackets_inside_strings():
    texts = ('1', '[1, 2]', '{"a": [1]}', '"[[[\\"[["', '["]", ["\\\\", []]]')
    assert [json_depth(t) for t in texts] == [0, 1, 2, 0, 3]
    nested = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert parse_json(nested, "x") == json.loads(nested)  # the limit itself is accepted
    assert parse_json("last", "x", text_if_invalid=True) == "last"
    with pytest.raises(ConfigError, match="x must be JSON"):
        parse_json("{", "x")
    with pytest.raises(ConfigError, match=f"x is nested {MAX_JSON_DEPTH + 1} levels deep"):
        parse_json("[" + nested + "]", "x")


# ------------------------------------------------------------------ data files
@pytest.mark.parametrize("data, fragment", [
    ("empty.npz", "empty.npz: holds no samples (0 inputs and 0 targets)"),
    ("empty.pt", "empty.pt: holds no samples (0 inputs and 0 targets)"),
    ("scalars.npz", "scalars.npz: inputs have shape (), but they need one row of at least one value per sample"),
    ("scalars.pt", "scalars.pt: inputs have shape (), but they need one row of at least one value per sample"),
    ("flat_inputs.npz", "flat_inputs.npz: inputs have shape (20,), but they need one row"),
    ("scalar_targets.npz", "scalar_targets.npz: targets have shape (), but they need one target per sample"),
    ("huge_label.npz", "the largest label is 1,000,000,000,000, but at most 100,000 classes are inferred"),
    ("negative_label.npz", "labels must be class indices 0..C-1, found the label -5"),
])
def test_degenerate_data_files_are_refused(files, capsys, data, fragment):
    line = refused(["path", *models(files, data)], capsys)
    assert fragment in line, line
    tally("bad inputs rejected")


def test_class_counts_are_bounded_without_allocating(files, capsys):
    line = refused(["path", *models(files), "--num-classes", str(10**12)], capsys)
    assert "argument --num-classes: must be an integer >= 1 and <= 100000, got '1000000000000'" in line
    # a label far beyond the model's outputs is checked against them, never used to size a model
    line = refused(["path", *models(files, "huge_label.npz"), "--num-classes", "10"], capsys)
    assert "labels must lie in [0, 9] for a model with 10 outputs; found labels in [0, 1000000000000]" in line
    tally("bad inputs rejected", 2)


# ------------------------------------------------------------------ iteration counts
@pytest.mark.parametrize("argv, fragment", [
    (["trace", "--max-iter", "1000000000000"], "argument --max-iter: must be an integer >= 1 and <= 100000"),
    (["hessian", "--max-iter", "1000000000000"], "argument --max-iter: must be an integer >= 1 and <= 100000"),
    (["hessian", "--density", "--iterations", "1000000000"], "argument --iterations: must be an integer >= 1 and "
                                                              "<= 100000"),
    (["density", "--iterations", "1000000000"], "argument --iterations: must be an integer >= 1 and <= 100000"),
    (["density", "--runs", "1000000000"], "argument --runs: must be an integer >= 1 and <= 1000"),
    (["check", "flatter", "--density-iterations", "1000000000"], "argument --density-iterations: must be an "
                                                                  "integer >= 1 and <= 100000"),
])
def test_iteration_counts_have_documented_limits(files, capsys, no_products, argv, fragment):
    line = refused([*argv, *models(files)], capsys)
    assert fragment in line, line
    tally("bad inputs rejected")


def test_the_api_bounds_iteration_counts_before_any_product(evaluator, no_products):
    model = make_mlp(1)
    with pytest.raises(ConfigError, match=r"iterations must lie in \[1, 100,000\], got 1,000,000,000"):
        hessian_density(model, evaluator, iterations=10**9)
    with pytest.raises(ConfigError, match=r"runs must lie in \[1, 1,000\], got 1,000,000,000"):
        hessian_density(model, evaluator, runs=10**9)
    with pytest.raises(ConfigError, match=r"max_iter must lie in \[1, 100,000\], got 1,000,000,000,000"):
        hessian_trace(model, evaluator, max_iter=10**12)
    with pytest.raises(ConfigError, match=r"max_iter must lie in \[1, 100,000\], got 1,000,000,000,000"):
        hessian_eigenvalues(model, evaluator, max_iter=10**12)
    tally("bad inputs rejected", 4)


def test_solvers_larger_than_the_memory_are_refused_with_the_estimate(evaluator, tiny_host, no_products):
    model, size = make_mlp(1), evaluator.space.size
    basis = host_memory.format_bytes(budget.lanczos_bytes(500, size, torch.float32))
    with pytest.raises(ConfigError, match=rf"iterations=500 \(a Lanczos basis of 500 vectors of {size:,} parameters\) "
                                          rf"needs about {basis} of memory, but only 1.0 MiB are available; "
                                          "choose fewer iterations"):
        hessian_density(model, evaluator, iterations=500)
    sketch = host_memory.format_bytes(budget.sketch_bytes(300, size, torch.float32))
    with pytest.raises(ConfigError, match=rf"max_iter=900 \(a Hutch\+\+ sketch of 300 vectors .* needs about "
                                          rf"{sketch} of memory, but only 1.0 MiB"):
        hessian_trace(model, evaluator, max_iter=900)
    with pytest.raises(ConfigError, match=r"k=100 \(a Lanczos basis of 320 vectors .* but only 1.0 MiB"):
        hessian_eigenvalues(model, evaluator, k=100, max_iter=1000)
    # the estimate grows with the basis and is capped where the solvers cap it (the operator's size)
    assert budget.lanczos_bytes(10, 100, torch.float64) == 11 * 100 * 8 + 3 * 10 * 10 * 8
    assert budget.sketch_bytes(10, 100, torch.float32) == 10 * 100 * (3 * 4 + 16)
    tally("bad inputs rejected", 3)


def test_density_memory_refusal_reaches_the_command_line(files, capsys, tiny_host, no_products):
    line = refused(["density", *models(files), "--iterations", "5000"], capsys)
    assert "iterations=5,000 (a Lanczos basis of 5,000 vectors of 8,970 parameters) needs about" in line
    assert "but only 1.0 MiB are available; choose fewer iterations" in line
    tally("bad inputs rejected")


# ------------------------------------------------------------------ diverging curves
def test_a_diverging_curve_is_an_error_not_a_null_barrier(files, capsys):
    out = Path(files["folder"]) / "out"
    line = refused(["curve", *models(files), "--lr", "1e30", "--epochs", "1", "--json"], capsys)
    assert "curve training diverged in epoch 0: the loss became NaN or infinite with lr=1e+30" in line
    assert "lower the learning rate" in line
    assert not (out / "curve.json").exists()
    tally("bad inputs rejected")


@pytest.mark.parametrize("lr, epochs, fragment", [
    # one minibatch per epoch: the last step leaves finite but huge bends, whose loss is not finite
    (1e30, 1, "epoch 0: the loss on the trained curve became NaN or infinite with lr=1e+30"),
    (1e30, 3, "epoch 1: the loss became NaN or infinite with lr=1e+30"),
    (1e12, 3, "epoch 2: the loss became NaN or infinite with lr=1e+12"),
])
def test_the_curve_api_raises_when_training_diverges(digits, lr, epochs, fragment):
    from landscape import curve

    x, y = digits
    ev = Evaluator(make_mlp(0), (x, y), progress=False)
    with pytest.raises(TrainingDivergedError, match=f"curve training diverged in {re.escape(fragment)}") as exc:
        curve(make_mlp(1), make_mlp(2), ev, train_data=(x[:64], y[:64]), lr=lr, epochs=epochs, batch_size=64)
    assert isinstance(exc.value, NonFiniteWeightsError)
    # a large but finite learning rate still gives an (honest, huge) finite barrier
    assert np.isfinite(curve(make_mlp(1), make_mlp(2), ev, train_data=(x[:64], y[:64]), lr=1e4, epochs=1,
                             batch_size=64).loss_barrier)
    tally("bad inputs rejected")


def test_curve_training_labels_must_fit_the_outputs(digits):
    from landscape import curve

    x, y = digits
    ev = Evaluator(make_mlp(0), (x, y), progress=False)
    with pytest.raises(DataError, match=r"labels must lie in \[0, 9\] for a model with 10 outputs"):
        curve(make_mlp(1), make_mlp(2), ev, train_data=(x[:64], y[:64] + 10), epochs=1)
    tally("bad inputs rejected")


# ------------------------------------------------------------------ checkpoint suffixes
def test_align_refuses_a_save_path_without_a_checkpoint_suffix(files, capsys, monkeypatch):
    import landscape_cli.connectivity_commands as commands

    monkeypatch.setattr(commands, "match", lambda *a, **k: pytest.fail("aligned before refusing the suffix"))
    target = Path(files["folder"]) / "x.txt"
    line = refused(["align", *models(files), "--save", str(target)], capsys)
    assert "argument --save:" in line and "'.txt'" in line and ".safetensors, .pt or .pth" in line
    assert not target.exists()
    with pytest.raises(ConfigError, match=r"x\.txt: .*\.safetensors, \.pt or \.pth"):
        commands.align_file(files["a.pt"], files["c.pt"], target, template=make_mlp(0))
    with pytest.raises(ConfigError, match=r"no suffix"):
        save_state_dict(make_mlp(0).state_dict(), Path(files["folder"]) / "weights")
    assert not target.exists() and not (Path(files["folder"]) / "weights").exists()
    tally("bad inputs rejected", 3)


@pytest.mark.parametrize("suffix", [".pt", ".pth", ".safetensors"])
def test_checkpoint_suffixes_pick_a_safe_format(tmp_path, suffix):
    state = make_mlp(0).state_dict()
    path = save_state_dict(state, tmp_path / f"m{suffix}")
    if suffix != ".safetensors":  # a plain tensor dict: readable without unpickling anything else
        torch.load(path, weights_only=True)
    loaded = load_state_dict(path)
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


# ------------------------------------------------------------------ the last resort
def test_unexpected_exceptions_are_one_internal_error_line(files, capsys, monkeypatch):
    import fl.cli
    import landscape_cli.commands.path as path_command

    def boom(args):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(path_command, "run", boom)
    line = refused(["path", *models(files)], capsys)
    assert line == f"landscape: error: internal error (RuntimeError: boom second line); {INTERNAL}"
    monkeypatch.setattr(fl.cli, "run_from_args", boom)
    line = fl_refused(["--rounds", "1"], capsys)
    assert line == f"fl-run: error: internal error (RuntimeError: boom second line); {INTERNAL}"
    tally("bad inputs rejected", 2)


@pytest.mark.parametrize("argv, fragment", [
    (["landscape", "path", "--module", "mlp", "--checkpoints", "a.pt", "c.pt", "--data", "digits", "--no-cache",
      "--module-kwargs", DEEP], "--module-kwargs is nested 50,000 levels deep"),
    (["fl-run", "--partition-options", DEEP], "argument --partition-options: the JSON value is nested 50,000"),
])
def test_console_scripts_never_print_a_traceback(files, argv, fragment):
    exe = Path(sys.executable).with_name(argv[0])
    proc = subprocess.run([str(exe), *argv[1:]], capture_output=True, text=True, timeout=300, cwd=files["folder"])
    line = one_line(proc.returncode, proc.stderr, f"{argv[0]}: error:")
    assert fragment in line
    tally("bad inputs rejected")
