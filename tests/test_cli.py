"""The ``landscape`` command: help everywhere, one-line errors, and numbers equal to the Python API's."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from landscape import Evaluator, group_barrier, interpolate, random_plane
from landscape.claims import transitivity
from landscape_cli.main import build_parser, main

SUBCOMMANDS = [["train"], ["path"], ["plane"], ["group"], ["hessian"], ["trace"], ["density"], ["decompose"],
               ["check"], ["report"], ["align"], ["curve"], ["merge"],
               ["check", "transitivity"], ["check", "group"], ["check", "shared-basin"], ["check", "flatter"]]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Three zoo MLP checkpoints (.pt, .pt, .safetensors) and the digits test split."""
    from fl.datasets import load_dataset
    from fl.models import build_model
    from landscape import save_state_dict

    folder = tmp_path_factory.mktemp("ckpt")
    paths = []
    for seed, suffix in ((0, ".pt"), (1, ".pt"), (2, ".safetensors")):
        model = build_model("mlp", num_classes=10, input_shape=(1, 8, 8), seed=seed)
        paths.append(save_state_dict(model.state_dict(), folder / f"m{seed}{suffix}"))
    bundle = load_dataset("digits")
    template = build_model("mlp", num_classes=10, input_shape=(1, 8, 8), seed=0)
    return folder, paths, (bundle.test_x, bundle.test_y), template


def run_cli(args, capsys):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("cmd", SUBCOMMANDS, ids=" ".join)
def test_help_everywhere(cmd, capsys):
    code, out, err = run_cli([*cmd, "--help"], capsys)
    assert code == 0 and "usage: landscape" in out and err == ""


def test_every_subcommand_is_listed(capsys):
    parser = build_parser()
    code, out, _ = run_cli(["--help"], capsys)
    assert code == 0
    for name in ("train", "path", "plane", "group", "hessian", "trace", "density", "decompose", "check", "report",
                 "align", "curve", "merge"):
        assert name in out
    assert parser.prog == "landscape"


