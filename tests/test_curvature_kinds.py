"""A curvature kind with its own option is one file.

A throw-away damped Hessian, ``H + damping I`` with its own ``damping`` option, is written to a
file outside the repository and imported; nothing else changes. Through the public functions
(``curvature_operator``, ``hessian_eigenvalues``, ``hessian_trace``, ``hessian_density``,
``curvature_by_block``) and the ``landscape`` command line its spectrum is the dense Hessian's
(``torch.func.hessian`` of a hand-written loss) shifted by ``damping``; an undeclared option or a
bad value is refused in one line naming the kind and its options; and the generated option tables
of ``docs/api.md`` still match, with the kind registered.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, hessian

import landscape
from landscape.curvature.registry import OPERATOR_KINDS
from landscape.infra.errors import ConfigError

from conftest import FLOAT64_UNIT_ROUNDOFF

ROOT = Path(__file__).resolve().parents[1]
DAMPING = 0.5

KIND = '''
"""A damped Hessian, ``H + damping I`` (a throw-away curvature kind with its own option)."""
from dataclasses import dataclass
from typing import ClassVar

from landscape.curvature.hessian import HessianOperator, HessianOptions
from landscape.curvature.registry import operator_kind
from landscape.infra.options import option


@dataclass(frozen=True)
class DampedOptions(HessianOptions):
    """The Hessian's options and the damping."""

    damping: float = option(0.0, ge=0, help="added to every eigenvalue")


@operator_kind("damped-test")
class DampedHessian(HessianOperator):
    """``H + damping I``: each batch adds its share of ``damping v``."""

    kind: ClassVar[str] = "damped-test"
    Options: ClassVar[type] = DampedOptions

    def __init__(self, evaluator, point, *, damping=0.0, **common):
        super().__init__(evaluator, point, **common)
        self.damping = damping

    def batch_product(self, index, x, y, v):
        return super().batch_product(index, x, y, v) + self.damping * len(y) / self.evaluator.num_targets * v
