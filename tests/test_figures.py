"""Figures drawn from analytic hand-made results (known barriers, extrema, masks); read the drawn data back.

Layout checks on figures of real results (trained models) are in test_figure_layout.py.
"""
from __future__ import annotations

import base64
import copy
import dataclasses
import re
import types
from html.parser import HTMLParser

import matplotlib
import matplotlib.image
import numpy as np
import plotly.offline
import pytest
from matplotlib.collections import PathCollection
from matplotlib.contour import ContourSet

import figures as F
from figures.curvature import LOG_FLOOR
from figures.decomposition import LABELS, PANELS
from figures.groups import matrix_size, summarize_sizes
from figures.paths import LABEL_CHAR, barrier_location, label_rows
from figures.plane_models import MARKER_PX, placed_labels
from figures.planes import plane_values
from figures.simplex import TRIANGLE
from landscape.infra.errors import ConfigError
from landscape.results import (
    AveragingCurve,
    BarrierMatrix,
    CurvatureProfile,
    Decomposition,
    GroupResult,
    PathResult,
    PlaneResult,
    SpectralDensity,
)
from landscape.results.tracking import TrackTable

BUNDLE_HEAD = plotly.offline.get_plotlyjs()[:300]
CDN_SRC = re.compile(r"<script[^>]*src=[\"'][^\"']*cdn\.", re.I)


# ---------------------------------------------------------------- fixtures (hand-made results)

def make_path(barrier: float = 0.5, nonfinite_at: int | None = None) -> PathResult:
    a = np.linspace(-0.25, 1.25, 31)
    loss = 0.3 + 4 * barrier * a * (1 - a) + 0.1 * a  # Eq. 3 barrier = barrier, attained at alpha = 0.5
    if nonfinite_at is not None:
        loss[nonfinite_at] = np.inf
    return PathResult(alphas=a, loss=loss, accuracy=0.9 - 0.2 * a * (1 - a))


MODELS = {"client 0": [0.0, 0.0], "client 1": [1.0, 0.0], "client 2": [0.3, 0.9], "average": [0.433, 0.3],
          "global": (0.5, 0.35), "w_extra": [0.8, 0.7]}


def make_plane(nonfinite: bool = False) -> PlaneResult:
    x, y = np.linspace(-0.5, 1.5, 13), np.linspace(-0.4, 1.2, 9)
    xx, yy = np.meshgrid(x, y)
    loss = 0.2 + (xx - 0.4) ** 2 + 2 * (yy - 0.3) ** 2
    if nonfinite:
        loss[0, :3] = np.inf
        loss[4, 4] = np.nan
    acc = np.clip(1.0 / (1.0 + np.nan_to_num(loss, nan=1e9, posinf=1e9)), 0, 1)
    z = np.zeros(4)
    return PlaneResult(x=x, y=y, loss=loss, accuracy=acc, origin=z, u=z, v=z, param_mask=np.ones(4, bool),
                       models=MODELS)


def group(barrier: float) -> GroupResult:
    return GroupResult(weights=np.full(3, 1 / 3), member_loss=np.full(3, 0.5), member_accuracy=np.full(3, 0.8),
                       fused_loss=0.5 + barrier, fused_accuracy=0.8 * (1 - barrier))


def png_pixels(path) -> np.ndarray:
    return matplotlib.image.imread(str(path))


def scatter_offsets(fig) -> dict[str, np.ndarray]:
    out = {}
    for ax in fig.axes:
        for coll in ax.collections:
            if isinstance(coll, PathCollection) and not coll.get_label().startswith("_"):
                out[coll.get_label()] = np.asarray(coll.get_offsets())
    return out


# ---------------------------------------------------------------- global state

def test_no_global_rcparams_change_and_no_pyplot(tmp_path):
    before = copy.deepcopy(dict(matplotlib.rcParams))
    figs = [F.path_figure(make_path()), F.plane_figure(make_plane(True), log_scale=True),
            F.plane_figure(make_plane(), kind="surface"), F.group_size_figure({"v": {2: [group(0.1)]}}),
            F.barrier_matrix_figure(BarrierMatrix(loss_barrier=np.eye(2), accuracy_barrier=np.eye(2)))]
    F.save(figs[0], tmp_path / "p.png")
    after = dict(matplotlib.rcParams)
    assert after == before
    import sys
    assert "matplotlib.pyplot" not in sys.modules or not sys.modules["matplotlib.pyplot"].get_fignums()


# ---------------------------------------------------------------- paths

