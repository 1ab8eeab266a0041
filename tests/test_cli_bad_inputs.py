"""A corpus of bad ``landscape`` invocations.

Each exits non-zero with exactly one line on stderr, no traceback, and a message naming the
offending option (or file).

Most cases run in-process through ``main(argv)``; a few go through the installed console
scripts to check what a shell user sees.
"""
from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest
import torch

from landscape import ConfigError
from landscape.evaluation.options import EvaluatorOptions
from landscape.infra import host_memory
from landscape.infra.flags import literal_choices
from landscape_cli.evaluator_flags import ELSEWHERE, evaluator_options
from landscape_cli.main import build_parser, main

from fault_counts import tally

NETS = ("import torch\n"
        "def make(input_shape, num_classes, hidden=5):\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(input_shape[0], hidden),\n"
        "                               torch.nn.ReLU(), torch.nn.Linear(hidden, num_classes))\n"
        "def broken():\n"
        "    raise RuntimeError('the factory fails')\n")
HUGE_SEED = str(2**70)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """A module file, data files (good and bad labels) and checkpoints (good, integer, boolean weights)."""
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("bad_inputs")
    (folder / "nets.py").write_text(NETS)
    (folder / "boom.py").write_text("raise ValueError('this module fails on import')\n")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=gen)
    y = (x[:, 0] > 0).long()
    np.savez(folder / "data.npz", inputs=x.numpy(), targets=y.numpy())
    np.savez(folder / "float_labels.npz", inputs=x.numpy(), targets=y.numpy().astype(np.float32))
    np.savez(folder / "column_labels.npz", inputs=x.numpy(), targets=y.numpy().reshape(-1, 1))
    np.savez(folder / "pickled.npz", inputs=np.array([{"a": 1}] * 40, dtype=object), targets=y.numpy())
    torch.save(({"a": 1}, {"b": 2}), folder / "dicts.pt")
    paths = {}
    for seed in range(3):
        torch.manual_seed(seed)
        state = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3, 5), torch.nn.ReLU(),
                                    torch.nn.Linear(5, 2)).state_dict()
        torch.save(state, folder / f"m{seed}.pt")
        if seed == 0:
            save_file({k: (v * 10).to(torch.int32) for k, v in state.items()}, str(folder / "int.safetensors"))
            save_file({k: v > 0 for k, v in state.items()}, str(folder / "bool.safetensors"))
    paths.update({name: str(folder / name) for name in ("m0.pt", "m1.pt", "m2.pt", "int.safetensors",
                                                        "bool.safetensors", "data.npz", "float_labels.npz",
                                                        "column_labels.npz", "pickled.npz", "dicts.pt")})
    paths["module"] = f"{folder / 'nets.py'}:make"
    paths["out"] = str(folder / "out")
    paths["folder"] = str(folder)
    return paths


def models(f: dict[str, str], *ckpts: str, data: str = "data.npz") -> list[str]:
    """Module, checkpoints and data arguments, plus quiet output without a cache.

    Figures stay on: the size limits count them.
    """
    names = ckpts or ("m0.pt", "m1.pt", "m2.pt")
    return ["--module", f["module"], "--checkpoints", *(f[c] for c in names), "--data", f[data],
            "--out", f["out"], "--no-cache", "--quiet"]