@pytest.mark.parametrize("argv, fragment", [
    (["path", "--bogus"], "unrecognized arguments"),
    (["path"], "no models given"),
    (["path", "--module", "mlp", "--checkpoints", "{m0}", "--data", "digits"], "needs exactly 2 models"),
    (["path", "--module", "mlp", "--checkpoints", "{m0}", "{folder}/missing.pt", "--data", "digits"], "file not found"),
    (["path", "--module", "nosuchpkg:factory", "--checkpoints", "{m0}", "{m1}", "--data", "digits"], "cannot import"),
    (["path", "--module", "mlp", "--checkpoints", "{m0}", "{m1}", "--data", "{folder}/nodata.npz"], "not found"),
    (["check", "transitivity", "--run", "{folder}/norun", "--models", "global"], "run directory"),
])
def test_user_errors_print_one_line_and_exit_2(argv, fragment, ckpts, capsys):
    folder, paths, _, _ = ckpts
    argv = [a.format(m0=paths[0], m1=paths[1], folder=folder) for a in argv]
    code, out, err = run_cli([*argv, "--out", folder / "out"], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("landscape: error:") and fragment in lines[0], err


def test_console_script_error_is_one_line_without_traceback(tmp_path):
    exe = Path(sys.executable).with_name("landscape")
    assert exe.exists(), "the console script is installed with the package"
    proc = subprocess.run([str(exe), "plane", "--module", "mlp", "--checkpoints", str(tmp_path / "x.pt"),
                           str(tmp_path / "y.pt"), str(tmp_path / "z.pt"), "--data", "digits"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"landscape: error: {tmp_path / 'x.pt'}: file not found"]
    assert "Traceback" not in proc.stderr


def test_path_json_equals_python_api(ckpts, capsys, tmp_path):
    _, paths, data, template = ckpts
    code, out, err = run_cli(["path", "--module", "mlp", "--checkpoints", paths[0], paths[2], "--data", "digits",
                              "--alphas", 6, "--alpha-range", -0.5, 1.5, "--out", tmp_path, "--json"], capsys)
    assert code == 0, err
    printed = json.loads(out)
    written = json.loads((tmp_path / "path.json").read_text())
    assert printed == written and written["models"] == ["m0", "m2"]
    api = interpolate(paths[0], paths[2], Evaluator(template, data),
                      alphas=np.union1d(np.linspace(-0.5, 1.5, 6), [0.0, 1.0]))
    nums = written["numbers"]
    np.testing.assert_allclose(nums["alphas"], api.alphas)
    np.testing.assert_allclose(nums["loss"], api.loss, rtol=1e-12)
    np.testing.assert_allclose(nums["accuracy"], api.accuracy, rtol=1e-12)
    assert nums["loss_barrier"] == pytest.approx(api.loss_barrier, rel=1e-12, abs=1e-15)
    assert nums["accuracy_barrier"] == pytest.approx(api.accuracy_barrier, rel=1e-12, abs=1e-15)
    # figures and the HDF5 cache are written next to the JSON
    assert (tmp_path / "path.png").stat().st_size > 0 and (tmp_path / "path.html").stat().st_size > 0
    from landscape.cache.store import Cache

    assert Cache(tmp_path / "landscape_cache").keys()["results"]
    # a rerun reads every point from the cache and prints the same numbers as a table
    code, table, _ = run_cli(["path", "--module", "mlp", "--checkpoints", paths[0], paths[2], "--data", "digits",
                              "--alphas", 6, "--alpha-range", -0.5, 1.5, "--out", tmp_path, "--no-figures"], capsys)
    assert code == 0 and f"{api.loss_barrier:.6g}" in table


def test_module_file_factory_and_npz_data(tmp_path, capsys):
    (tmp_path / "nets.py").write_text(
        "import torch\n"
        "def make(input_shape, num_classes, hidden=4):\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(input_shape[0], hidden),\n"
        "                               torch.nn.ReLU(), torch.nn.Linear(hidden, num_classes))\n")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 3, generator=gen)
    y = (x[:, 0] > 0).long()
    np.savez(tmp_path / "data.npz", inputs=x.numpy(), targets=y.numpy())
    import importlib.util

    spec = importlib.util.spec_from_file_location("nets_ref", tmp_path / "nets.py")
    nets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nets)
    models = []
    for seed in range(3):
        m = nets.make((3,), 2, hidden=5)
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))
        torch.save(m.state_dict(), tmp_path / f"w{seed}.pt")
        models.append(m)
    args = ["check", "transitivity", "--module", f"{tmp_path / 'nets.py'}:make", "--module-kwargs", '{"hidden": 5}',
            "--checkpoints", *(tmp_path / f"w{i}.pt" for i in range(3)), "--data", tmp_path / "data.npz",
            "--alphas", 5, "--out", tmp_path / "o", "--json", "--no-figures", "--threshold", 0.2]
    code, out, err = run_cli(args, capsys)
    verdict = transitivity(*models, Evaluator(models[0], (x, y)), alphas=5, threshold=0.2)
    nums = json.loads(out)["numbers"]
    assert code == (0 if verdict.holds else 1), err
    assert nums["status"] == verdict.status
    for key in ("barrier_w1_anchor", "barrier_w2_anchor", "barrier_w1_w2", "fused_acc"):
        assert nums[key] == pytest.approx(verdict.numbers[key], abs=1e-12)
    # identical models: the claim holds, exit status 0
    same = [tmp_path / "w0.pt"] * 3
    code, out, _ = run_cli([*args[:7], *same, *args[10:]], capsys)
    assert code == 0 and json.loads(out)["numbers"]["holds"] is True


