"""K-FAC and EKFAC (``kind="kfac"``, ``kind="ekfac"``) against dense matrices built independently.

* one linear layer, MSE, one sample: K-FAC (and EKFAC) is the exact GGN;
* an MLP with cross-entropy over uneven batches: each block is ``A (x) G`` with the factors written
  out by hand (inputs with the bias's 1, output gradients through ``tanh'`` and ``W2^T`` from the
  square root of ``diag(p) - p p^T``), and the blocks of different layers are zero;
* EKFAC's eigenvalues are the diagonal of the exact block (GGN, Monte-Carlo Fisher with the same
  labels, empirical Fisher) in K-FAC's eigenbasis, hence EKFAC is closer to it than K-FAC;
* the exact damped inverse inverts the damped operator, agrees with conjugate gradients, and the
  eigenvalues are the dense matrix's;
* the registry's solvers and tables take the kinds unchanged; bad layers and options are refused.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import landscape
from landscape.infra.errors import ConfigError, CurvatureError
from landscape.results import PlaneResult

from conftest import FLOAT64_UNIT_ROUNDOFF

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e3 * FLOAT64_UNIT_ROUNDOFF  # a few hundred roundings of O(1) entries


def evaluator(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, batch_size: int = 7):
    return landscape.Evaluator(model, (x, y), loss=loss, dtype=torch.float64, progress=False, batch_size=batch_size)


def operator(model, ev, kind, **options):
    return landscape.curvature_operator(model, ev, kind=kind, kind_options=options or None)


def layer_indices(offset_w: int, offset_b: int, out: int, cols: int) -> torch.Tensor:
    """The theta index of entry ``(o, j)`` of ``M = [W, b]`` in ``M``'s row-major order."""
    idx = torch.empty(out, cols + 1, dtype=torch.long)
    idx[:, :cols] = offset_w + torch.arange(out * cols).reshape(out, cols)
    idx[:, cols] = offset_b + torch.arange(out)
    return idx.reshape(-1)


@pytest.fixture
def mlp_case():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    x = torch.randn(20, 4, dtype=torch.float64)
    y = torch.randint(0, 3, (20,))
    return model, x, y


def test_one_linear_layer_one_sample_is_the_ggn():
    torch.manual_seed(1)
    model = nn.Linear(3, 4).double()
    x, y = torch.randn(1, 3, dtype=torch.float64), torch.randn(1, 4, dtype=torch.float64)
    ev = evaluator(model, x, y, "mse")
    ggn = operator(model, ev, "ggn").dense()
    for kind in ("kfac", "ekfac"):
        assert torch.allclose(operator(model, ev, kind).dense(), ggn, rtol=0, atol=TOL)


def test_mlp_blocks_are_hand_written_kronecker_products(mlp_case):
    model, x, y = mlp_case
    w1, b1, w2, b2 = (p.detach() for p in model.parameters())
    h = x @ w1.T + b1
    p = torch.softmax(torch.tanh(h) @ w2.T + b2, 1)
    root = torch.diag_embed(p.sqrt()) - p[:, :, None] * p.sqrt()[:, None, :]  # root root^T = diag(p) - p p^T
    ones = torch.ones(len(x), 1, dtype=torch.float64)
    a1, a2 = torch.cat([x, ones], 1), torch.cat([torch.tanh(h), ones], 1)
    g2 = root  # (n, out, k): d(f . q_k)/d s2 = q_k
    g1 = (1 - torch.tanh(h) ** 2)[:, :, None] * torch.einsum("oi,nok->nik", w2, root)
    n = len(x)
    factors = [(a1.T @ a1 / n, torch.einsum("nik,njk->ij", g1, g1) / n),
               (a2.T @ a2 / n, torch.einsum("nik,njk->ij", g2, g2) / n)]
    idx = [layer_indices(0, 20, 5, 4), layer_indices(25, 40, 3, 5)]
    dense = operator(model, evaluator(model, x, y, "cross_entropy"), "kfac").dense()
    for (a, g), rows in zip(factors, idx):
        assert torch.allclose(dense[rows][:, rows], torch.kron(g, a), rtol=0, atol=TOL)
    assert torch.count_nonzero(dense[idx[0]][:, idx[1]]) == 0


@pytest.mark.parametrize("fisher_type,exact_kind", [("type-2", "ggn"), ("mc", "fisher"),
                                                    ("empirical", "empirical_fisher")])