# (command words, extra arguments, checkpoints (None: three good ones), data file, fragment the message contains,
#  fragment it must not contain)
CORPUS = [
    # meaningless values
    (["plane"], ["--span", "0", "--kind", "random"], None, "data.npz", "--span", None),
    (["plane"], ["--level", "nan"], None, "data.npz", "--level", None),
    (["plane"], ["--level", "inf"], None, "data.npz", "--level", None),
    (["plane"], ["--margin", "nan"], None, "data.npz", "--margin", "no models to place"),
    (["plane"], ["--margin", "-0.5"], None, "data.npz", "--margin", None),
    (["check", "transitivity"], ["--threshold", "-1"], None, "data.npz", "--threshold", None),
    (["check", "transitivity"], ["--threshold", "nan"], None, "data.npz", "--threshold", None),
    (["check", "transitivity"], ["--min-reduction", "nan"], None, "data.npz", "--min-reduction", None),
    (["path"], ["--batch-size", "-1"], ("m0.pt", "m1.pt"), "data.npz", "--batch-size", "empty"),
    (["path"], ["--batch-size", "0"], ("m0.pt", "m1.pt"), "data.npz", "--batch-size", "empty"),
    (["group"], ["--weights", "-1", "2", "0"], None, "data.npz", "--weights", None),
    (["group"], ["--weights", "0", "0", "0"], None, "data.npz", "--weights", None),
    (["group"], ["--weights", "nan", "1", "1"], None, "data.npz", "--weights", None),
    (["group"], ["--weights", "1", "2"], None, "data.npz", "--weights", None),
    (["group"], ["--by-size", "--draws", "0"], None, "data.npz", "--draws", None),
    (["check", "group"], ["--weights", "0", "0", "0"], None, "data.npz", "--weights", None),
    (["decompose"], ["--weights", "0", "0", "0"], None, "data.npz", "--weights", None),
    (["path"], ["--device", "banana"], ("m0.pt", "m1.pt"), "data.npz", "--device", None),
    # huge sizes refused early (the memory available is fixed below)
    (["plane"], ["--resolution", "10001"], None, "data.npz", "--resolution", None),
    (["path"], ["--alphas", "100000000"], ("m0.pt", "m1.pt"), "data.npz", "--alphas", None),
    (["check", "shared-basin"], ["--resolution", "10001"], None, "data.npz", "--resolution", None),
    # sizes, counts and seeds out of range
    (["plane"], ["--resolution", "1"], None, "data.npz", "--resolution", None),
    (["plane"], ["--resolution", "ten"], None, "data.npz", "--resolution", None),
    (["plane"], ["--seed", "-1"], None, "data.npz", "--seed", None),
    (["plane"], ["--seed", HUGE_SEED], None, "data.npz", "--seed", None),
    (["path"], ["--alphas", "1"], ("m0.pt", "m1.pt"), "data.npz", "--alphas", None),
    (["path"], ["--alpha-range", "1", "0"], ("m0.pt", "m1.pt"), "data.npz", "--alpha-range", None),
    (["path"], ["--alpha-range", "nan", "1"], ("m0.pt", "m1.pt"), "data.npz", "--alpha-range", None),
    (["hessian"], ["--k", "0"], ("m0.pt",), "data.npz", "--k", None),
    (["hessian"], ["--tol", "0"], ("m0.pt",), "data.npz", "--tol", None),
    (["hessian"], ["--max-iter", "0"], ("m0.pt",), "data.npz", "--max-iter", None),
    (["hessian"], ["--method", "qr"], ("m0.pt",), "data.npz", "--method", None),
    (["hessian"], ["--hvp", "fast"], ("m0.pt",), "data.npz", "--hvp", None),
    (["trace"], ["--method", "exact"], ("m0.pt",), "data.npz", "--method", None),
    (["trace"], ["--min-samples", "0"], ("m0.pt",), "data.npz", "--min-samples", None),
    (["density"], ["--iterations", "0"], ("m0.pt",), "data.npz", "--iterations", None),
    (["density"], ["--sigma", "-1"], ("m0.pt",), "data.npz", "--sigma", None),
    (["check", "flatter"], ["--margin", "1"], ("m0.pt", "m1.pt"), "data.npz", "--margin", None),
    (["check", "flatter"], ["--margin", "nan"], ("m0.pt", "m1.pt"), "data.npz", "--margin", None),
    (["check", "shared-basin"], ["--barrier-threshold", "-1"], None, "data.npz", "--barrier-threshold", None),
    (["check", "shared-basin"], ["--level", "nan"], None, "data.npz", "--level", None),
    (["plane"], ["--num-classes", "0"], None, "data.npz", "--num-classes", None),
    (["plane"], ["--round", "last"], None, "data.npz", "--round", None),
    # evaluator options, generated from EvaluatorOptions
    (["path"], ["--loss", "hinge"], ("m0.pt", "m1.pt"), "data.npz", "--loss", None),
    (["path"], ["--bn", "freeze"], ("m0.pt", "m1.pt"), "data.npz", "--bn", None),
    (["path"], ["--dtype", "float16"], ("m0.pt", "m1.pt"), "data.npz", "--dtype", None),
    (["path"], ["--autocast", "float32"], ("m0.pt", "m1.pt"), "data.npz", "--autocast", None),
    (["path"], ["--strategy", "fast"], ("m0.pt", "m1.pt"), "data.npz", "--strategy", None),
    (["path"], ["--chunk-size", "0"], ("m0.pt", "m1.pt"), "data.npz", "--chunk-size", None),
    (["path"], ["--memory-budget", "-5"], ("m0.pt", "m1.pt"), "data.npz", "--memory-budget", None),
    (["path"], ["--n-jobs", "0"], ("m0.pt", "m1.pt"), "data.npz", "--n-jobs", None),
    (["path"], ["--bn-batches", "0"], ("m0.pt", "m1.pt"), "data.npz", "--bn-batches", None),
    (["path"], ["--flush-interval", "nan"], ("m0.pt", "m1.pt"), "data.npz", "--flush-interval", None),
    # files: labels, weights, pickles
    (["path"], [], ("m0.pt", "m1.pt"), "float_labels.npz", "--data", None),
    (["path"], [], ("m0.pt", "m1.pt"), "column_labels.npz", "--data", None),
    (["path"], [], ("m0.pt", "m1.pt"), "pickled.npz", "pickled.npz", None),
    (["path"], [], ("int.safetensors", "m1.pt"), "data.npz", "int.safetensors", None),
    (["path"], [], ("bool.safetensors", "m1.pt"), "data.npz", "bool.safetensors", None),
    (["plane"], ["--module-kwargs", "[1]"], None, "data.npz", "--module-kwargs", None),
    (["plane"], ["--split", "validation"], None, "data.npz", "split", None),
    (["report"], [], None, "data.npz", "--run", None),
    (["path"], ["--compile", "no-such-backend"], ("m0.pt", "m1.pt"), "data.npz", "--compile", None),
    (["path"], ["--module", "{folder}/nets.py:broken"], ("m0.pt", "m1.pt"), "data.npz", "--module", None),
    (["path"], ["--module", "{folder}/boom.py:make"], ("m0.pt", "m1.pt"), "data.npz", "--module", None),
    (["path"], [], ("m0.pt", "m1.pt"), "dicts.pt", "dicts.pt", None),
    (["path"], ["--out", "{folder}/nets.py/out"], ("m0.pt", "m1.pt"), "data.npz", "nets.py", None),
    (["align"], [], ("m0.pt", "m1.pt"), "data.npz", "--save", None),
    (["align"], ["--save", "{folder}/x.pt", "--method", "cosine"], ("m0.pt", "m1.pt"), "data.npz", "--method", None),
    (["curve"], [], ("m0.pt", "m1.pt"), "data.npz", "--train-data", None),
    (["curve"], ["--momentum", "1"], ("m0.pt", "m1.pt"), "data.npz", "--momentum", None),
    (["curve"], ["--epochs", "0"], ("m0.pt", "m1.pt"), "data.npz", "--epochs", None),
    (["curve"], ["--lr", "nan"], ("m0.pt", "m1.pt"), "data.npz", "--lr", None),
    (["curve"], ["--train-data", "{folder}/float_labels.npz"], ("m0.pt", "m1.pt"), "data.npz", "--train-data",
     None),
]
if not torch.cuda.is_available():
    CORPUS.append((["path"], ["--device", "cuda"], ("m0.pt", "m1.pt"), "data.npz", "--device", None))