def test_path_barrier_location_is_analytic():
    path = make_path(barrier=0.5)
    alpha, value = barrier_location(path, "loss")
    assert alpha == pytest.approx(0.5) and value == pytest.approx(0.5) == path.loss_barrier
    alpha_a, value_a = barrier_location(path, "accuracy")
    assert alpha_a == pytest.approx(0.5) and value_a == pytest.approx(path.accuracy_barrier)


def test_path_figure_data_endpoints_and_annotation():
    paths = {"vanilla": make_path(0.5), "connectivity": make_path(0.1)}
    fig = F.path_figure(paths)
    ax_loss, ax_acc = fig.axes[:2]
    line = ax_loss.lines[0]
    np.testing.assert_allclose(line.get_xdata(), paths["vanilla"].alphas)
    np.testing.assert_allclose(line.get_ydata(), paths["vanilla"].loss)
    assert [t.get_text() for t in ax_loss.child_axes[0].get_xticklabels()] == ["A", "B"]
    assert not [t for t in ax_loss.texts if "α=" in t.get_text()]  # two paths: barriers in the legend
    labels = [line.get_label() for line in ax_loss.lines]
    assert "vanilla (barrier 0.5 at α=0.50)" in labels and "connectivity (barrier 0.1 at α=0.50)" in labels
    single = F.path_figure(paths["vanilla"]).axes[0]
    assert any(t.get_text() == "0.5 at α=0.50" for t in single.texts)
    # endpoint markers sit at (0, L(0)) and (1, L(1))
    offsets = [np.asarray(c.get_offsets()) for c in ax_loss.collections]
    p = paths["vanilla"]
    assert any(np.allclose(o, [[0.0, p.loss[5]], [1.0, p.loss[25]]]) for o in offsets)


def test_path_nonfinite_masked():
    path = make_path(nonfinite_at=3)
    fig = F.path_figure(path)
    y = fig.axes[0].lines[0].get_ydata()
    assert np.isnan(y[3]) and np.isfinite(np.delete(y, 3)).all()
    assert "1 non-finite" in fig._suptitle.get_text()
    pf = F.path_plotly(path)
    assert "1 non-finite" in pf.layout.title.text
    assert np.isnan(pf.data[0].y[3])


def test_path_plotly_hover_contains_values():
    path = make_path()
    fig = F.path_plotly({"vanilla": path})
    trace = fig.data[0]
    np.testing.assert_allclose(trace.x, path.alphas)
    i = 10
    assert f"loss={path.loss[i]:.6g}" in trace.text[i]
    assert f"accuracy={path.accuracy[i]:.6g}" in trace.text[i]
    assert any("barrier 0.5 at α=0.50" in a.text for a in fig.layout.annotations)


def test_barrier_label_rows_keep_arrows_off_the_labels_below():
    # labels at nearly the same alpha (the transitivity paths): one row each, and no arrow from a
    # higher row runs through the text of a lower one (the middle one of three goes on top here)
    for alphas in ([0.5, 0.55], [0.55, 0.5], [0.45, 0.5, 0.55], [0.0, 1.0], [0.2, 0.25, 0.3, 0.95]):
        labels = [(a, f"barrier {i}% at α={a:.2f}") for i, a in enumerate(alphas)]
        layout = label_rows(labels, (-0.05, 1.05))
        assert sorted(row for row, _ in layout) == list(range(len(labels)))
        for (a, text), (row, anchor) in zip(labels, layout):
            width = LABEL_CHAR * len(text) * 1.1
            lo, hi = (a, a + width) if anchor == "left" else (a - width, a)
            assert -0.05 <= lo and hi <= 1.05, (alphas, a, anchor)  # inside the panel
            above = [b for (b, _), (r, _) in zip(labels, layout) if r > row]
            assert not [b for b in above if lo < b < hi], (alphas, a, anchor)
    # spread over the panel, three labels of this width cannot all be free: one text is crossed, not two
    layout = label_rows([(a, f"barrier {a:.0%} at α={a:.2f}") for a in (0.1, 0.5, 0.9)], (-0.05, 1.05))
    assert sorted(row for row, _ in layout) == [0, 1, 2]