def test_ekfac_is_the_exact_blocks_diagonal_in_the_kfac_eigenbasis(mlp_case, fisher_type, exact_kind):
    model, x, y = mlp_case
    ev = evaluator(model, x, y, "cross_entropy")
    options = {"fisher_type": fisher_type, **({"mc_samples": 3} if fisher_type == "mc" else {})}
    kfac, ekfac = operator(model, ev, "kfac", **options), operator(model, ev, "ekfac", **options)
    exact_options = {"mc_samples": 3} if fisher_type == "mc" else None  # the same labels: same seed, same draws
    for name, rows, out, cols in (("0", layer_indices(0, 20, 5, 4), 5, 5), ("2", layer_indices(25, 40, 3, 5), 3, 6)):
        block = landscape.curvature_operator(model, ev, kind=exact_kind, kind_options=exact_options,
                                             params=[f"{name}.*"]).dense()
        a, g = kfac.factors[0 if name == "0" else 1]
        qa, qg = torch.linalg.eigh(a).eigenvectors, torch.linalg.eigh(g).eigenvectors
        basis = torch.empty(out * cols, out * cols, dtype=torch.float64)
        basis[rows - rows.min()] = torch.kron(qg, qa)  # columns: q_G,i (x) q_A,j, rows in theta's order
        projected = torch.diagonal(basis.T @ block @ basis).reshape(out, cols)
        scalings = ekfac.scalings[0 if name == "0" else 1]
        assert torch.allclose(scalings, projected, rtol=0, atol=TOL)
        k_block = kfac.dense()[rows][:, rows]
        e_block = ekfac.dense()[rows][:, rows]
        exact_block = block[(rows - rows.min())][:, rows - rows.min()]
        assert torch.linalg.norm(e_block - exact_block) < torch.linalg.norm(k_block - exact_block)


@pytest.mark.parametrize("kind", ["kfac", "ekfac"])
def test_exact_inverse_and_eigenvalues(mlp_case, kind):
    model, x, y = mlp_case
    op = operator(model, evaluator(model, x, y, "cross_entropy"), kind)
    dense = op.dense()
    damping = 1e-2
    eye = torch.eye(op.size, dtype=torch.float64)
    inverse = op.inverse_matvec(eye, damping)
    assert torch.allclose(inverse @ (dense + damping * eye), eye, rtol=0, atol=1e4 * FLOAT64_UNIT_ROUNDOFF)
    assert torch.allclose(op.eigenvalues(), torch.linalg.eigvalsh(dense), rtol=0, atol=TOL)
    b = torch.linspace(-1, 1, op.size, dtype=torch.float64)
    cg = landscape.inverse_product(op, b, damping=damping, tol=1e-12)
    assert torch.allclose(torch.from_numpy(cg.x), op.inverse_matvec(b, damping), rtol=1e-8, atol=0)
    assert torch.allclose(op.matmat(eye), dense, rtol=0, atol=TOL)


def test_singular_inverse_is_refused():
    torch.manual_seed(2)
    model = nn.Linear(3, 2).double()
    x, y = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 2, dtype=torch.float64)  # rank-2 A of size 4
    op = operator(model, evaluator(model, x, y, "mse"), "kfac")
    with pytest.raises(CurvatureError, match="singular.*raise damping"):
        op.inverse_matvec(torch.ones(op.size, dtype=torch.float64))
    assert torch.isfinite(op.inverse_matvec(torch.ones(op.size, dtype=torch.float64), 1e-3)).all()


def test_solvers_and_block_tables_take_the_kinds(mlp_case):
    model, x, y = mlp_case
    ev = evaluator(model, x, y, "cross_entropy")
    op = operator(model, ev, "ekfac")
    top = landscape.hessian_eigenvalues(model, ev, kind="ekfac", k=2, tol=1e-8, max_iter=200)
    assert torch.allclose(torch.as_tensor(top, dtype=torch.float64), op.eigenvalues().flip(0)[:2], rtol=1e-6, atol=0)
    diagonal = landscape.curvature_diagonal(op, method="exact").values
    assert torch.allclose(torch.from_numpy(diagonal), torch.diagonal(op.dense()), rtol=0, atol=TOL)
    table = landscape.curvature_by_block(model, ev, kind="kfac", top_k=1, trace=False, tol=1e-8, max_iter=200)
    kfac = operator(model, ev, "kfac")
    per_layer = [float(kfac.eigenvalue_grids()[i].max()) for i in range(2)]
    assert torch.allclose(torch.as_tensor(table.eigenvalues[:, 0]), torch.tensor(per_layer, dtype=torch.float64),
                          rtol=1e-6, atol=0)