TRAIN_CORPUS = [
    (["--seed", HUGE_SEED], "seed"),
    (["--seed", "2**70"], "--seed"),
    (["--rounds", "-1"], "rounds"),
    (["--clients", "0"], "clients"),
    (["--lr", "1e30"], "lr"),
    (["-o", "momentum=NaN"], "momentum"),
    (["-o", "weight_decay=Infinity"], "weight_decay"),
    (["-o", 'partition_options={"bogus": 1}'], "bogus"),
    (["--algorithm", "fedbogus"], "algorithm"),
]


RUN_CORPUS = [
    (["path", "--models", "client:99"], "run", "--models client:99"),
    (["path", "--models", "bogus"], "run", "bogus"),
    (["path", "--round", "99"], "run", "round 99"),
    (["path", "--models", "client:0", "client:1@7"], "run", "round 7"),
    (["path", "--split", "client:99"], "run", "split"),
    (["path", "--checkpoints", "x.pt"], "run", "--checkpoints"),
    (["path", "--module", "mlp"], "run", "--run"),
    (["decompose", "--client-data", "x.npz"], "run", "--client-data"),
    (["decompose", "--models", "global", "client:0"], "run", "client models only"),
    (["path"], "model_is_5", "model"),
    (["path"], "round_infinity", "round"),
    (["path"], "no_config", "config.json"),
]


