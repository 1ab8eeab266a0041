"""Every extension point is one file.

A throw-away alignment method, curvature kind, result type, figure and command-line command, each written to a temporary
module in a folder appended to its package's path, are found by the registry and used by the
public functions; the registry's rules and messages. (The throw-away FL algorithm is in
tests/test_fl_registry.py.)
"""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import figures
import landscape.alignment
import landscape.curvature
import landscape.results
import landscape_cli.commands
from figures.registry import FIGURES
from landscape import ConfigError
from landscape.alignment.matchers import MATCHERS
from landscape.curvature.registry import OPERATOR_KINDS
from landscape.infra.registry import Registry
from landscape.results.base import RESULT_TYPES, result_type

ALIGNMENT = textwrap.dedent('''
    """Leaves every unit where it is (a throw-away alignment method)."""
    from landscape.alignment.matchers import MATCHERS, Matcher
    from landscape.alignment.permute import identity_permutations


    def stay(spec, reference, model, **_):
        return identity_permutations(spec), {"objective": 0.0}


    MATCHERS.add("stay-test", Matcher(stay))
''')

RESULT = textwrap.dedent('''
    """A throw-away result type."""
    from dataclasses import dataclass
    from typing import ClassVar

    import numpy as np

    from landscape.results.base import Result, register


    @register
    @dataclass(frozen=True, eq=False)
    class EchoTestResult(Result):
        """Numbers echoed back.

        Attributes
        ----------
        values
            The numbers.
        """

        values: np.ndarray
        array_fields: ClassVar[tuple[str, ...]] = ("values",)
''')

FIGURE = textwrap.dedent('''
    """Draws an EchoTestResult (a throw-away figure)."""
    import plotly.graph_objects as go
    from matplotlib.figure import Figure

    from figures.registry import FIGURES, FigureKind
    from landscape.results.base import result_type


    def echo_figure(result, *, title=None):
        fig = Figure()
        fig.add_subplot().plot(result.values)
        fig.suptitle(title or "echo")
        return fig


    def echo_plotly(result, *, title=None):
        return go.Figure(go.Scatter(y=list(result.values)), layout={"title": title or "echo"})


    FIGURES.add("echo-test", FigureKind((result_type("EchoTestResult"),), echo_figure, echo_plotly))
''')

KIND = textwrap.dedent('''
    """Twice the Hessian (a throw-away curvature kind)."""
    from landscape.curvature.hessian import HessianOperator
    from landscape.curvature.registry import operator_kind


    @operator_kind("double-hessian-test")
    class DoubleHessian(HessianOperator):
        """``2 H``."""

        def matvec(self, v):
            return 2 * super().matvec(v)
''')

COMMAND = textwrap.dedent('''
    """``landscape hello-test``: prints a greeting (a throw-away command)."""
    from landscape_cli.commands import COMMANDS


    @COMMANDS.register("hello-test")
    def register(sub):
        p = sub.add_parser("hello-test", help="say hello")
        p.add_argument("--name", default="world")
        p.set_defaults(func=lambda args: print(f"hello {args.name}") or 0)
''')


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """``plugin(package, module_name, source)``: the module written to a folder on the package's path."""
    added: list[tuple[str, str]] = []

    def drop(package, name: str, source: str) -> None:
        folder = tmp_path / package.__name__  # one folder per package: each imports only its own plugins
        folder.mkdir(exist_ok=True)
        (folder / f"{name}.py").write_text(source)
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
        added.append((package.__name__, name))

    yield drop
    for package, name in added:
        sys.modules.pop(f"{package}.{name}", None)
    MATCHERS.remove("stay-test")
    OPERATOR_KINDS.remove("double-hessian-test")
    FIGURES.remove("echo-test")
    RESULT_TYPES.remove("EchoTestResult")
    landscape_cli.commands.COMMANDS.remove("hello-test")


def test_an_alignment_method_file_is_found_and_used(plugin) -> None:
    plugin(landscape.alignment, "stay_test_method", ALIGNMENT)
    assert "stay-test" in MATCHERS.names()
    a = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    b = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    found = landscape.align(b, to=a, method="stay-test", input_shape=(4,))
    for k, v in b.state_dict().items():  # identity permutations: the weights are b's, unmoved
        assert torch.equal(found.state_dict()[k], v), k


