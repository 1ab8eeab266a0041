"""An FL algorithm is one file.

A throw-away algorithm written to a temporary module is discovered, listed by the
command line with its generated flags, and trained by fl.run; registration rules; IMA
composed around any base without special cases; fl's imports of the analysis core stay
light.
"""
from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import fl
import fl.algorithms
from fl.algorithms import registry, unregister
from fl.algorithms.averaging import weighted_average
from fl.algorithms.base import Algorithm
from fl.cli import build_parser, main
from fl.resolve import build_config
from landscape import ConfigError

from conftest import float32_tolerance, forward_terms

FL_DIR = Path(fl.__file__).parent

THROWAWAY = textwrap.dedent('''
    """A damped FedAvg: the server moves a fraction ``step`` of the way to the FedAvg average."""
    import dataclasses

    from fl.algorithms.base import Algorithm
    from landscape.infra.options import Options, option


    @dataclasses.dataclass(frozen=True)
    class DampedOptions(Options):
        step: float = option(0.5, gt=0, le=1, help="server step size", source="test")


    class Damped(Algorithm):
        name = "damped-test"
        Options = DampedOptions
        vectorizable = True

        def aggregate(self, global_state, updates, server_state, round):
            avg, state = super().aggregate(global_state, updates, server_state, round)
            s = self.opts.step
            return {k: global_state[k] + s * (avg[k] - global_state[k]) for k in avg}, state
''')


@pytest.fixture
def throwaway(tmp_path, monkeypatch):
    """The module file dropped in a folder of the ``fl.algorithms`` package path."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "damped_test_alg.py").write_text(THROWAWAY)
    monkeypatch.setattr(fl.algorithms, "__path__", [*fl.algorithms.__path__, str(folder)])
    yield
    unregister("damped-test")
    sys.modules.pop("fl.algorithms.damped_test_alg", None)


def test_a_new_algorithm_file_is_registered_listed_and_trained(throwaway, tmp_path, capsys):
    assert "damped-test" in registry()
    parser = build_parser()
    assert "damped-test" in next(a for a in parser._actions if a.dest == "algorithm").choices
    assert any("--step" in a.option_strings for a in parser._actions)
    assert main(["--list-algorithms"]) == 0 and "damped-test: step=0.5" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="damped-test option step must be > 0 and <= 1"):
        fl.run("damped-test", step=2.0, out=tmp_path / "bad", rounds=1)
    run = fl.run("damped-test", step=0.25, clients=3, rounds=1, batch_size=64, progress=False, device="cpu",
                 out=tmp_path / "run")
    assert run.config["options"] == {"step": 0.25}
    before, after = run.global_state(0), run.global_state(1)
    clients = run.client_states(1)
    sizes = {k: len(d) for k, d in run.client_datasets().items()}
    avg = weighted_average([clients[k] for k in sorted(clients)], [sizes[k] for k in sorted(clients)])
    for k in after:  # w1 = w0 + 0.25 (FedAvg(w_k) - w0): the server's own float32 operations on the same states
        torch.testing.assert_close(after[k], before[k] + 0.25 * (avg[k] - before[k]), rtol=0, atol=0)
    vec = fl.run("damped-test", step=0.25, clients=3, rounds=1, batch_size=64, progress=False, device="cpu",
                 backend="vectorized", out=tmp_path / "vec")  # its flag lets the vectorised back end run it
    # each local SGD step rounds the forward's dot products, the sum over a batch and the update's 3 terms, and
    # to first order the steps' relative errors add; the server's cast of the average and its 3 operations add 4
    cfg = run.config
    steps = cfg["local_epochs"] * max(-(-n // cfg["batch_size"]) for n in sizes.values())
    tol = steps * float32_tolerance(forward_terms(run.module()) + cfg["batch_size"] + 3) + float32_tolerance(4)
    for k in after:
        size = max(float(s[k].abs().max()) for s in [before, after, *clients.values()])
        torch.testing.assert_close(vec.global_state(1)[k], after[k], rtol=0, atol=tol * size)
    assert main(["--algorithm", "damped-test", "--step", "0.25", "--clients", "3", "--rounds", "1",
                 "--batch-size", "64", "--device", "cpu", "--no-progress", "--out", str(tmp_path / "run")]) == 0


def test_registration_rules():
    with pytest.raises(TypeError, match="already taken"):
        type("OtherFedAvg", (Algorithm,), {"name": "fedavg", "__module__": "elsewhere"})
    import dataclasses

    from landscape.infra.options import Options, option

    shadow = dataclasses.make_dataclass("Shadow", [("lr", float, option(0.1, help="x"))], bases=(Options,),
                                        frozen=True)
    with pytest.raises(TypeError, match="shadows the fl.run setting"):
        type("Shadowing", (Algorithm,), {"name": "shadowing-test", "Options": shadow})
    assert "shadowing-test" not in registry()
    with pytest.raises(ConfigError, match=r"unknown algorithm 'fedgucc' \(did you mean 'fedgucci'\?\)"):
        fl.algorithms.get("fedgucc")


@pytest.mark.parametrize("base", ["fedavg", "fedprox", "floco", "lss"])
def test_ima_is_composed_around_any_base(base):
    config, alg = build_config(base, clients=4, rounds=4, ima={"window": 2})
    assert alg.label == f"ima on {base}" and alg.base.name == base
    assert alg.personalised == alg.base.personalised and alg.vectorizable == alg.base.vectorizable
    assert config["ima"]["start_round"] == 4 and config["algorithm"] == base
    with pytest.raises(ConfigError, match="already a wrapper"):
        build_config("ima", clients=4, rounds=4, ima=True)


def _imports(path: Path) -> list[tuple[str, list[str], bool]]:
    """(module, names, at module level) of every ``from X import ...`` of a file."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    return [(n.module or "", [a.name for a in n.names], id(n) in top)
            for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]


def test_no_algorithm_special_cases_outside_the_algorithms():
    for name in ("api.py", "vectorized.py", "engine.py", "resolve.py", "cli.py"):
        for module, names, _ in _imports(FL_DIR / name):
            assert not module.startswith(("algorithms.fedprox", "algorithms.ima", "algorithms.fedgucci",
                                          "algorithms.floco", "algorithms.lss")), (name, module)
        assert "isinstance(alg" not in (FL_DIR / name).read_text()


def test_fl_imports_only_the_light_layers_of_landscape():
    """At module level fl imports the top-level package (lazy), the infrastructure layer and the parameter utilities.

    Nothing of the analysis core.
    """
    for path in sorted(FL_DIR.rglob("*.py")):
        for module, names, top in _imports(path):
            if module.startswith("landscape") and top:
                assert module == "landscape" or module.startswith(("landscape.infra", "landscape.space")), \
                    (path.name, module)


def test_import_fl_does_not_load_the_analysis_core():
    code = ("import sys, fl; core = ('evaluation', 'geometry', 'curvature', 'decomposition', 'claims', "
            "'results', 'cache'); print([m for m in sys.modules if m.split('.')[:2][-1] in core "
            "and m.startswith('landscape.')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