def test_plotly_barrier_labels_sit_in_rows_above_the_data():
    paths = {"vanilla": make_path(0.5), "connectivity": make_path(0.1)}  # both barriers at alpha = 0.5
    fig = F.path_plotly(paths)
    loss = np.concatenate([p.loss for p in paths.values()])
    labels = sorted((a for a in fig.layout.annotations if a.text.startswith("barrier") and a.ayref == "y"),
                    key=lambda a: a.ay)
    assert sorted(a.text for a in labels) == ["barrier 0.1 at α=0.50", "barrier 0.5 at α=0.50"]
    span = loss.max() - loss.min()
    assert labels[0].ay - loss.max() > 0.05 * span and labels[1].ay - labels[0].ay == pytest.approx(0.12 * span)
    assert fig.layout.yaxis.range[1] > labels[1].ay and fig.layout.yaxis.range[0] < loss.min()
    # each arrow points at the top of its gap: the curve for a loss bump (Eq. 3), at alpha* = 0.5
    heads = {a.text: (a.x, a.y) for a in labels}
    assert heads == {f"barrier {b} at α=0.50": (0.5, pytest.approx(make_path(b).loss[15])) for b in (0.5, 0.1)}


# ---------------------------------------------------------------- planes

def test_plane_contour_data_and_model_markers():
    plane = make_plane()
    fig = F.plane_figure(plane)
    ax = fig.axes[0]
    cs = [c for c in ax.collections if isinstance(c, ContourSet)][0]
    assert cs.zmin == pytest.approx(plane.loss.min()) and cs.zmax == pytest.approx(plane.loss.max())
    assert ax.get_xlim() == pytest.approx((plane.x[0], plane.x[-1]))
    offsets = scatter_offsets(fig)
    assert set(offsets) == {"client", "average", "global", "model"}
    np.testing.assert_allclose(offsets["client"], [MODELS["client 0"], MODELS["client 1"], MODELS["client 2"]])
    np.testing.assert_allclose(offsets["global"], [MODELS["global"]])
    np.testing.assert_allclose(offsets["model"], [MODELS["w_extra"]])
    assert {t.get_text() for t in ax.texts} >= set(MODELS)


def test_plane_plotly_contour_and_surface_data():
    plane = make_plane()
    for kind in ("contour", "surface"):
        fig = F.plane_plotly(plane, kind=kind)
        grid = fig.data[0]
        np.testing.assert_array_equal(np.asarray(grid.z), plane.loss)
        np.testing.assert_array_equal(grid.x, plane.x)
        i, j = 3, 7
        assert f"loss={plane.loss[i, j]:.6g}" in grid.text[i][j]
        assert f"accuracy={plane.accuracy[i, j]:.6g}" in grid.text[i][j]
        assert f"x={plane.x[j]:.4g}" in grid.text[i][j] and f"y={plane.y[i]:.4g}" in grid.text[i][j]
        placed = {}
        for tr in fig.data[1:]:
            if tr.mode == "text":  # the label layer of a contour (checked in test_figure_layout)
                continue
            for hover, x, y in zip(tr.hovertext, tr.x, tr.y):
                placed[hover.split(" (")[0]] = (x, y)
        assert set(placed) == set(MODELS)
        for label, xy in MODELS.items():
            assert placed[label] == pytest.approx(tuple(xy))


def test_plane_log_levels_and_explicit_roles():
    plane = make_plane()
    fig = F.plane_figure(plane, log_scale=True, levels=9, roles={"w_extra": "anchor", "average": "ima"})
    cs = [c for c in fig.axes[0].collections if isinstance(c, ContourSet)][0]
    np.testing.assert_allclose(cs.levels, np.geomspace(plane.loss.min(), plane.loss.max(), 9))
    offsets = scatter_offsets(fig)
    np.testing.assert_allclose(offsets["anchor"], [MODELS["w_extra"]])
    np.testing.assert_allclose(offsets["ima"], [MODELS["average"]])
    logfig = F.plane_plotly(plane, log_scale=True)
    np.testing.assert_allclose(np.asarray(logfig.data[0].z), np.log10(plane.loss))
    zero_acc = dataclasses.replace(plane, accuracy=np.where(plane.loss > 1.0, 0.0, plane.accuracy))
    with pytest.raises(ConfigError, match="positive"):
        F.plane_figure(zero_acc, metric="accuracy", log_scale=True)


def test_plane_clip_and_error_metric():
    plane = make_plane()
    np.testing.assert_allclose(plane_values(plane, "loss", clip=0.5), np.minimum(plane.loss, 0.5))
    np.testing.assert_allclose(plane_values(plane, "error"), 100 * (1 - plane.accuracy))
    with pytest.raises(ConfigError, match="metric"):
        plane_values(plane, "nonsense")