def test_paths_and_planes_take_the_kinds(mlp_case):
    """The top eigenvalue along a path and on a plane is the exact largest eigenvalue of the kind at each point."""
    model, x, y = mlp_case
    ev = evaluator(model, x, y, "cross_entropy")
    torch.manual_seed(6)
    other = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    profile = landscape.curvature_along_path(model, other, ev, alphas=[0.0, 1.0], kind="ekfac", tol=1e-10,
                                             max_iter=200)
    assert profile.spec["operator"] == "ekfac"
    for end, top in zip((model, other), profile.eigenvalues[:, 0]):
        assert top == pytest.approx(float(operator(end, ev, "ekfac").eigenvalues()[-1]), rel=1e-8)
    origin = ev.vector(model).numpy()
    u, v = np.eye(len(origin))[0], np.eye(len(origin))[-1]
    plane = PlaneResult(x=np.array([0.0, 1.0]), y=np.array([0.0]), loss=np.zeros((1, 2)), accuracy=np.zeros((1, 2)),
                        origin=origin, u=u, v=v, param_mask=ev.space.param_mask.numpy())
    curv = landscape.curvature_plane(plane, ev, kind="kfac", kind_options={"fisher_type": "empirical"}, tol=1e-10,
                                     max_iter=200)
    point = torch.as_tensor(origin + u)
    exact = landscape.curvature_operator(point, ev, kind="kfac", kind_options={"fisher_type": "empirical"})
    assert curv.top[0, 1] == pytest.approx(float(exact.eigenvalues()[-1]), rel=1e-8)