def test_flat_model_on_the_built_in_digits_needs_flatten_and_says_so(tmp_path, capsys):
    from fl.datasets import load_dataset

    (tmp_path / "flat.py").write_text(
        "import torch\n"
        "def make(num_classes, **_):\n"
        "    return torch.nn.Sequential(torch.nn.Linear(64, 8), torch.nn.ReLU(), torch.nn.Linear(8, num_classes))\n")
    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Linear(64, 8), torch.nn.ReLU(), torch.nn.Linear(8, 10)) for _ in range(2)]
    for i, net in enumerate(nets):
        torch.save(net.state_dict(), tmp_path / f"m{i}.pt")
    args = ["path", "--module", f"{tmp_path / 'flat.py'}:make", "--checkpoints", tmp_path / "m0.pt",
            tmp_path / "m1.pt", "--data", "digits", "--alphas", 3, "--out", tmp_path / "o", "--json", "--no-figures"]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "flattened to shape (64,)" in err and "--flatten" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_cli([*args, "--flatten"], capsys)
    digits = load_dataset("digits")
    expected = interpolate(nets[0], nets[1], Evaluator(nets[0], (digits.test_x.reshape(len(digits.test_x), -1),
                                                                 digits.test_y)), alphas=3)
    assert code == 0, err
    np.testing.assert_allclose(json.loads(out)["numbers"]["loss"], expected.loss, rtol=1e-12)


def test_fl_run_train_group_decompose_and_report(tmp_path, capsys):
    import fl

    run_dir = tmp_path / "run"
    code, out, err = run_cli(["train", "--clients", 3, "--rounds", 1, "--out", run_dir, "--no-progress"], capsys)
    assert code == 0, err
    run = fl.load_run(run_dir)
    assert run.rounds == [0, 1]
    code, out, err = run_cli(["group", "--run", run_dir, "--out", tmp_path / "g", "--json", "--no-figures",
                              "--no-cache"], capsys)
    assert code == 0, err
    nums = json.loads(out)["numbers"]
    ds = run.test_dataset()
    api = group_barrier(list(run.client_states(1).values()), Evaluator(run.module(), ds.tensors))
    assert nums["size"] == 3
    assert nums["loss_barrier"] == pytest.approx(api.loss_barrier, abs=1e-12)
    assert nums["accuracy_barrier"] == pytest.approx(api.accuracy_barrier, abs=1e-12)
    code, out, err = run_cli(["decompose", "--run", run_dir, "--out", tmp_path / "d", "--json", "--no-cache"], capsys)
    assert code == 0, err
    from landscape import decompose

    states = run.client_states(1)
    data = run.client_datasets()
    dec = decompose([states[k] for k in sorted(states)], [data[k].tensors for k in sorted(states)],
                    Evaluator(run.module(), ds.tensors))
    nums = json.loads(out)["numbers"]
    for term in ("bias", "heter_bias", "wens_loss", "fma_loss", "gap"):
        assert nums[term] == pytest.approx(getattr(dec, term), abs=1e-12)
    code, _, err = run_cli(["report", "--run", run_dir, "--resolution", 5, "--alphas", 5], capsys)
    assert code == 0, err
    page = (run_dir / "report" / "index.html").read_text()
    assert "Shared basin" in page and "Group barrier" in page and f"{api.accuracy_barrier:.4g}" in page