def test_plane_nonfinite_masked_everywhere(tmp_path):
    plane = make_plane(nonfinite=True)
    for kind in ("contour", "surface"):
        fig = F.plane_figure(plane, kind=kind)
        assert "4 non-finite grid points masked" in fig._suptitle.get_text()
        F.save(fig, tmp_path / f"{kind}.png")
        pfig = F.plane_plotly(plane, kind=kind)
        z = np.asarray(pfig.data[0].z)
        assert np.isnan(z).sum() == 4 and np.isfinite(z).sum() == z.size - 4
        assert "4 non-finite" in pfig.layout.title.text
        assert any("masked" in (tr.name or "") for tr in pfig.data)
    legend = fig_legend_texts(F.plane_figure(plane))
    assert any("non-finite" in t for t in legend)


def fig_legend_texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]


def test_plotly_model_labels_beside_their_markers_and_apart():
    # a global model just above the average (IMA's plane): both labels beside their markers, apart
    spots = [("client 0", 0.0, 0.0), ("client 1", 0.85, 0.0), ("global", 0.53, 0.33), ("average", 0.52, 0.31),
             ("client 2", 0.7, 0.85), ("client 3", 0.99, 0.99)]
    scale, size = 400.0, (480.0, 480.0)
    placed = placed_labels(spots, scale, size, (-0.1, -0.1))
    markers = [((x + 0.1) * scale, (y + 0.1) * scale) for _, x, y in spots]
    boxes = [p.box(*m) for p, m in zip(placed, markers)]
    for i, (a, spot) in enumerate(zip(boxes, placed)):
        assert 0 <= a[0] and a[2] <= size[0] and 0 <= a[1] and a[3] <= size[1], spot  # inside the plot
        for b in boxes[i + 1:]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (spot, b)
        for mx, my in markers:  # no label on any marker, its own included
            assert not (a[0] < mx + MARKER_PX and mx - MARKER_PX < a[2] and a[1] < my + MARKER_PX
                        and my - MARKER_PX < a[3]), (spot, mx, my)
    assert placed[5].xanchor == "right"  # the corner model's label turns inwards


def test_role_inference():
    assert F.role_of("client_3").name == "client"
    assert F.role_of("Global round 4").name == "global"
    assert F.role_of("anchor").name == "anchor"
    assert F.role_of("ima window").name == "ima"
    assert F.role_of("avg of 3").name == "average"
    assert F.role_of("w1").name == "model"
    assert F.role_of("w1", {"w1": "anchor"}).name == "anchor"
    with pytest.raises(ConfigError, match="unknown role"):
        F.role_of("w1", {"w1": "bogus"})


# ---------------------------------------------------------------- groups, matrix

def test_group_size_mean_std_and_plotly():
    draws = {2: [group(0.1), group(0.2), group(0.3)], 4: [group(0.4), float("inf"), group(0.6)]}
    st = summarize_sizes(draws, "loss")
    np.testing.assert_allclose(st.mean, [0.2, 0.5])
    np.testing.assert_allclose(st.std, [np.std([0.1, 0.2, 0.3], ddof=1), np.std([0.4, 0.6], ddof=1)])
    assert st.masked == 1 and list(st.draws) == [3, 2]
    acc = summarize_sizes(draws, "accuracy")
    np.testing.assert_allclose(acc.mean[0], np.mean([g.accuracy_barrier for g in draws[2]]))
    fig = F.group_size_figure({"vanilla": draws}, metric="loss")
    np.testing.assert_allclose(fig.axes[0].lines[0].get_ydata(), [0.2, 0.5])
    assert "1 non-finite barriers masked" in fig._suptitle.get_text()
    pf = F.group_size_plotly({"vanilla": draws}, metric="loss")
    np.testing.assert_allclose(pf.data[0].error_y.array, st.std)
    assert "K=4" in pf.data[0].text[1] and "draws=2" in pf.data[0].text[1]


def test_barrier_matrix_heatmaps():
    loss = np.array([[0.0, 0.3, np.inf], [0.3, 0.0, 0.1], [np.inf, 0.1, 0.0]])
    bm = BarrierMatrix(loss_barrier=loss, accuracy_barrier=loss / 2, labels=["a", "b", "c"])
    fig = F.barrier_matrix_figure(bm)
    img = fig.axes[0].images[0].get_array()
    assert img.mask[0, 2] and img.mask[2, 0]
    np.testing.assert_allclose(img.filled(-1), np.where(np.isfinite(loss), loss, -1))
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["a", "b", "c"]
    assert "inf" in [t.get_text() for t in fig.axes[0].texts]
    pf = F.barrier_matrix_plotly(bm, metric="accuracy")
    np.testing.assert_allclose(np.asarray(pf.data[0].z)[0, 1], 0.15)
    assert "a – b" in pf.data[0].text[0][1] and "loss barrier=0.3" in pf.data[0].text[0][1]
    m = pf.layout.margin  # sized to the 3 x 3 matrix (at least 200 px), no empty bands beside it
    assert pf.layout.width - m.l - m.r == pf.layout.height - m.t - m.b == 200
    for n, side in ((5, 280), (12, 672), (40, 720)):
        size = matrix_size(n)
        assert size["height"] - size["margin"]["t"] - size["margin"]["b"] == side
        assert size["width"] - size["margin"]["l"] - size["margin"]["r"] == side