def test_conv_blocks_need_the_fisher_type_only_through_the_output_gradients():
    """The factor ``A`` of a convolution is the same for every fisher_type; ``G`` is not."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding="same"), nn.ReLU(), nn.Flatten(), nn.Linear(48, 2)).double()
    x, y = torch.randn(6, 2, 4, 4, dtype=torch.float64), torch.randint(0, 2, (6,))
    ev = evaluator(model, x, y, "cross_entropy")
    type2, empirical = operator(model, ev, "kfac"), operator(model, ev, "kfac", fisher_type="empirical")
    patches = nn.functional.unfold(x, 3, padding=1).transpose(1, 2)  # (n, 16 positions, 18)
    a = torch.cat([patches, torch.ones(6, 16, 1, dtype=torch.float64)], -1).reshape(-1, 19)
    assert torch.allclose(type2.factors[0][0], a.T @ a / (6 * 16), rtol=0, atol=TOL)
    assert torch.allclose(empirical.factors[0][0], type2.factors[0][0], rtol=0, atol=0)
    assert not torch.allclose(empirical.factors[0][1], type2.factors[0][1])


def test_unsupported_layers_and_options_are_refused():
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2)).double()
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.randint(0, 2, (5,))
    ev = evaluator(model, x, y, "cross_entropy")
    with pytest.raises(ConfigError, match=r"'1.weight' belongs to a LayerNorm.*params="):
        operator(model, ev, "kfac")
    op = landscape.curvature_operator(model, ev, kind="kfac", params=["0.*", "2.*"])
    assert op.size == 16 + 10 and len(op.layers) == 2
    with pytest.raises(ConfigError, match="mc_samples=2 needs fisher_type='mc'"):
        landscape.curvature_operator(model, ev, kind="kfac", params=["0.*"], mc_samples=2)
    with pytest.raises(ConfigError, match="fisher_type"):
        operator(model, ev, "kfac", fisher_type="type-1")
    grouped = nn.Sequential(nn.Conv2d(2, 2, 1, groups=2), nn.Flatten()).double()
    xg = torch.randn(3, 2, 1, 1, dtype=torch.float64)
    with pytest.raises(ConfigError, match="groups=2"):
        operator(grouped, evaluator(grouped, xg, torch.randint(0, 2, (3,)), "cross_entropy"), "kfac")
    from landscape.curvature.distributed import check_kind

    with pytest.raises(ConfigError, match="from all of the data when it is built.*use one process"):
        check_kind("ekfac")
    with pytest.raises(ConfigError, match="needs the cross_entropy or mse loss.*fisher_type='empirical'"):
        landscape.curvature_operator(model, evaluator(model, x, y, "nll"), kind="kfac", params=["0.*"])


# ------------------------------------------------------------------ against curvlinops
def curvlinops_dense(kind: str, model: nn.Module, loss: nn.Module, x, y, batch_size: int = 7, params=None, **kw):
    curvlinops = pytest.importorskip("curvlinops")
    cls = {"kfac": curvlinops.KFACLinearOperator, "ekfac": curvlinops.EKFACLinearOperator}[kind]
    params = list(model.parameters()) if params is None else params
    data = [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, len(x), batch_size)]
    op = cls(model, loss, params, data, check_deterministic=False, **{"separate_weight_and_bias": False, **kw})
    return op @ torch.eye(sum(p.numel() for p in params), dtype=torch.float64)


def small_cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Conv2d(3, 2, 2, stride=2), nn.Flatten(),
                         nn.Linear(8, 3)).double()


@pytest.mark.parametrize("kind", ["kfac", "ekfac"])
@pytest.mark.parametrize("fisher_type", ["type-2", "empirical"])
@pytest.mark.parametrize("net", ["mlp", "cnn"])
def test_equals_curvlinops_with_cross_entropy(mlp_case, kind, fisher_type, net):
    """Same loss (cross-entropy, mean), fisher type, joint weight and bias, "expand": the same matrix."""
    model, x, y = mlp_case
    if net == "cnn":
        torch.manual_seed(5)
        model, x, y = small_cnn(), torch.randn(15, 2, 4, 4, dtype=torch.float64), torch.randint(0, 3, (15,))
    ours = operator(model, evaluator(model, x, y, "cross_entropy"), kind, fisher_type=fisher_type).dense()
    theirs = curvlinops_dense(kind, model, nn.CrossEntropyLoss(), x, y, fisher_type=fisher_type)
    assert torch.allclose(ours, theirs, rtol=0, atol=TOL)


@pytest.mark.parametrize("kind", ["kfac", "ekfac"])
def test_mse_is_curvlinops_summed_loss_over_n(mlp_case, kind):
    """Our MSE sums a sample's squared errors and averages over samples: curvlinops' sum / N, C times its mean."""
    model, x, _ = mlp_case
    y = torch.randn(len(x), 3, dtype=torch.float64)
    ours = operator(model, evaluator(model, x, y, "mse"), kind).dense()
    summed = curvlinops_dense(kind, model, nn.MSELoss(reduction="sum"), x, y, fisher_type="type-2")
    mean = curvlinops_dense(kind, model, nn.MSELoss(reduction="mean"), x, y, fisher_type="type-2")
    assert torch.allclose(ours, summed / len(x), rtol=0, atol=TOL)
    assert torch.allclose(ours, 3 * mean, rtol=0, atol=TOL)


@pytest.mark.parametrize("kind", ["kfac", "ekfac"])
def test_curvlinops_separate_weight_and_bias_is_ours_per_parameter(mlp_case, kind):
    """The default separate blocks of curvlinops are ours with the weights and the biases selected apart."""
    model, x, y = mlp_case
    ev = evaluator(model, x, y, "cross_entropy")
    theirs = curvlinops_dense(kind, model, nn.CrossEntropyLoss(), x, y, fisher_type="type-2",
                              separate_weight_and_bias=True)
    joint = operator(model, ev, kind).dense()
    for name, rows in (("0.weight", slice(0, 20)), ("0.bias", slice(20, 25)), ("2.weight", slice(25, 40))):
        apart = landscape.curvature_operator(model, ev, kind=kind, params=[name]).dense()
        assert torch.allclose(theirs[rows, rows], apart, rtol=0, atol=TOL)
    assert torch.count_nonzero(theirs[0:20, 20:25]) == 0 and torch.count_nonzero(joint[0:20, 20:25]) > 0


# ------------------------------------------------------------------ the command line and the docs page
def test_the_command_line_takes_kfac_and_its_fisher_type(tmp_path, capsys):
    from fl.models import build_model
    from landscape_cli.main import main

    model = build_model("mlp", num_classes=10, input_shape=(1, 8, 8), seed=0)
    path = landscape.save_state_dict(model.state_dict(), tmp_path / "m.pt")
    rc = main(["hessian", "--module", "mlp", "--checkpoints", str(path), "--data", "digits", "--out",
               str(tmp_path / "o"), "--json", "--no-figures", "--no-cache", "--quiet", "--max-iter", "60", "--tol",
               "1e-6", "--kind", "kfac", "--kind-option", "fisher_type=empirical"])
    assert rc == 0
    found = json.loads(capsys.readouterr()[0])["numbers"]["m"]["eigenvalues"][0]
    from fl.datasets import load_dataset

    bundle = load_dataset("digits")
    ev = landscape.Evaluator(model, (bundle.test_x, bundle.test_y), progress=False)
    op = landscape.curvature_operator(model, ev, kind="kfac", kind_options={"fisher_type": "empirical"})
    assert found == pytest.approx(float(op.eigenvalues()[-1]), rel=1e-4)


def test_the_page_shows_what_the_script_stored_with_its_current_defaults():
    sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "examples")]
    import kfac_blocks

    from _docs import differences, splice

    stored = json.loads((ROOT / "docs" / "data" / "kfac_blocks.json").read_text(encoding="utf-8"))
    stale = differences(stored["args"], kfac_blocks.build_parser())
    assert not stale, f"rerun {kfac_blocks.SCRIPT} --doc: stored with {stale}"
    text = (ROOT / "docs" / "kfac.md").read_text(encoding="utf-8")
    assert splice(text, "kfac_blocks", kfac_blocks.page_parts(stored), kfac_blocks.SCRIPT) == text, \
        f"rerun {kfac_blocks.SCRIPT} --doc"
    for row in stored["rows"]:  # EKFAC is the best fit in K-FAC's eigenbasis, layer by layer
        assert row["ekfac error"] <= row["kfac error"]
        assert f"| {row['kfac error']:.3f} | {row['ekfac error']:.3f} |" in text