def test_a_result_type_file_is_found_by_a_cache_read(plugin, tmp_path) -> None:
    plugin(landscape.results, "echo_test_result", RESULT)
    cls = result_type("EchoTestResult")  # the lookup of a stored name imports the package's modules
    assert cls is not None and cls.__name__ == "EchoTestResult"
    cache = landscape.Cache(tmp_path / "cache")
    cache.save_result("echo", cls(values=np.arange(3.0), spec={"kind": "echo"}))
    back = cache.load_result("echo")
    assert type(back) is cls and np.array_equal(back.values, np.arange(3.0))


def test_a_curvature_kind_file_is_found_by_kind(plugin) -> None:
    from torch import nn

    import landscape

    plugin(landscape.curvature, "double_hessian_test", KIND)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    ev = landscape.Evaluator(model, (torch.randn(30, 3), torch.randint(0, 2, (30,))))
    plain = landscape.hessian_eigenvalues(model, ev, k=2, tol=1e-8, max_iter=200)
    double = landscape.hessian_eigenvalues(model, ev, k=2, tol=1e-8, max_iter=200, kind="double-hessian-test")
    np.testing.assert_allclose(np.asarray(double), 2 * np.asarray(plain), rtol=1e-5)
    eigen = landscape.hessian_eigen(model, ev, kind="double-hessian-test", tol=1e-8)
    assert eigen.spec["operator"] == "double-hessian-test"


def test_a_figure_file_is_found_by_draw(plugin) -> None:
    plugin(landscape.results, "echo_test_result", RESULT)
    plugin(figures, "echo_test_figure", FIGURE)
    echo = result_type("EchoTestResult")(values=np.array([3.0, 1.0, 2.0]))
    assert figures.kind_of(echo) == "echo-test"
    fig = figures.draw(echo, title="three numbers")
    assert list(fig.axes[0].lines[0].get_ydata()) == [3.0, 1.0, 2.0]
    assert fig._suptitle.get_text() == "three numbers"
    assert list(figures.draw(echo, backend="plotly").data[0].y) == [3.0, 1.0, 2.0]


def test_draw_picks_the_figure_of_a_real_result_and_refuses_an_unknown_type() -> None:
    from torch import nn

    import landscape

    torch.manual_seed(0)
    a, b = nn.Linear(3, 2), nn.Linear(3, 2)
    data = (torch.randn(20, 3), torch.randint(0, 2, (20,)))
    path = landscape.interpolate(a, b, landscape.Evaluator(a, data), alphas=5)
    assert figures.kind_of(path) == figures.kind_of({"a-b": path}) == "path"
    assert figures.draw(path).axes  # the path figure of figures.paths
    with pytest.raises(ConfigError, match="no figure draws a dict"):
        figures.draw({"x": {}})
    with pytest.raises(ConfigError, match="backend must be"):
        figures.draw(path, backend="svg")


def test_a_command_file_is_found_by_the_parser(plugin, capsys) -> None:
    plugin(landscape_cli.commands, "hello_test_cmd", COMMAND)
    from landscape_cli.main import main

    assert main(["hello-test", "--name", "registry"]) == 0
    assert capsys.readouterr().out == "hello registry\n"
    # the docs site's Command line page is generated at build time: it lists the command, no committed file changes
    import importlib.util

    spec = importlib.util.spec_from_file_location("cli_help_ext", Path(__file__).resolve().parents[1] / "scripts"
                                                  / "cli_help.py")
    cli_help = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli_help)
    assert "## `landscape hello-test`" in cli_help.render()


def test_registry_rules_and_messages() -> None:
    reg: Registry[object] = Registry("widget")
    first = reg.add("knob", Path)
    assert first is Path and reg.get("knob") is Path and "knob" in reg and list(reg) == ["knob"]
    with pytest.raises(TypeError, match="widget name 'knob' of pathlib.PurePath is already taken by pathlib.Path"):
        reg.add("knob", Path.__mro__[1])
    with pytest.raises(ConfigError, match=r"^unknown widget 'konb' \(did you mean 'knob'\?\); available: knob$"):
        reg.get("konb")
    with pytest.raises(ConfigError, match="widget must be a name, got int"):
        reg.get(3)  # type: ignore[arg-type]
    reg.remove("knob")
    reg.remove("never there")
    assert reg.names() == ()
    with pytest.raises(ConfigError, match=r"unknown alignment method 'wieght' \(did you mean 'weight'\?\)"):
        MATCHERS.get("wieght")
    from landscape.connectivity.repair import REPAIR_METHODS

    assert REPAIR_METHODS.names() == ("repair", "reset")
    with pytest.raises(ConfigError, match=r"unknown REPAIR method 'rest' \(did you mean 'reset'\?\)"):
        REPAIR_METHODS.get("rest")