# ---------------------------------------------------------------- FL curves, curvature, decomposition

RUNS = {"fedavg": [{"round": r, "test_loss": 1.0 / r, "test_accuracy": 1 - 0.5 / r} for r in range(1, 6)],
        "floco": types.SimpleNamespace(metrics=[{"round": r, "test_loss": 1.2 / r, "test_accuracy": 1 - 0.6 / r,
                                                 "local_accuracy": 1 - 0.3 / r} for r in range(1, 6)])}


def test_fl_curves():
    fig = F.fl_curves_figure(RUNS)
    loss_ax, acc_ax = fig.axes[:2]
    np.testing.assert_allclose(loss_ax.lines[0].get_ydata(), [1.0 / r for r in range(1, 6)])
    local = [line for line in acc_ax.lines if line.get_label() == "floco (local)"][0]
    assert local.get_linestyle() == "--"
    np.testing.assert_allclose(local.get_ydata(), [1 - 0.3 / r for r in range(1, 6)])
    pf = F.fl_curves_plotly(RUNS)
    names = [t.name for t in pf.data]
    assert names == ["fedavg", "fedavg", "floco", "floco", "floco (local)"]
    assert f"test_accuracy={1 - 0.6 / 3:.6g}" in pf.data[3].text[2]
    with pytest.raises(ConfigError, match="round"):
        F.fl_curves_figure({"x": [{"test_loss": 1.0}]})


def test_curvature_figures():
    grid = np.linspace(-1, 9, 101)
    dens = np.exp(-grid ** 2) + 0.01 * np.exp(-(grid - 8) ** 2)
    dens /= np.trapezoid(dens, grid)
    sd = SpectralDensity(grid=grid, density=dens, nodes=np.zeros((1, 2)), weights=np.full((1, 2), 0.5), sigma=1.0,
                         dim=10, matvecs=4)
    fig = F.spectral_density_figure(sd)
    np.testing.assert_allclose(fig.axes[0].lines[0].get_ydata(), dens)
    assert fig.axes[0].get_yscale() == "log"
    assert fig.axes[0].get_ylim()[0] == pytest.approx(dens.max() * 1e-7)
    pf = F.spectral_density_plotly({"global": sd}, log_y=False)
    np.testing.assert_allclose(pf.data[0].y, dens)
    # log axis: from LOG_FLOOR of the peak (the tails fall to 1e-36 here) to twice the peak
    log_range = F.spectral_density_plotly({"global": sd}).layout.yaxis.range
    assert log_range == pytest.approx([np.log10(dens.max() * LOG_FLOOR), np.log10(2 * dens.max())])
    lifted = dataclasses.replace(sd, density=dens + 1e-3 * dens.max())  # no tail below the floor
    bottom, top = F.spectral_density_plotly({"global": sd, "lifted": lifted}).layout.yaxis.range
    peak = lifted.density.max()  # the highest peak sets the floor of both
    assert (bottom, top) == pytest.approx((np.log10(peak * LOG_FLOOR), np.log10(2 * peak)))
    assert F.spectral_density_plotly(lifted).layout.yaxis.range[0] == pytest.approx(np.log10(lifted.density.min()))
    assert F.spectral_density_figure(lifted).axes[0].get_ylim() == pytest.approx(
        (lifted.density.min(), 2 * lifted.density.max()))
    assert f"density={dens[50]:.4g}" in pf.data[0].text[50]
    alphas = np.linspace(0, 1, 5)
    ev = np.stack([5 + alphas, 2 + alphas], axis=1)
    prof = CurvatureProfile(alphas=alphas, eigenvalues=ev, residuals=ev * 0, matvecs=np.ones(5))
    fig = F.curvature_path_figure(prof)
    np.testing.assert_allclose(fig.axes[0].lines[0].get_ydata(), ev[:, 0])
    np.testing.assert_allclose(fig.axes[0].lines[1].get_ydata(), ev[:, 1])
    pf = F.curvature_path_plotly({"vanilla": prof})
    assert "λ1=5.5" in pf.data[0].text[2] and "λ2=2.5" in pf.data[0].text[2]
    with pytest.raises(ConfigError, match="grid"):
        F.spectral_density_figure(types.SimpleNamespace(density=dens))