'''


@pytest.fixture
def damped(tmp_path):
    """The kind's file, written outside the repository and imported; unregistered afterwards."""
    path = tmp_path / "damped_kind.py"
    path.write_text(KIND)
    spec = importlib.util.spec_from_file_location("damped_kind", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    OPERATOR_KINDS.remove("damped-test")


@pytest.fixture
def tiny():
    """A tanh network (negative curvature), its data, a float64 evaluator and the dense Hessian by torch.func."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    x, y = torch.randn(30, 3, dtype=torch.float64), torch.randint(0, 2, (30,))
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for _, p in model.named_parameters()])

    def loss(theta: torch.Tensor) -> torch.Tensor:
        parts = torch.split(theta, [s.numel() for s in shapes])
        return F.cross_entropy(functional_call(model, {n: p.reshape(s) for n, p, s in zip(names, parts, shapes)},
                                               (x,)), y)

    ev = landscape.Evaluator(model, (x, y), dtype=torch.float64, batch_size=8, progress=False)
    return model, ev, hessian(loss)(flat), [s.numel() for s in shapes], (x, y)


def test_the_damped_kind_shifts_the_dense_hessians_spectrum_by_its_damping(damped, tiny):
    model, ev, dense, _, _ = tiny
    exact = np.linalg.eigvalsh(dense.numpy())
    assert exact[0] < 0 < exact[-1]  # an indefinite Hessian: the shift is not hidden by a clipped spectrum
    tol = 1e3 * FLOAT64_UNIT_ROUNDOFF * np.abs(exact).max()
    op = landscape.curvature_operator(model, ev, kind="damped-test", kind_options={"damping": DAMPING})
    assert op.kind == "damped-test" and op.damping == DAMPING
    np.testing.assert_allclose(np.linalg.eigvalsh(op.dense().numpy()), exact + DAMPING, rtol=0, atol=tol)
    top = landscape.hessian_eigenvalues(model, ev, k=2, tol=1e-10, max_iter=200, kind="damped-test",
                                        kind_options={"damping": DAMPING})
    np.testing.assert_allclose(np.asarray(top), exact[::-1][:2] + DAMPING, rtol=1e-8)
    assert top.result.spec["kind_options"] == {"damping": DAMPING} and top.result.spec["operator"] == "damped-test"
    # the Hessian's own option passes through the kind that extends it
    other_products = landscape.hessian_eigenvalues(model, ev, k=1, tol=1e-10, max_iter=200, kind="damped-test",
                                                   kind_options={"damping": DAMPING, "hvp": "reverse-over-reverse"})
    assert other_products[0] == pytest.approx(exact[-1] + DAMPING, rel=1e-8)
    # Hutch++ with a sketch (33 vectors) wider than the 26 parameters is exact: tr(H + d I) = tr H + 26 d
    trace = landscape.hessian_trace(model, ev, max_iter=99, kind="damped-test", kind_options={"damping": DAMPING})
    assert trace.value == pytest.approx(exact.sum() + DAMPING * len(exact), rel=1e-8)
    # SLQ with as many steps as parameters: its nodes are the eigenvalues the probe sees
    density = landscape.hessian_density(model, ev, iterations=len(exact), kind="damped-test",
                                        kind_options={"damping": DAMPING})
    assert np.max(density.nodes) == pytest.approx(exact[-1] + DAMPING, rel=1e-8)


def test_the_damped_kind_per_block_and_in_the_cache(damped, tiny, tmp_path):
    model, ev, dense, sizes, data = tiny
    table = landscape.curvature_by_block(model, ev, tol=1e-10, max_iter=200, trace=False, kind="damped-test",
                                         kind_options={"damping": DAMPING})
    assert table.labels == ["0", "2"]
    edges = np.cumsum([0, sizes[0] + sizes[1], sizes[2] + sizes[3]])
    for row, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
        block = np.linalg.eigvalsh(dense[a:b, a:b].numpy())  # the diagonal block H_BB, shifted as a whole
        assert table.eigenvalues[row, 0] == pytest.approx(block[-1] + DAMPING, rel=1e-8)
    cached = landscape.Evaluator(model, data, dtype=torch.float64, cache=landscape.Cache(tmp_path / "cache"),
                                 progress=False)
    first = landscape.hessian_eigenvalues(model, cached, tol=1e-10, max_iter=200, kind="damped-test",
                                          kind_options={"damping": DAMPING})
    double = landscape.hessian_eigenvalues(model, cached, tol=1e-10, max_iter=200, kind="damped-test",
                                           kind_options={"damping": 2 * DAMPING})
    assert double[0] - first[0] == pytest.approx(DAMPING, rel=1e-8)  # another damping is another cache entry


def test_a_bad_option_of_the_kind_is_refused_in_one_line(damped, tiny):
    model, ev, _, _, _ = tiny
    calls = (lambda **o: landscape.curvature_operator(model, ev, **o),
             lambda **o: landscape.hessian_eigen(model, ev, **o),
             lambda **o: landscape.hessian_trace(model, ev, **o),
             lambda **o: landscape.hessian_density(model, ev, **o),
             lambda **o: landscape.curvature_by_block(model, ev, **o))
    named = "curvature kind 'damped-test'"
    cases = [({"dampin": 0.1}, rf"^{named} has no option 'dampin' \(did you mean 'damping'\?\); its options: hvp, "
                               r"damping$"),
             ({"mc_samples": 4}, rf"^{named} has no option 'mc_samples'; its options: hvp, damping$"),
             ({"damping": -1.0}, rf"^{named} option damping must be >= 0, got -1"),
             ({"damping": "lots"}, rf"^{named} option damping must be a number")]
    for options, message in cases:
        for call in calls:
            with pytest.raises(ConfigError, match=message) as err:
                call(kind="damped-test", kind_options=options)
            assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"^curvature kind 'hessian' has no option 'damping'; its options: hvp$"):
        landscape.hessian_eigen(model, ev, kind_options={"damping": 0.1})  # the option is the damped kind's own


@pytest.mark.filterwarnings("ignore:hessian_eigen.*did not reach")  # a short budget, on purpose
def test_the_command_line_takes_the_kind_and_its_option(damped, tmp_path, capsys):
    from fl.datasets import load_dataset
    from fl.models import build_model
    from landscape_cli.main import main

    model = build_model("mlp", num_classes=10, input_shape=(1, 8, 8), seed=0)
    path = landscape.save_state_dict(model.state_dict(), tmp_path / "m.pt")
    bundle = load_dataset("digits")
    ev = landscape.Evaluator(model, (bundle.test_x, bundle.test_y), progress=False)
    base = ["hessian", "--module", "mlp", "--checkpoints", str(path), "--data", "digits", "--out",
            str(tmp_path / "o"), "--json", "--no-figures", "--no-cache", "--quiet", "--seed", "3", "--max-iter", "12",
            "--kind", "damped-test"]
    assert main([*base, "--kind-option", f"damping={DAMPING}"]) == 0
    eig = landscape.hessian_eigen(model, ev, max_iter=12, seed=3, kind="damped-test", kind_options={"damping": DAMPING})
    found = json.loads(capsys.readouterr()[0])["numbers"]["m"]["eigenvalues"]
    np.testing.assert_allclose(found, eig.values, rtol=1e-6)
    assert main([*base, "--kind-option", "damping=-1"]) == 2
    err = capsys.readouterr()[1].strip()
    assert err.startswith("landscape: error: curvature kind 'damped-test' option damping must be >= 0")
    assert "\n" not in err


def test_a_kind_file_regenerates_no_committed_page(damped):
    assert "damped-test" in OPERATOR_KINDS.names()
    spec = importlib.util.spec_from_file_location("option_tables", ROOT / "scripts" / "option_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    fresh = subprocess.run([sys.executable, str(ROOT / "scripts" / "option_tables.py")], capture_output=True,
                           text=True, cwd=ROOT, check=True).stdout
    assert tables.tables() + "\n" == fresh, "the option tables depend on what is registered at run time"
    assert not Path(damped.__file__).is_relative_to(ROOT)  # the kind lives outside the repository