@pytest.mark.parametrize("argv, fragment", [([], "COMMAND"), (["bogus"], "bogus"), (["check"], "CLAIM"),
                                            (["check", "bogus"], "bogus"), (["path", "--bogus"], "--bogus")])
def test_bad_command_line_is_one_line(argv, fragment, capsys):
    line = one_line_error(main(argv), capsys.readouterr()[1])
    assert fragment in line, line


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, str]:
    """A trained FL run (3 clients, 1 round) and tampered copies of it."""
    import json
    import shutil

    folder = tmp_path_factory.mktemp("runs")
    assert main(["train", "--clients", "3", "--rounds", "1", "--out", str(folder / "run"), "--no-progress"]) == 0
    out = {"run": str(folder / "run")}
    for name, file, change in (("model_is_5", "config.json", {"model": 5}),
                               ("round_infinity", "progress.json", {"round": float("inf")})):
        shutil.copytree(folder / "run", folder / name)
        record = json.loads((folder / name / file).read_text())
        (folder / name / file).write_text(json.dumps({**record, **change}))
        out[name] = str(folder / name)
    shutil.copytree(folder / "run", folder / "no_config")
    (folder / "no_config" / "config.json").unlink()
    out["no_config"] = str(folder / "no_config")
    return out


@pytest.mark.parametrize("argv, run, fragment", RUN_CORPUS, ids=[" ".join(c[0]) + f" [{c[1]}]" for c in RUN_CORPUS])
def test_bad_run_invocation_is_one_line(argv, run, fragment, runs, tmp_path, capsys):
    code = main([*argv, "--run", runs[run], "--out", str(tmp_path), "--no-cache", "--quiet"])
    line = one_line_error(code, capsys.readouterr()[1])
    assert fragment in line, line


@pytest.fixture
def small_host(monkeypatch) -> int:
    """The host reports 16 GiB available, so the size limits do not depend on this machine."""
    available = 16 << 30
    monkeypatch.setattr(host_memory, "available_bytes", lambda: available)
    return available


def one_line_error(code: int, err: str) -> str:
    """The single stderr line of a failed command (asserts the failure contract)."""
    assert code != 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("landscape: error:"), err
    return lines[0]


@pytest.mark.parametrize("words, extra, ckpts, data, fragment, absent", CORPUS,
                         ids=[" ".join(c[0] + c[1]) + f" [{c[3]}]" for c in CORPUS])
def test_bad_invocation_is_one_line_naming_the_option(words, extra, ckpts, data, fragment, absent, files,
                                                      small_host, capsys):
    extra = [a.format(folder=files["folder"]) for a in extra]
    code = main([*words, *models(files, *(ckpts or ()), data=data), *extra])
    out, err = capsys.readouterr()
    line = one_line_error(code, err)
    assert code == 2
    assert fragment in line, line
    assert absent is None or absent not in line, line


@pytest.mark.parametrize("extra, fragment", TRAIN_CORPUS, ids=[" ".join(c[0]) for c in TRAIN_CORPUS])
def test_bad_train_invocation_is_one_line(extra, fragment, tmp_path, capsys):
    code = main(["train", "--clients", "2", "--rounds", "1", "--out", str(tmp_path / "run"), "--no-progress",
                 *extra])
    _, err = capsys.readouterr()
    line = one_line_error(code, err)
    assert fragment in line, line
    assert not (tmp_path / "run" / "progress.json").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and /sys are Linux's")
@pytest.mark.parametrize("out, cause, remedy", [
    ("/proc/self/x", "the location accepts no new files (ENOENT, no such file or directory: a virtual file system "
                     "such as /proc", "choose another location"),
    ("/sys/x", "the location is not writable (operation not permitted)", "choose a writable location"),
])
@pytest.mark.parametrize("program", ["fl-run", "landscape train"])
def test_an_output_folder_that_cannot_be_made_names_the_cause(program, out, cause, remedy, capsys):
    """The cause is named, and free space is advised only for a full disk."""
    from fl.cli import main as fl_main

    argv = ["--clients", "2", "--rounds", "1", "--out", out, "--no-progress"]
    try:
        code = fl_main(argv) if program == "fl-run" else main(["train", *argv])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr()[1]
    lines = err.strip().splitlines()
    assert code != 0 and "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(f"{program.split()[0]}: error: {out}: cannot create or open this folder: {cause}")
    assert lines[0].endswith(f"Nothing was written there; {remedy}") and "free space" not in lines[0]
    assert not Path(out).exists()
    tally("bad inputs rejected")