def decomp(r: int):
    tb, hb, cr, var, cov = 0.01, 0.1 + 0.01 * r, -0.005, 0.02, 0.001
    bias = tb + hb + cr
    return types.SimpleNamespace(bias=bias, train_bias=tb, heter_bias=hb, cross=cr, variance=var, covariance=cov,
                                 wens_loss=bias + var + cov, fma_loss=bias + var + cov + 0.01, gap=0.01,
                                 locality=np.array([1.0, 2.0, 6.0]) * r)


def test_decomposition_figures():
    terms = [(r, decomp(r)) for r in (3, 1, 2)]  # unsorted on purpose
    fig = F.decomposition_figure(terms)
    by_label = {line.get_label(): line for ax in fig.axes for line in ax.lines}
    np.testing.assert_allclose(by_label["heterogeneity bias"].get_xdata(), [1, 2, 3])
    np.testing.assert_allclose(by_label["heterogeneity bias"].get_ydata(), [0.11, 0.12, 0.13])
    np.testing.assert_allclose(by_label["max over clients"].get_ydata(), [6, 12, 18])
    np.testing.assert_allclose(by_label["mean over clients"].get_ydata(), [3, 6, 9])
    pf = F.decomposition_plotly(terms)
    assert "round=2" in pf.data[0].text[1] and "heterogeneity bias=0.12" in pf.data[0].text[1]


def test_decomposition_bars():
    models = {"fedavg": decomp(1), "ima": decomp(2)}
    fig = F.decomposition_bars_figure(models)
    for ax, (_, keys) in zip(fig.axes, PANELS):  # one bar per model and term, its value written beside it
        widths = [p.get_width() for p in ax.patches]
        expected = [getattr(d, k) if not k.startswith("locality") else
                    (d.locality.max() if k == "locality_max" else d.locality.mean()) for d in models.values()
                    for k in keys]
        np.testing.assert_allclose(widths, expected)
        assert [t.get_text() for t in ax.get_yticklabels()] == [LABELS[k] for k in keys]
    assert fig.axes[0].get_xlim() == fig.axes[1].get_xlim() != fig.axes[2].get_xlim()  # losses share a scale
    low, high = fig.axes[1].get_xlim()
    assert low < -0.005 < 0.0 < max(d.wens_loss for d in models.values()) < high  # cross < 0 and wens inside
    pf = F.decomposition_bars_plotly(models)
    bars = {(tr.name, tr.yaxis): dict(zip(tr.y, tr.x)) for tr in pf.data}
    ima = bars[("ima", "y2")]
    assert ima["bias"] == pytest.approx(ima["train bias"] + ima["heterogeneity bias"] + ima["cross"])
    assert bars[("ima", "y")]["WENS loss"] == pytest.approx(ima["bias"] + ima["variance"] + ima["covariance"])
    assert [tr.text for tr in pf.data if tr.name == "fedavg" and tr.yaxis == "y2"][0][4] == "0.02"  # variance
    d = decomp(1)
    k = len(d.locality)
    result = Decomposition(**{f: getattr(d, f) for f in ("bias", "train_bias", "heter_bias", "cross", "variance",
                                                         "covariance", "wens_loss", "fma_loss", "gap", "locality")},
                           output_gap=0.0, weights=np.full(k, 1 / k), client_sizes=np.ones(k),
                           client_train_bias=np.zeros(k), client_heter_bias=np.zeros(k), num_samples=k,
                           realizations=2)
    drawn = F.draw(result, backend="plotly")  # the figure registered for a Decomposition
    assert drawn.data[0].orientation == "h" and list(drawn.data[0].x) == pytest.approx([d.fma_loss, d.wens_loss, d.gap])


def test_averaging_curve_figures():
    err = np.array([[0.5, 0.3, 0.4], [0.25, 0.2, np.nan], [0.1, np.nan, np.nan]])
    curve = AveragingCurve(sizes=np.array([1, 2, 3]), loss=err * 2, error=err)
    fig = F.averaging_figure(curve)
    np.testing.assert_allclose(fig.axes[0].lines[0].get_ydata(), [0.4, 0.225, 0.1])
    band = fig.axes[0].collections[0].get_paths()[0].vertices[:, 1]
    assert band.max() == pytest.approx(0.4 + np.std([0.5, 0.3, 0.4]))
    pf = F.averaging_plotly({"round 10": curve}, metric="loss")
    np.testing.assert_allclose(pf.data[0].y, [0.8, 0.45, 0.2])
    assert "m=2" in pf.data[0].text[1] and "loss mean=0.45" in pf.data[0].text[1]