def test_curvature_commands_pass_every_option_to_the_api(ckpts, capsys, tmp_path):
    from landscape import hessian_density, hessian_eigen, hessian_trace

    _, paths, data, template = ckpts
    base = ["--module", "mlp", "--checkpoints", paths[0], "--data", "digits", "--out", tmp_path, "--json",
            "--no-figures", "--no-cache", "--quiet", "--hvp", "reverse-over-reverse", "--seed", 3]
    ev = Evaluator(template, data, progress=False)
    code, out, err = run_cli(["trace", *base, "--method", "hutch++", "--max-iter", 24, "--min-samples", 4,
                              "--tol", 1e-9], capsys)
    assert code == 0, err
    api = hessian_trace(paths[0], ev, method="hutch++", max_iter=24, min_samples=4, tol=1e-9, seed=3,
                        hvp="reverse-over-reverse")
    nums = json.loads(out)["numbers"]["m0"]
    assert nums["method"] == "hutch++" and nums["hvps"] == api.matvecs
    assert nums["trace"] == pytest.approx(api.value, rel=1e-9) and nums["stderr"] == pytest.approx(api.stderr, rel=1e-9)
    code, out, err = run_cli(["density", *base, "--iterations", 12, "--runs", 2, "--grid-size", 101], capsys)
    assert code == 0, err
    dens = hessian_density(paths[0], ev, iterations=12, runs=2, grid_size=101, seed=3, hvp="reverse-over-reverse")
    nums = json.loads(out)["numbers"]["m0"]
    assert nums["grid_range"] == pytest.approx([dens.grid[0], dens.grid[-1]], rel=1e-9)
    assert nums["largest_node"] == pytest.approx(float(dens.nodes.max()), rel=1e-9)
    code, out, err = run_cli(["hessian", *base, "--method", "power", "--k", 2, "--max-iter", 30], capsys)
    assert code == 0, err
    eig = hessian_eigen(paths[0], ev, method="power", k=2, max_iter=30, seed=3, hvp="reverse-over-reverse")
    np.testing.assert_allclose(json.loads(out)["numbers"]["m0"]["eigenvalues"], eig.values, rtol=1e-9)


def test_train_has_every_flag_of_fl_run(capsys):
    from fl.cli import main as fl_main

    with pytest.raises(SystemExit) as stop:  # fl-run's --help exits through argparse
        fl_main(["--help"])
    assert stop.value.code == 0
    fl_help = capsys.readouterr()[0]
    code, train_help, _ = run_cli(["train", "--help"], capsys)
    assert code == 0
    fl_flags = set(re.findall(r"(--[a-z][a-z0-9+-]*)", fl_help))
    assert len(fl_flags) > 20 and fl_flags <= set(re.findall(r"(--[a-z][a-z0-9+-]*)", train_help))


def _mlp_states(tmp_path):
    """A module file with a one-hidden-layer MLP, data, a model A and B = A with its hidden units permuted."""
    (tmp_path / "nets.py").write_text(
        "import torch\n"
        "def make(input_shape, num_classes):\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(input_shape[0], 6),\n"
        "                               torch.nn.ReLU(), torch.nn.Linear(6, num_classes))\n")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(60, 3, generator=gen)
    y = (x[:, 0] + x[:, 1] > 0).long()
    np.savez(tmp_path / "data.npz", inputs=x.numpy(), targets=y.numpy())
    np.savez(tmp_path / "train.npz", inputs=x.numpy()[:40], targets=y.numpy()[:40])
    a = {"1.weight": torch.randn(6, 3, generator=gen), "1.bias": torch.randn(6, generator=gen),
         "3.weight": torch.randn(2, 6, generator=gen), "3.bias": torch.randn(2, generator=gen)}
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    b = {"1.weight": a["1.weight"][perm], "1.bias": a["1.bias"][perm], "3.weight": a["3.weight"][:, perm],
         "3.bias": a["3.bias"]}
    torch.save(a, tmp_path / "a.pt")
    torch.save(b, tmp_path / "b.pt")
    return a, (x, y)


def test_align_recovers_a_permuted_copy_exactly(tmp_path, capsys):
    from landscape import load_state_dict

    a, _ = _mlp_states(tmp_path)
    code, out, err = run_cli(["align", "--module", f"{tmp_path / 'nets.py'}:make", "--checkpoints", tmp_path / "b.pt",
                              tmp_path / "a.pt", "--data", tmp_path / "data.npz", "--save", tmp_path / "b_aligned.pt",
                              "--out", tmp_path / "o", "--json", "--no-figures", "--no-cache", "--quiet"], capsys)
    assert code == 0, err
    nums = json.loads(out)["numbers"]
    aligned = load_state_dict(tmp_path / "b_aligned.pt")
    for name, tensor in a.items():  # B is A with permuted hidden units: alignment undoes the permutation
        torch.testing.assert_close(aligned[name], tensor, rtol=0, atol=0)
    assert nums["units_moved"] > 0 and nums["loss_barrier_after"] == 0.0 and nums["accuracy_barrier_after"] == 0.0


