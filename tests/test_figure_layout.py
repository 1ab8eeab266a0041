"""Figure layout, checked on figures drawn from real results (trained models on the digits data).

Every result here is computed the way a user computes it (``landscape.interpolate``, ``plane``,
``barrier_matrix``, ``group_barrier_by_size``, the claims, ``fl.run``). The checks read the drawn
figure back: every text inside the figure, no two labels overlapping, legends off the curves
and off the model markers, zero barriers not annotated, endpoint names drawn once, coincident
models sharing one label, plotly planes sized to their aspect, one legend entry per curve, a
barrier heatmap whose colour scale starts at 0 and whose plotly figure is sized to the matrix,
plotly barrier labels in rows of their own, and a log density axis spanning the density's values.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.collections import PathCollection
from matplotlib.legend import Legend
from matplotlib.text import Text

import figures as F
import fl
import landscape
from figures.paths import LABEL_ROW
from figures.plane_models import MARKER_PX
from figures.verdicts import verdict_figure

from conftest import make_bn_cnn, make_mlp, train

# ---------------------------------------------------------------- real results

@pytest.fixture(scope="module")
def models(digits) -> list[torch.nn.Module]:
    x, y = digits
    return [train(make_mlp(seed), x, y, steps=30) for seed in (1, 2, 3)]


@pytest.fixture(scope="module")
def evaluator(models, digits) -> landscape.Evaluator:
    return landscape.Evaluator(models[0], digits)


@pytest.fixture(scope="module")
def fl_run(tmp_path_factory) -> fl.Run:
    torch.set_num_threads(1)
    return fl.run("fedavg", dataset="digits", clients=3, rounds=2, local_epochs=1, save_clients="all",
                  seed=0, out=tmp_path_factory.mktemp("run") / "fedavg", progress=False)


# ---------------------------------------------------------------- layout checks

def drawn(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def visible_texts(fig) -> list[Text]:
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and t.figure is fig]


def assert_texts_inside(fig) -> None:
    """Everything drawn (tick labels, titles, legends, annotations) lies inside the figure."""
    renderer = drawn(fig)
    tight = fig.get_tightbbox(renderer)  # inches, over the artists actually drawn
    width, height = fig.get_size_inches()
    tol = 0.02
    assert tight.x0 >= -tol and tight.y0 >= -tol and tight.x1 <= width + tol and tight.y1 <= height + tol, \
        f"drawn content {tight} exceeds the {width} x {height} in figure"
    box = fig.bbox
    for ax in fig.axes:
        for t in ax.texts:
            b = t.get_window_extent(renderer)
            assert b.x0 >= box.x0 - 1 and b.y0 >= box.y0 - 1 and b.x1 <= box.x1 + 1 and b.y1 <= box.y1 + 1, \
                f"text {t.get_text()!r} at {b} is clipped by the figure {box}"


def label_boxes(fig, ax) -> list[tuple[str, object]]:
    renderer = drawn(fig)
    out = [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts if t.get_text().strip()]
    legend = ax.get_legend()
    if legend is not None:
        out.append(("<legend>", legend.get_window_extent(renderer)))
    return out


def assert_no_overlap(fig, ax) -> None:
    boxes = label_boxes(fig, ax)
    for i, (name_a, a) in enumerate(boxes):
        for name_b, b in boxes[i + 1:]:
            assert not a.overlaps(b), f"{name_a!r} overlaps {name_b!r}"


def data_points(ax) -> np.ndarray:
    pts = [ax.transData.transform(np.column_stack([line.get_xdata(), line.get_ydata()])) for line in ax.lines]
    pts += [ax.transData.transform(np.asarray(c.get_offsets())) for c in ax.collections
            if isinstance(c, PathCollection)]
    pts = np.concatenate(pts) if pts else np.empty((0, 2))
    return pts[np.isfinite(pts).all(axis=1)]


def assert_legend_off_data(fig, ax) -> None:
    renderer = drawn(fig)
    legend: Legend = ax.get_legend()
    b = legend.get_window_extent(renderer)
    pts = data_points(ax)
    inside = (pts[:, 0] > b.x0) & (pts[:, 0] < b.x1) & (pts[:, 1] > b.y0) & (pts[:, 1] < b.y1)
    assert not inside.any(), f"legend covers {int(inside.sum())} drawn points"


def check_layout(fig) -> None:
    assert_texts_inside(fig)
    for ax in fig.axes:
        if ax.get_legend() is not None:
            assert_no_overlap(fig, ax)
            assert_legend_off_data(fig, ax)


# ---------------------------------------------------------------- paths

def test_path_figure_layout_and_barrier_annotation(models, evaluator):
    path = landscape.interpolate(models[0], models[1], evaluator, alphas=11)
    assert path.loss_barrier > 0
    fig = F.path_figure(path)
    check_layout(fig)
    ax_loss = fig.axes[0]
    assert any(t.get_text().startswith(f"{path.loss_barrier:.3g} at α=") for t in ax_loss.texts)
    # the endpoint names label alpha = 0 and 1 once, on the top axis
    top = ax_loss.child_axes[0]
    assert [t.get_text() for t in top.get_xticklabels()] == ["A", "B"]
    assert [t.get_position()[0] for t in top.get_xticklabels()] == [0.0, 1.0]


def test_zero_barrier_not_annotated(models, evaluator):
    same = landscape.interpolate(models[0], models[0], evaluator, alphas=5)
    assert same.loss_barrier == pytest.approx(0.0, abs=1e-6) and same.accuracy_barrier == pytest.approx(0.0, abs=1e-9)
    fig = F.path_figure(same)
    check_layout(fig)
    for ax in fig.axes[:2]:
        assert not [t for t in ax.texts if "α=" in t.get_text()]
        assert not [c for c in ax.texts if getattr(c, "arrow_patch", None) is not None]
    assert not [a for a in F.path_plotly(same).layout.annotations if "barrier" in a.text]


def test_transitivity_endpoint_names_once(models, evaluator):
    verdict = landscape.claims.transitivity(models[0], models[1], models[2], evaluator, alphas=7)
    fig = verdict_figure(verdict)
    check_layout(fig)
    names = [t.get_text() for t in visible_texts(fig)]
    for label in ("A", "B"):
        assert names.count(label) == 2  # once per panel (loss, accuracy), however many paths
    pf = F.path_plotly(dict(verdict.results["paths"]))
    ends = [(a.text, a.x, a.yref) for a in pf.layout.annotations if a.text in ("<b>A</b>", "<b>B</b>")]
    assert sorted(ends) == [("<b>A</b>", 0.0, "y domain"), ("<b>A</b>", 0.0, "y2 domain"),
                            ("<b>B</b>", 1.0, "y domain"), ("<b>B</b>", 1.0, "y2 domain")]  # on each panel's top edge
    assert not [tr for tr in pf.data if tr.mode and "text" in tr.mode]  # never on the markers


def test_plotly_barrier_labels_in_rows_above_the_data(models, evaluator):
    # two paths with barriers near the same alpha: the labels used to be drawn on top of each other
    paths = {"a-b": landscape.interpolate(models[0], models[1], evaluator, alphas=11),
             "a-c": landscape.interpolate(models[0], models[2], evaluator, alphas=11)}
    assert all(p.loss_barrier > 0 for p in paths.values())
    fig = F.path_plotly(paths)
    for axis, metric in (("y", "loss"), ("y2", "accuracy")):
        labels = [a for a in fig.layout.annotations if a.text.startswith("barrier") and a.ayref == axis]
        values = np.concatenate([getattr(p, metric) for p in paths.values()])
        lo, hi = fig.layout["yaxis" if axis == "y" else "yaxis2"].range
        span = values.max() - values.min()
        barriers = [p.loss_barrier if metric == "loss" else p.accuracy_barrier for p in paths.values()]
        assert len(labels) == sum(b > 0 for b in barriers)
        heights = sorted(a.ay for a in labels)
        assert all(values.max() < h < hi for h in heights) and lo < values.min()  # above the data, inside the axis
        assert np.all(np.diff(heights) >= 0.99 * LABEL_ROW * span)  # one row each: never overlapping
        for a in labels:  # each arrow ends where its barrier's gap begins: on the curve or the endpoint line
            assert a.x == a.ax and values.min() <= a.y <= values.max()


def test_bn_note_only_for_batchnorm_models(models, evaluator, digits_images):
    plain = landscape.interpolate(models[0], models[1], evaluator, alphas=3)
    assert "BN" not in F.path_figure(plain)._suptitle.get_text()
    cnns = [make_bn_cnn(seed) for seed in (4, 5)]
    bn_eval = landscape.Evaluator(cnns[0], digits_images, bn="recompute", bn_data=digits_images)
    with_bn = landscape.interpolate(cnns[0], cnns[1], bn_eval, alphas=3)
    assert with_bn.spec["evaluator"]["bn"] == "recompute"
    assert "(BN: recompute)" in F.path_figure(with_bn)._suptitle.get_text()


# ---------------------------------------------------------------- planes

def test_fl_plane_global_visible_and_legend_off_models(fl_run):
    states = fl_run.client_states()
    module = fl_run.module()
    ev = landscape.Evaluator(module, fl_run.test_dataset())
    members = [states[k] for k in sorted(states)]
    sizes = fl_run.client_datasets()
    share = [len(sizes[k]) / sum(len(d) for d in sizes.values()) for k in sorted(states)]
    average = {k: sum(w * s[k] for w, s in zip(share, members)) for k in members[0]}  # FedAvg's weights
    grid = landscape.plane(*members, ev, resolution=5, labels=("client 0", "client 1", "client 2"),
                           extra={"average": average, "global r2": fl_run.global_state()})
    fig = F.plane_figure(grid)
    check_layout(fig)
    ax = fig.axes[0]
    # FedAvg's global model is the average of its clients: one spot, one joined label
    assert np.allclose(grid.models["average"], grid.models["global r2"], atol=1e-4)
    labels = [t.get_text() for t in ax.texts]
    assert sum("global r2" in t for t in labels) == 1 and any("average" in t and "global" in t for t in labels)
    # markers above their labels; the smaller "average" X drawn after (over) the big star
    scatters = {c.get_label(): c for c in ax.collections if isinstance(c, PathCollection)}
    assert min(c.get_zorder() for c in scatters.values()) > max(t.get_zorder() for t in ax.texts)
    order = [c.get_label() for c in ax.collections if isinstance(c, PathCollection)]
    assert order.index("global") < order.index("average")
    traces = [tr.name for tr in F.plane_plotly(grid).data]
    assert traces.index("global") < traces.index("average")
    # no label box covers another spot's marker
    renderer = drawn(fig)
    for t in ax.texts:
        box = t.get_window_extent(renderer)
        for label, xy in grid.models.items():
            if label in t.get_text():
                continue
            px, py = ax.transData.transform(np.asarray(xy, float)[:2])
            assert not (box.x0 < px < box.x1 and box.y0 < py < box.y1), f"{t.get_text()!r} covers {label}"


def test_shared_basin_figure_layout(fl_run):
    ev = landscape.Evaluator(fl_run.module(), fl_run.test_dataset())
    verdict = landscape.claims.shared_basin(fl_run.client_states(), fl_run.global_state(), ev, resolution=5,
                                            alphas=3)
    check_layout(verdict_figure(verdict))


def test_plotly_plane_has_no_empty_bands(models, evaluator):
    grid = landscape.plane(*models, evaluator, resolution=5)
    fig = F.plane_plotly(grid)
    m = fig.layout.margin
    plot_w, plot_h = fig.layout.width - m.l - m.r - 110, fig.layout.height - m.t - m.b
    aspect = (grid.y[-1] - grid.y[0]) / (grid.x[-1] - grid.x[0])
    assert plot_h / plot_w == pytest.approx(aspect, rel=0.03) or plot_h in (200, 720)
    assert fig.layout.xaxis.constrain == "domain" and fig.layout.yaxis.scaleanchor == "x"
    labels = fig.layout.annotations
    assert sorted(a.text for a in labels) == ["a", "b", "c"]
    for a in labels:  # beside its own marker, never on it
        assert (a.x, a.y) == pytest.approx(tuple(grid.models[a.text][:2])) and abs(a.xshift) > MARKER_PX


# ---------------------------------------------------------------- groups, matrices, training

def test_barrier_matrix_scale_starts_at_zero(models, evaluator):
    matrix = landscape.barrier_matrix([models[0], models[0], models[1]], evaluator, alphas=5)
    loss = np.asarray(matrix.loss_barrier)
    assert abs(loss[0, 1]) < 1e-5 and loss[0, 2] > 0.05
    fig = F.barrier_matrix_figure(matrix)
    check_layout(fig)
    im = fig.axes[0].images[0]
    assert im.norm.vmin == 0.0 and im.norm.vmax == pytest.approx(np.nanmax(loss))
    assert im.norm(loss[0, 1]) < 0.01  # the near-zero barrier sits at the dark end of the scale
    tiny = landscape.barrier_matrix([models[0], models[0]], evaluator, alphas=3)
    im = F.barrier_matrix_figure(tiny).axes[0].images[0]
    assert (im.norm.vmin, im.norm.vmax) == (0.0, landscape.claims.DEFAULT_THRESHOLD)
    heat = F.barrier_matrix_plotly(tiny).data[0]
    assert (heat.zmin, heat.zmax) == (0.0, landscape.claims.DEFAULT_THRESHOLD)


def test_plotly_barrier_matrix_sized_to_the_matrix(models, evaluator):
    matrix = landscape.barrier_matrix(models, evaluator, alphas=5)
    fig = F.barrier_matrix_plotly(matrix, metric="accuracy")
    m = fig.layout.margin
    side = fig.layout.height - m.t - m.b
    assert side == fig.layout.width - m.l - m.r == max(3 * 56, 200)  # square cells, the matrix and its labels only
    assert fig.layout.xaxis.constrain == fig.layout.yaxis.constrain == "domain" and fig.layout.autosize is False
    assert fig.data[0].texttemplate == "%{z:.2%}"  # the values in the cells, in percent as Eq. 4 reads


def test_group_size_figure_layout(models, evaluator):
    sizes = landscape.group_barrier_by_size(models, evaluator, sizes=[2, 3], draws=2, seed=0)
    series = {"trained": {int(k): list(map(float, row)) for k, row in zip(sizes.sizes, sizes.accuracy_barrier)}}
    check_layout(F.group_size_figure(series))


def test_fl_curves_layout_and_single_legend(fl_run):
    fig = F.fl_curves_figure({"fedavg": fl_run})
    check_layout(fig)
    pf = F.fl_curves_plotly({"fedavg": fl_run, "again": fl_run})
    listed = [tr.name for tr in pf.data if tr.showlegend is not False]
    assert sorted(listed) == ["again", "fedavg"]
    assert len(pf.data) == 4  # each algorithm drawn in both panels


def test_tracking_figure_layout():
    from test_figures import _track_table

    check_layout(F.tracking_figure({"fedavg": [_track_table(0.0), _track_table(1.0)], "fedgucci": _track_table(0.5)}))


# ---------------------------------------------------------------- curvature and decomposition

def test_curvature_figures_layout(models, evaluator):
    density = landscape.hessian_density(models[0], evaluator, iterations=12, grid_size=201, seed=0)
    check_layout(F.spectral_density_figure({"model 1": density}))
    # the log axis spans the density: from its peak (within a factor 2 above) down to LOG_FLOOR of it
    bottom, top = F.spectral_density_plotly({"model 1": density}).layout.yaxis.range
    peak = float(np.max(density.density))
    assert top == pytest.approx(np.log10(2 * peak)) and bottom == pytest.approx(np.log10(peak * 1e-7))
    profile = landscape.curvature_along_path(models[0], models[1], evaluator, alphas=3, k=1, max_iter=15, seed=0)
    check_layout(F.curvature_path_figure({"model 1 - model 2": profile}))


def test_decomposition_figures_layout(fl_run):
    ev = landscape.Evaluator(fl_run.module(), fl_run.test_dataset())
    terms = [(r, landscape.decompose_run(fl_run, r, ev)) for r in (1, 2)]
    check_layout(F.decomposition_figure(terms))
    check_layout(F.decomposition_bars_figure(dict(terms)))
    states = fl_run.client_states()
    curve = landscape.averaging_curve([states[k] for k in sorted(states)], ev, subsets=2, seed=0)
    check_layout(F.averaging_figure({"fedavg": curve}))