# ---------------------------------------------------------------- simplex

def test_simplex_ternary_projection_is_exact():
    pts = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1 / 3, 1 / 3, 1 / 3], [0.5, 0.5, 0.0]])
    xy, vertices = F.simplex_projection(pts)
    np.testing.assert_allclose(xy[:3], TRIANGLE)
    np.testing.assert_allclose(xy[3], TRIANGLE.mean(axis=0))
    np.testing.assert_allclose(xy[4], TRIANGLE[:2].mean(axis=0))
    fig = F.simplex_figure(pts, labels=list("abcde"))
    np.testing.assert_allclose(scatter_offsets(fig)["clients"], xy)
    pf = F.simplex_plotly(pts, values=np.arange(5.0))
    tr = pf.data[0]
    np.testing.assert_allclose(np.c_[tr.a, tr.b, tr.c], pts)
    assert "loss=3" in tr.hovertext[3] and "α=(0.333, 0.333, 0.333)" in tr.hovertext[3]


def test_simplex_pca_projection_is_affine():
    rng = np.random.default_rng(0)
    pts = rng.dirichlet(np.ones(5), size=7)
    xy, vertices = F.simplex_projection(pts)
    np.testing.assert_allclose(xy, pts @ vertices, atol=1e-12)  # barycentric combination of projected vertices
    seg, ends = F.simplex_projection(np.array([[0.25, 0.75], [1.0, 0.0]]))
    assert np.allclose(seg[:, 1], 0) and abs(seg[0, 0] - seg[1, 0]) == pytest.approx(0.75 * np.sqrt(2))
    with pytest.raises(ConfigError, match="sum to one"):
        F.simplex_projection(np.array([[0.5, 0.6, 0.0]]))


def test_simplex_loss_grid_with_nonfinite(tmp_path):
    n = 8
    grid = np.array([[i / n, j / n, (n - i - j) / n] for i in range(n + 1) for j in range(n + 1 - i)])
    values = ((grid - 1 / 3) ** 2).sum(axis=1)
    values[0] = np.inf
    pts = np.array([[0.2, 0.3, 0.5], [0.6, 0.2, 0.2]])
    fig = F.simplex_figure(pts, grid=grid, grid_values=values)
    assert "1 non-finite grid points masked" in fig._suptitle.get_text()
    F.save(fig, tmp_path / "s.png")
    assert png_pixels(tmp_path / "s.png").var() > 0
    pf = F.simplex_plotly(pts, grid=grid, grid_values=values)
    np.testing.assert_allclose(np.asarray(pf.data[0].marker.color), values[1:])
    pf5 = F.simplex_plotly(np.full((2, 4), 0.25), values=[1.0, 2.0])
    assert pf5.data[-1].name == "endpoints" and len(pf5.data[-1].x) == 4


# ---------------------------------------------------------------- saving, HTML, report

def test_save_formats(tmp_path):
    fig = F.group_size_figure({"vanilla": {2: [group(0.1)], 3: [group(0.2)]}}, width=2.5, height=2.0)
    for suffix in ("png", "pdf", "svg"):
        out = F.save(fig, tmp_path / f"fig.{suffix}")
        assert out.stat().st_size > 1000
    pixels = png_pixels(tmp_path / "fig.png")
    assert pixels.var() > 0
    assert (tmp_path / "fig.pdf").read_bytes().startswith(b"%PDF")
    assert "<svg" in (tmp_path / "fig.svg").read_text()
    html = F.save(F.path_plotly(make_path()), tmp_path / "fig.html").read_text()
    assert BUNDLE_HEAD in html and not CDN_SRC.search(html)
    assert html.count(BUNDLE_HEAD) == 1
    with pytest.raises(ConfigError, match="html"):
        F.save(F.path_plotly(make_path()), tmp_path / "x.png")
    with pytest.raises(ConfigError, match="png"):
        F.save(fig, tmp_path / "x.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.html", "fig.pdf", "fig.png", "fig.svg"]


class _TagChecker(HTMLParser):
    VOID = {"meta", "img", "br", "hr", "input", "link"}

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.cells: list[str] = []
        self.imgs: list[dict] = []
        self._in_td = False

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.imgs.append(dict(attrs))
        if tag not in self.VOID:
            self.stack.append(tag)
        self._in_td = tag == "td"
        if self._in_td:
            self.cells.append("")

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unexpected </{tag}> with open {self.stack[-3:]}")
        else:
            self.stack.pop()
        self._in_td = False

    def handle_data(self, data):
        if self._in_td:
            self.cells[-1] += data