def test_curve_equals_the_api(tmp_path, capsys):
    from landscape_cli.connectivity_commands import curve_summary

    _, data = _mlp_states(tmp_path)
    args = ["curve", "--module", f"{tmp_path / 'nets.py'}:make", "--checkpoints", tmp_path / "a.pt",
            tmp_path / "b.pt", "--data", tmp_path / "data.npz", "--train-data", tmp_path / "train.npz",
            "--epochs", 2, "--points", 5, "--train-batch-size", 16, "--seed", 4, "--out", tmp_path / "o", "--json",
            "--no-cache", "--quiet"]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    nums = json.loads(out)["numbers"]
    from landscape_cli.modelspec import build_module

    template = build_module(f"{tmp_path / 'nets.py'}:make", input_shape=(3,), num_classes=2)
    train = np.load(tmp_path / "train.npz")
    api = curve_summary(tmp_path / "a.pt", tmp_path / "b.pt", Evaluator(template, data, progress=False),
                        train_data=(torch.as_tensor(train["inputs"]), torch.as_tensor(train["targets"])),
                        epochs=2, points=5, batch_size=16, seed=4)
    for key in ("loss_barrier", "accuracy_barrier", "line_loss_barrier", "max_loss"):
        assert nums[key] == pytest.approx(api[key], rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(nums["history"], api["history"], rtol=1e-9)


def test_bn_recompute_on_a_run_uses_its_training_data_and_says_so(tmp_path, capsys):
    import fl
    from landscape_cli.runs import run_data

    run_dir = tmp_path / "run"
    fl.run("fedavg", dataset="digits", model="fedgucci_cnn", clients=2, rounds=1, local_epochs=1, out=run_dir,
           seed=0)
    code, out, err = run_cli(["path", "--run", run_dir, "--models", "client:0", "client:1", "--bn", "recompute",
                              "--alphas", 3, "--out", tmp_path / "p", "--json", "--no-figures", "--no-cache"], capsys)
    assert code == 0, err
    assert "re-estimates BatchNorm statistics on the run's training data" in err
    run = fl.load_run(run_dir)
    states = run.client_states(1)
    api = interpolate(states[0], states[1], Evaluator(run.module(), run.test_dataset().tensors, bn="recompute",
                                                      bn_data=run_data(run, "train")), alphas=3)
    assert json.loads(out)["numbers"]["loss_barrier"] == pytest.approx(api.loss_barrier, rel=1e-9)


def test_random_plane_auto_span_equals_the_api(ckpts, capsys, tmp_path):
    _, paths, data, template = ckpts
    code, out, err = run_cli(["plane", "--module", "mlp", "--checkpoints", paths[0], "--data", "digits",
                              "--kind", "random", "--span", "auto", "--resolution", 3, "--out", tmp_path, "--json",
                              "--no-figures"], capsys)
    assert code == 0, err
    api = random_plane(paths[0], Evaluator(template, data), resolution=3, span="auto")
    nums = json.loads((tmp_path / "plane.json").read_text())["numbers"]
    assert 0 < api.spec["span"] != 1.0  # the rule chose a span, not the default
    assert nums["span"] == pytest.approx(api.spec["span"], rel=1e-12)
    assert nums["x_range"] == pytest.approx([-api.spec["span"], api.spec["span"]], rel=1e-12)
    assert nums["min_loss"] == pytest.approx(float(np.nanmin(api.loss)), rel=1e-12)
    assert nums["diagnostics"] == api.diagnostics.notes
    code, _, err = run_cli(["plane", "--module", "mlp", "--checkpoints", paths[0], "--data", "digits",
                            "--kind", "random", "--span", "autox"], capsys)
    assert code == 2 and "span must be a positive number or 'auto', got 'autox'" in err