def test_size_refusal_gives_the_estimate(files, small_host, monkeypatch, capsys):
    from landscape_cli.limits import FIGURE_POINT_BYTES

    code = main(["plane", *models(files), "--resolution", "10001"])
    line = one_line_error(code, capsys.readouterr()[1])
    per_point = host_memory.POINT_BYTES + FIGURE_POINT_BYTES
    needed = host_memory.format_bytes(host_memory.points_bytes(10001 ** 2, per_point))
    assert f"needs about {needed}" in line and "100,020,001 points" in line and "16.0 GiB" in line
    assert "--no-figures" in line
    # without figures the same grid needs POINT_BYTES per point only: refused when half of that is free
    small = host_memory.points_bytes(10001 ** 2) // 2
    monkeypatch.setattr(host_memory, "available_bytes", lambda: small)
    code = main(["plane", *models(files), "--resolution", "10001", "--no-figures"])
    line = one_line_error(code, capsys.readouterr()[1])
    assert f"needs about {host_memory.format_bytes(host_memory.points_bytes(10001 ** 2))}" in line


def test_memory_check_is_exact_at_the_boundary():
    assert host_memory.points_bytes(7, per_point=3) == 21
    host_memory.check_fits(21, "x", available=21)
    with pytest.raises(ConfigError, match=r"x needs about 22 B of memory, but only 21 B are available"):
        host_memory.check_fits(22, "x", available=21)
    assert host_memory.format_bytes(3 << 30) == "3.0 GiB"


@pytest.mark.parametrize("argv, fragment", [
    (["landscape", "group", "--weights", "0", "0", "0", "--module", "mlp", "--checkpoints", "a.pt", "b.pt",
      "c.pt", "--data", "digits"], "--weights"),
    (["landscape", "plane", "--span", "0"], "--span"),
    (["landscape", "path", "--device", "banana"], "--device"),
    (["fl-run", "--seed", HUGE_SEED, "--rounds", "1"], "seed"),
])
def test_console_scripts_print_one_line(argv, fragment, tmp_path):
    exe = Path(sys.executable).with_name(argv[0])
    proc = subprocess.run([str(exe), *argv[1:]], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], proc.stderr


# ------------------------------------------------------------------ the generated evaluator flags
def test_every_evaluator_option_has_a_flag_with_its_help_and_choices(files, capsys):
    assert main(["path", "--help"]) == 0
    squeezed = "".join(capsys.readouterr()[0].split())
    base = ["path", *models(files, "m0.pt", "m1.pt")]
    parser = build_parser()
    hints = typing.get_type_hints(EvaluatorOptions)
    for f in dataclasses.fields(EvaluatorOptions):
        if f.name in ELSEWHERE or f.metadata.get("cli") is False:
            continue
        flag = f.metadata.get("flag", ("--" + f.name.replace("_", "-"),))[0]  # a declared flag, or --field-name
        assert flag in squeezed and "".join(f.metadata["help"].split()) in squeezed, f.name
        for choice in literal_choices(hints[f.name]):
            assert parser.parse_args([*base, flag, choice]) is not None
    assert literal_choices(hints["bn"]) == ("interpolate", "keep", "recompute")


def test_flags_build_the_same_options_as_the_api(files):
    args = build_parser().parse_args(["path", *models(files, "m0.pt", "m1.pt"), "--strategy", "vmap",
                                      "--chunk-size", "7", "--no-input-shortcut", "--dtype", "float64",
                                      "--autocast", "bfloat16", "--bn", "keep", "--loss", "nll",
                                      "--flush-interval", "2.5", "--output", "1", "--device", "cpu"])
    expected = EvaluatorOptions(strategy="vmap", chunk_size=7, input_shortcut=False, dtype=torch.float64,
                                autocast=torch.bfloat16, bn="keep", loss="nll", flush_interval=2.5, output=1,
                                device="cpu", progress=False)
    assert evaluator_options(args) == expected
    defaults = build_parser().parse_args(["path", *models(files, "m0.pt", "m1.pt")])
    assert evaluator_options(defaults) == EvaluatorOptions(progress=False)


def test_data_format_is_described_in_help(capsys):
    assert main(["path", "--help"]) == 0
    text = " ".join(capsys.readouterr()[0].split())
    assert ".npz" in text and "'targets' (N,) integer class labels" in text and "int64" in text