def test_report_builds_valid_html_with_everything(tmp_path):
    rep = F.Report("Demo <report>", subtitle="digits, FedAvg")
    rep.section("Paths", "Loss along the path.\n\nSecond paragraph & more.")
    rep.add_image(F.path_figure(make_path()), caption="static")
    rep.add_plotly(F.path_plotly(make_path()), caption="interactive")
    rep.section("Planes").add_plotly(F.plane_plotly(make_plane()))
    rep.add_table([{"pair": "c0-c1", "barrier": 0.123456789, "ok": True}, {"pair": "c1-c2", "barrier": float("inf")}],
                  caption="barriers")
    path = rep.write(tmp_path / "out" / "index.html")
    html = path.read_text()
    checker = _TagChecker()
    checker.feed(html)
    checker.close()
    assert not checker.errors and checker.stack == []
    assert html.startswith("<!DOCTYPE html>")
    assert "<title>Demo &lt;report&gt;</title>" in html
    assert "<h2>Paths</h2>" in html and "<h2>Planes</h2>" in html
    assert "Second paragraph &amp; more." in html
    assert checker.cells == ["c0-c1", "0.1235", "True", "c1-c2", "inf", ""]
    assert html.count(BUNDLE_HEAD) == 1 and not CDN_SRC.search(html)
    assert html.count('class="plotly-graph-div"') == 2
    src = checker.imgs[0]["src"]
    assert src.startswith("data:image/png;base64,")
    assert base64.b64decode(src.split(",", 1)[1]).startswith(b"\x89PNG")
    no_plotly = F.Report("static only").add_table([{"a": 1}]).to_html()
    assert BUNDLE_HEAD not in no_plotly


def _track_table(shift: float, rounds: tuple[int, ...] = (0, 5, 10)) -> TrackTable:
    """A tracked run: no clients at round 0, one client missing at round 5, sharpness never measured."""
    n = len(rounds)
    clients = np.array([[np.nan] * 3, [0.1, 0.3, np.nan], [0.2, 0.2, 0.2]])[:n] + shift
    values = np.arange(1.0, n + 1) + shift
    return TrackTable(rounds=np.array(rounds), client_barrier=clients, client_accuracy_barrier=clients,
                      group_barrier=np.r_[np.nan, values[1:]], group_accuracy_barrier=values, top_eigenvalue=2 * values,
                      trace=10 * values, trace_stderr=values, sharpness=np.full(n, np.nan), update_distance=values,
                      update_cosine=values / 10, time=values, samples=np.arange(4), spec={"algorithm": "fedavg"})


def test_tracking_figure_draws_the_seed_mean_and_band():
    from figures.tracking import PANELS, seed_band

    seeds = [_track_table(0.0), _track_table(1.0)]
    rounds, mean, low, high = seed_band(seeds, "mean_client_barrier")
    assert rounds.tolist() == [0, 5, 10] and np.isnan(mean[0])  # no client at round 0 in any seed
    np.testing.assert_allclose(mean[1:], [0.7, 0.7])  # seeds 0.2 and 1.2 at round 5, 0.2 and 1.2 at round 10
    np.testing.assert_allclose(low[1:], [0.2, 0.2]) and np.testing.assert_allclose(high[1:], [1.2, 1.2])
    fig = F.tracking_figure({"fedavg": seeds, "fedgucci": _track_table(0.5)})
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert titles == [t for c, t in PANELS.items() if c != "sharpness"]  # never measured: no panel
    eig = fig.axes[titles.index("top Hessian eigenvalue")]
    np.testing.assert_allclose(eig.lines[0].get_ydata(), [3.0, 5.0, 7.0])  # 2 x mean of (1, 2, 3) and (2, 3, 4)
    assert len(eig.collections) == 1  # one band: the single-seed label has none
    pf = F.tracking_plotly({"fedavg": seeds})
    band = [t for t in pf.data if t.fill == "toself"][list(PANELS).index("top_eigenvalue")]  # one per panel
    np.testing.assert_allclose(band.y, [4.0, 6.0, 8.0, 6.0, 4.0, 2.0])  # high, then low reversed
    assert F.kind_of(seeds[0]) == "track" and F.draw(seeds, backend="plotly").data
    with pytest.raises(ConfigError, match="TrackTable"):
        F.tracking_figure({"x": [RUNS["fedavg"]]})
